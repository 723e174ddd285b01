"""The sbatch script a SLURM cell gets, rendered by submitit's own generator (no cluster needed).

hydra-submitit-launcher hands the `hydra.launcher` keys to submitit, which renames the generic
ones (timeout_min -> time, mem_gb -> mem, tasks_per_node -> ntasks_per_node, ...) and writes the
script with `_make_sbatch_string`. `render_sbatch` follows the same path, so `hacrl sweep ...
launcher=slurm hydra.sweeper.dry_run=true` and the tests see the script a cluster would get.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# keys of the launcher config that are not sbatch parameters
NOT_SBATCH = {"_target_", "submitit_folder", "max_num_timeout"}


def sbatch_parameters(launcher: Mapping[str, Any]) -> dict[str, Any]:
    """submitit's SLURM parameters for a `hydra.launcher` node (as the launcher converts them)."""
    from submitit.slurm.slurm import SlurmExecutor, _convert_mem, _get_default_parameters

    renames: dict[str, str] = {str(k): str(v) for k, v in SlurmExecutor._equivalence_dict().items()}
    params: dict[str, Any] = {renames.get(str(k), str(k)): v for k, v in launcher.items()
                              if k not in NOT_SBATCH and v is not None}
    if "mem" in params:
        params["mem"] = _convert_mem(params["mem"])
    unknown = sorted(set(params) - set(_get_default_parameters()))
    if unknown:
        from hacrl.core.errors import ConfigError

        raise ConfigError(f"hydra.launcher.{unknown[0]}: not a SLURM parameter submitit knows")
    return params


def render_sbatch(launcher: Mapping[str, Any], folder: str | Path,
                  array_size: int | None = None) -> str:
    """The sbatch script for one job (or a job array of `array_size` cells)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return _make_sbatch_string(command=command, folder=folder, map_count=array_size,
                               **sbatch_parameters(launcher))


# the launcher's keys, the environment variable of each (hacrl/conf/launcher/slurm.yaml), and
# what a node must have for it
FIT_KEYS = (("cpus_per_task", "HACRL_SLURM_CPUS", "CPUs"), ("mem_gb", "HACRL_SLURM_MEM_GB", "GB"),
            ("gpus_per_node", "HACRL_SLURM_GPUS", "GPUs"), ("nodes", None, "nodes"))


def partition_nodes(partition: str | None) -> list[dict[str, float]] | None:
    """CPUs, memory (GB) and GPUs of each node of `partition` (the default one when None), from
    `sinfo`; None when sinfo cannot tell (not installed, no answer, no such partition)."""
    import subprocess

    try:
        answer = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%P|%c|%m|%G"],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if answer.returncode != 0:
        return None
    nodes: dict[str, dict[str, float]] = {}
    for line in answer.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 5:
            continue
        name, part, cpus, mem, gres = fields
        default = part.endswith("*")
        if (partition is None and not default) or (partition is not None
                                                    and part.rstrip("*") != partition):
            continue
        try:
            nodes[name] = {"cpus": float(cpus), "mem_gb": float(mem.rstrip("+")) / 1024,
                           "gpus": float(_gpus(gres))}
        except ValueError:
            continue
    return list(nodes.values()) or None


def _gpus(gres: str) -> int:
    """GPUs in a sinfo GRES field: `gpu:4`, `gpu:a100:8(S:0-1)`, `(null)`."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def misfit(launcher: Mapping[str, Any], nodes: list[dict[str, float]]) -> str | None:
    """Why no node set of the partition can run a job of `launcher` (one line naming the
    setting to change), or None when it fits."""
    tasks = int(launcher.get("tasks_per_node") or 1)
    asked = {"cpus_per_task": (float(launcher.get("cpus_per_task") or 1) * tasks,
                               max(n["cpus"] for n in nodes)),
             "mem_gb": (float(launcher.get("mem_gb") or 0), max(n["mem_gb"] for n in nodes)),
             "gpus_per_node": (float(launcher.get("gpus_per_node") or 0),
                               max(n["gpus"] for n in nodes)),
             "nodes": (float(launcher.get("nodes") or 1), float(len(nodes)))}
    for key, env, unit in FIT_KEYS:
        want, have = asked[key]
        if key == "mem_gb":
            have = int(have * 10) / 10  # GB to one decimal, rounded down
        if want > have:
            where = f" (or {env})" if env else ""
            value = launcher.get(key)
            largest = "the partition has" if key == "nodes" else "its largest node has"
            return (f"hydra.launcher.{key}={value}: more than SLURM can give (the job would "
                    f"pend forever): {largest} {have:g} {unit}; set hydra.launcher.{key}{where} "
                    f"to at most {have:g}")
    return None


def check_fits(launcher: Mapping[str, Any]) -> None:
    """Refuse, before anything is queued, a job no node set of its partition can hold."""
    nodes = partition_nodes(launcher.get("partition"))
    if nodes is None:
        return  # no sinfo here: sbatch itself refuses (EnforcePartLimits) or the job pends
    reason = misfit(launcher, nodes)
    if reason is not None:
        from hacrl.core.errors import ConfigError

        partition = launcher.get("partition")
        raise ConfigError(f"{reason} ({f'partition {partition}' if partition else 'the default partition'})")


def wait_for_jobs(folder: str, since: float, poll_s: float = 5.0) -> None:
    """Wait until every job submitted from `folder` (submitit's `.../%j` pattern) since `since`
    has left SLURM's queue. submitit's launcher returns at the first job that did not complete
    (cancelled, killed) while the array's other cells may still run: the sweep's table waits
    for them. squeue decides (submitit's own wait never ends for a job sacct does not know)."""
    import re
    import threading

    from hacrl.sweep.state import slurm_queued

    root = Path(folder.split("%j")[0])
    if "%j" not in folder or not root.is_dir():
        return
    jobs = {entry.name for entry in root.iterdir()
            if entry.is_dir() and re.fullmatch(r"\d+(_\d+)?", entry.name)
            and entry.stat().st_mtime >= since}
    while jobs:
        answers = {job: slurm_queued(job) for job in jobs}
        if any(a is None for a in answers.values()):
            return  # squeue cannot tell: the table shows what the state files say
        jobs = {job for job, queued in answers.items() if queued}
        if jobs:
            threading.Event().wait(poll_s)

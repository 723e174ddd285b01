"""What a job cost, measured, as `cost/` metrics (`hacrl.schema.metric_names`): CPU seconds, the
GPUs it held and GPU seconds, the money where `cost.gpu_hour_usd` prices its GPU type, and the
tokens its agents sampled and trained on. Seconds and peak memory are the job's `time/` and
`memory/` metrics, logged beside these.

- CPU seconds (`cost/cpu_s`): user + system time of this process and of its children: those it
  waited for (`RUSAGE_CHILDREN`) and those still alive when measured (verifier workers, a local
  Ray's raylet and workers). Missed: processes that are not descendants (a Ray cluster joined or
  started elsewhere, the other nodes of a multi-node job) and descendants that exited without
  being waited for by their parent. Counted from this process's start, or from the end of the
  previous job in it (`hacrl train -m` runs jobs one after another in one process).
- GPUs (`cost/gpus`): SLURM's allocation (GPUs per node x nodes), else CUDA_VISIBLE_DEVICES,
  else the GPUs torch sees; 0 on a CPU. GPU seconds (`cost/gpu_s`): GPUs x the job's seconds
  over the same span as the CPU seconds. Several jobs sharing one GPU each count it whole.
- Tokens: per agent, the sum over its steps of `tokens/own` (`cost/tokens_sampled`: the response
  tokens it sampled) and of `tokens/own` + `tokens/borrowed` (`cost/tokens_trained`); the job's
  are the sums over its agents. Read back from the agent runs' curves, so the steps of a resumed
  job's earlier process count too. Evaluation's and validation's tokens are not counted.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

# CUDA_VISIBLE_DEVICES: an index, or a GPU or MIG UUID; CUDA stops at the first other entry
_DEVICE = re.compile(r"[0-9]+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+")


def cpu_seconds() -> float:
    """User + system seconds of this process, its waited-for children and its live descendants."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    try:
        import psutil

        live = psutil.Process().children(recursive=True)
    except Exception:  # psutil absent or /proc unreadable: the waited-for ones only
        return total
    for child in live:
        try:
            t = child.cpu_times()
        except Exception:  # gone meanwhile (then waited for by someone: counted or lost)
            continue
        # its own time and that of the children it waited for (those are not in ours)
        total += t.user + t.system + t.children_user + t.children_system
    return total


def visible_devices(value: str) -> int:
    """GPUs a CUDA_VISIBLE_DEVICES value leaves visible: its entries up to the first one CUDA
    would not take (`-1`, `NoDevFiles`, a typo); "" hides every GPU."""
    count = 0
    for entry in value.split(","):
        if not _DEVICE.fullmatch(entry.strip()):
            break
        count += 1
    return count


def gpu_count(env: Mapping[str, str], device_count: Callable[[], int]) -> int:
    """GPUs the job holds: SLURM's allocation (per node x nodes) when it names GPUs, else
    CUDA_VISIBLE_DEVICES when set, else `device_count()` (torch's; 0 without CUDA)."""
    from hacrl.engines.verl.slurm_allocation import SlurmAllocation

    try:
        slurm = SlurmAllocation.from_env(env)
    except ValueError:  # a variable SLURM would not write: the other sources decide
        slurm = None
    if slurm is not None:
        per_node = slurm.gpus_per_node
        if per_node is None and env.get("SLURM_JOB_GPUS"):
            per_node = visible_devices(env["SLURM_JOB_GPUS"])
        if per_node is not None:
            return per_node * slurm.nnodes
    if "CUDA_VISIBLE_DEVICES" in env:
        return visible_devices(env["CUDA_VISIBLE_DEVICES"])
    return int(device_count())


def gpu_type(env: Mapping[str, str], device_name: Callable[[], str | None]) -> str | None:
    """The GPU's model: torch's name of device 0 (`NVIDIA H100 80GB HBM3`), else the type in
    SLURM's GPU request (`h100` of `h100:8`); None when neither names one."""
    name = device_name()
    if name:
        return name
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_TRES_PER_NODE"):
        parts = [p for p in re.sub(r"\(.*?\)", "", env.get(key, "")).split(":") if p]
        # gpu:h100:8, h100:8, gres/gpu:h100:8: the part before the count that is not "gpu"
        names = [p for p in parts[:-1] if p.rpartition("/")[2] not in ("gpu", "gres")]
        if names:
            return names[-1]
    return None


def price(gpu: str | None, table: Mapping[str, Any] | None) -> float | None:
    """USD per GPU-hour of GPU type `gpu` in `table` (`cost.gpu_hour_usd`): the key equal to it,
    else the longest key contained in it, case aside; None when none matches."""
    if not gpu or not table:
        return None
    name = gpu.casefold()
    exact = [float(v) for k, v in table.items() if str(k).casefold() == name]
    if exact:
        return exact[0]
    inside = sorted((k for k in table if str(k).casefold() in name), key=lambda k: -len(str(k)))
    return float(table[inside[0]]) if inside else None


def prices(cfg: Any) -> dict[str, Any]:
    """The job's price table, `cost.gpu_hour_usd` (empty when its config has none)."""
    from omegaconf import OmegaConf

    table = OmegaConf.select(cfg, "cost.gpu_hour_usd", default=None)
    return dict(OmegaConf.to_container(table)) if table else {}  # type: ignore[arg-type]


def _torch_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_name() -> str | None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return str(torch.cuda.get_device_name(0))


@dataclass
class Usage:
    """What one job used between two readings: seconds, CPU seconds, GPUs and their type."""

    seconds: float
    cpu_s: float
    gpus: int
    gpu_type: str | None

    def metrics(self, prices: Mapping[str, Any] | None = None) -> dict[str, float]:
        """`cost/cpu_s`, `cost/gpus`, `cost/gpu_s`, and `cost/usd` when the GPU type is priced."""
        out = {M.CPU_S: self.cpu_s, M.GPUS: float(self.gpus),
               M.GPU_S: self.gpus * self.seconds}
        rate = price(self.gpu_type, prices) if self.gpus else None
        if rate is not None:
            out[M.USD] = out[M.GPU_S] / 3600 * rate
        return out

    def tags(self) -> dict[str, str]:
        return {T.GPU_TYPE: self.gpu_type} if self.gpus and self.gpu_type else {}


# (pid, process age, CPU seconds) at the end of the previous job of this process
_taken: tuple[int, float, float] | None = None


def take_usage(env: Mapping[str, str] | None = None) -> Usage:
    """This job's usage since the process started or its previous job ended (`take_usage`
    called last), and the start of the next one's."""
    from hacrl.job.lock import process_age_s

    global _taken
    age, cpu = process_age_s(), cpu_seconds()
    pid = os.getpid()
    # a forked process starts at zero: what its parent took is not its own
    since_age, since_cpu = (_taken[1], _taken[2]) if _taken and _taken[0] == pid else (0.0, 0.0)
    _taken = (pid, age, cpu)
    env = os.environ if env is None else env
    gpus = gpu_count(env, _torch_gpus)
    return Usage(max(0.0, age - since_age), max(0.0, cpu - since_cpu), gpus,
                 gpu_type(env, _torch_name) if gpus else None)


def token_totals(client: Any, agent_runs: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Per agent run id: `cost/tokens_sampled` and `cost/tokens_trained`, summed over the steps
    its run holds (the last value logged at each step)."""
    out = {}
    for run_id in agent_runs.values():
        own, borrowed = (_per_step(client.get_metric_history(run_id, key))
                         for key in (M.TOKENS_OWN, M.TOKENS_BORROWED))
        out[run_id] = {M.TOKENS_SAMPLED: sum(own.values()),
                       M.TOKENS_TRAINED: sum(own.values()) + sum(borrowed.values())}
    return out


def _per_step(history: Iterable[Any]) -> dict[int, float]:
    """step -> value, the latest logged at each step (a requeued step logged twice counts once)."""
    ordered = sorted(history, key=lambda m: (m.step, m.timestamp))
    return {m.step: float(m.value) for m in ordered}


def job_totals(per_agent: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The job run's tokens: the sums over its agents."""
    return {key: sum(m[key] for m in per_agent.values())
            for key in (M.TOKENS_SAMPLED, M.TOKENS_TRAINED)}


def log_job_cost(tracker: Any, job_run: str, agent_runs: Mapping[str, str], usage: Usage,
                 prices: Mapping[str, Any] | None, step: int) -> dict[str, float]:
    """Every agent run's tokens, and the job run's usage and token totals; returns the job's."""
    tokens = token_totals(tracker.client, agent_runs)
    for run_id, metrics in tokens.items():
        tracker.log_metrics(run_id, metrics, step=step)
    job = {**usage.metrics(prices), **job_totals(tokens)}
    tracker.log_metrics(job_run, job, step=step)
    if tags := usage.tags():
        tracker.set_tags(job_run, tags)
    return job


__all__ = ["Usage", "cpu_seconds", "gpu_count", "gpu_type", "job_totals", "log_job_cost",
           "price", "prices", "take_usage", "token_totals", "visible_devices"]

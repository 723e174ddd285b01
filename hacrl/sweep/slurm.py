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
        from hacrl.errors import ConfigError

        raise ConfigError(f"hydra.launcher.{unknown[0]}: not a SLURM parameter submitit knows")
    return params


def render_sbatch(launcher: Mapping[str, Any], folder: str | Path,
                  array_size: int | None = None) -> str:
    """The sbatch script for one job (or a job array of `array_size` cells)."""
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{sys.executable} -u -m submitit.core._submit {folder}"
    return _make_sbatch_string(command=command, folder=folder, map_count=array_size,
                               **sbatch_parameters(launcher))

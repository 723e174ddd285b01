"""The `hacrl` Hydra sweeper: a thin plugin shell around `hacrl.sweep.run.SweepRun`.

Selected by a sweep config (`override /hydra/sweeper: hacrl`); Hydra requires sweeper classes
to live in the `hydra_plugins` package, the logic lives in hacrl/sweep/. The plugin is part of
the command line: it runs the sweep, then its report (`hacrl.cli.sweep_report.run_sweep`), so
`hacrl sweep <name>` and `python -m hacrl.train -m +sweep=<name>` both end with the report.
"""

# No `from __future__ import annotations`: Hydra loads plugin modules without registering them
# in sys.modules, and dataclasses then cannot resolve string annotations.
import sys
from dataclasses import dataclass, field
from typing import Any, List, Optional  # noqa: UP035 (OmegaConf schemas)

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class HacrlSweeperConf:
    _target_: str = "hydra_plugins.hacrl_sweeper.hacrl_sweeper.HacrlSweeper"
    name: str = "sweep"
    include: List[str] = field(default_factory=list)  # noqa: UP006 (OmegaConf schema)
    grids: List[Any] = field(default_factory=list)  # noqa: UP006
    # what the report of this sweep holds: {tables: [table1, ...], figures: [figure2, ...]}
    # (keys registered in analysis/table_registry.py; read from the sweep file, not from here)
    report: Any = field(default_factory=dict)
    # jobs at a time with a local launcher; "auto" sizes it to the cores and memory
    parallel: Any = "auto"
    mem_per_job_gb: float = 2.0
    # thread count of the timing (cost) cells, which run alone after all others ("auto": all
    # of this machine's cores; the count is recorded in each cell's config)
    cost_threads: Any = "auto"
    # list the cells and what is done, launch nothing
    dry_run: bool = False
    # with the submitit local launcher, fork cells (timing cells too) from one process that
    # imported torch, transformers, lm-eval and MLflow once (hacrl.sweep.warm); false: one
    # cold process each
    warm: bool = True


ConfigStore.instance().store(group="hydra/sweeper", name="hacrl", node=HacrlSweeperConf,
                             provider="hacrl")


class HacrlSweeper(Sweeper):
    def __init__(self, name: str, include: List[str], grids: List[Any],  # noqa: UP006
                 parallel: Any, mem_per_job_gb: float, cost_threads: Any,
                 dry_run: bool = False, report: Any = None, warm: bool = True) -> None:
        self.settings = {"name": name, "parallel": parallel, "mem_per_job_gb": mem_per_job_gb,
                         "cost_threads": cost_threads, "dry_run": dry_run, "warm": warm}
        self.config: Optional[DictConfig] = None  # noqa: UP045
        self.hydra_context: Optional[HydraContext] = None  # noqa: UP045
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:  # noqa: UP006
        from hacrl.cli.sweep_report import run_sweep
        from hacrl.core.errors import HacrlError, print_error
        from hacrl.sweep.run import SweepRun

        assert self.config is not None and self.hydra_context is not None
        run = SweepRun(self.config, self.hydra_context.config_loader, self.launcher,
                       arguments, **self.settings)
        try:
            return run_sweep(run)
        except HacrlError as err:  # a fault the user can act on: one line, no traceback
            print_error(err, "hacrl: sweep: ")
            sys.exit(err.exit_code)

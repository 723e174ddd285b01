"""`python -m hacrl.train [overrides]`: the Hydra app behind `hacrl train` (multirun-capable),
and `run_spec`, which runs one validated job: the app's jobs and `hacrl train`'s plain runs
(composed and validated once, in `hacrl.cli.train_command`, without the app) both end here."""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from hacrl.config import CONFIG_DIR, ConfigError, JobSpec, validate
from hacrl.core.errors import HacrlError, print_error


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> object:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if (cfg.get("cell") or {}).get("id"):  # a cell launched by a sweep (hacrl/sweep)
        from pathlib import Path

        from hacrl.sweep.cell_run import run_cell

        return run_cell(cfg, Path(str(HydraConfig.get().sweep.dir)))

    try:
        spec = validate(cfg)
    except ConfigError as err:
        print_error(err, "hacrl: config error: ")
        sys.exit(2)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    code, summary = run_spec(spec, multirun)
    if code:
        sys.exit(code)
    return summary


def run_spec(spec: JobSpec, multirun: bool = False) -> tuple[int, dict[str, Any] | None]:
    """Run the validated job `spec`: (exit status, its summary). A fault the user can act on is
    one line (status: its exit code), a stop (SIGTERM, Ctrl-C) one line (128 + the signal);
    `multirun` re-raises both after the line, so Hydra records the job as failed and runs the
    others."""
    from hacrl.job import run_job
    from hacrl.job.lock import Terminated

    try:
        from hacrl.core.errors import check_writable
        from hacrl.tracking.mlflow_store import check_store, resolve_uri

        # output root and store first, before the job's heavy imports (a fault: one quick line)
        check_store(resolve_uri(spec.cfg.tracking.uri, spec.output_root))
        check_writable(spec.output_root)
        summary = run_job(spec)
    except HacrlError as err:  # one line for a fault the user can act on
        print_error(err, "\rhacrl: ")  # \r: a line of its own after an open progress bar
        if multirun:
            raise
        return err.exit_code, None
    except (Terminated, KeyboardInterrupt) as err:  # stopped, at any phase: not a fault
        import signal

        how, code = ("SIGTERM", 128 + signal.SIGTERM) if isinstance(err, Terminated) else \
            ("Ctrl-C", 128 + signal.SIGINT)
        print(f"\rhacrl: job stopped ({how}); its MLflow runs are KILLED, and the same command "
              "resumes it from its last checkpoint", file=sys.stderr, flush=True)
        if multirun:
            raise
        return code, None
    _print_summary(summary)
    return 0, summary


def _print_summary(summary: dict) -> None:
    """Each agent's final AVG and where the runs are (nothing for a job skipped as done)."""
    if summary.get("skipped"):
        return
    for team in summary["teams"]:
        for agent, accs in team["final"].items():
            avg = {k: v for k, v in accs.items() if k.endswith("/avg/acc")}
            print(f"{agent}: " + ", ".join(f"{k} {v:.3f}" for k, v in avg.items()))
    print(f"MLflow run {summary['job_run_id']}; run dir {summary['run_dir']}", flush=True)


if __name__ == "__main__":
    main()

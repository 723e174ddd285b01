"""`hacrl train` and `hacrl sweep` are the Hydra app `hacrl.train`: every Hydra flag and the
whole override grammar work as under `python -m hacrl.train`, with Hydra's own messages.

`hacrl train ARGS` with a Hydra flag runs the app with ARGS: `--cfg job`, `--info`,
`-m seed=0,1`, `--config-dir ...`; each of the app's jobs is composed and validated once, by the
app. A plain run (overrides only: `+key=value`, `~key`, `range(...)` in a value) is composed and
validated once by `hacrl.cli.train_command` and runs without the app (`hacrl.train.run_spec`),
so a bad value is one line and exit 2 before anything is created.

Shell completion is Hydra's (`eval "$(hacrl train -sc install=bash)"`, registered for the
`hacrl` program): the shell then asks `hacrl -sc query=bash` with its command line, from which
the subcommand (`train`, or `sweep NAME`) is taken out before Hydra completes the overrides.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# flags of a Hydra app (`python -m hacrl.train --help` lists them)
FLAGS = {"--cfg", "-c", "--info", "-i", "--multirun", "-m", "--resolve", "--package", "-p",
         "--shell-completion", "-sc", "--config-path", "-cp", "--config-name", "-cn",
         "--config-dir", "-cd", "--experimental-rerun", "--run", "-r", "--hydra-help",
         "--version"}
# flags that only print (a config, the app's info, a completion script): no multirun with them
PRINT_ONLY = {"--cfg", "-c", "--info", "-i", "-sc", "--shell-completion"}
SUBCOMMANDS = ("train", "eval", "sweep", "status", "report", "plot", "data", "zoo", "ui", "bench")


def hydra_flags(args: Sequence[str]) -> list[str]:
    """The Hydra flags among `args` (`--cfg=job` counts as `--cfg`)."""
    return [a for a in args if a.split("=", 1)[0] in FLAGS]


def run_app(args: Sequence[str], program: str = "hacrl") -> int:
    """Run the Hydra app with `args` as its command line; its exit status."""
    from hacrl import train
    saved = sys.argv
    sys.argv = [program, *args]
    try:
        train.main()
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


def complete(args: Sequence[str]) -> int:
    """`hacrl -sc query=bash` as the shell's completion function calls it (COMP_LINE holds the
    command line): subcommand names after `hacrl`, Hydra's completion after `hacrl train` or
    `hacrl sweep NAME`; anything else (install, uninstall) is Hydra's as it is."""
    line = os.environ.get("COMP_LINE")
    if line is None or not any(a.startswith("query=") for a in args):
        return run_app(args)
    words = line.split(" ")
    if len(words) <= 2:  # completing the subcommand itself
        typed = words[1] if len(words) == 2 else ""
        print(" ".join(s for s in SUBCOMMANDS if s.startswith(typed)))
        return 0
    drop = {"train": 1, "sweep": 2}.get(words[1])
    if drop is None:
        print("")
        return 0
    prefix = " ".join(words[:1 + drop])
    if len(words) <= 1 + drop:  # `hacrl sweep <TAB>`: the sweep names
        from hacrl.sweep.grid import SWEEP_DIR

        print(" ".join(sorted(p.stem for p in SWEEP_DIR.glob("*.yaml"))))
        return 0
    rest = line[len(prefix):]
    os.environ["COMP_LINE"] = words[0] + rest
    point = int(os.environ.get("COMP_POINT", len(line)))
    os.environ["COMP_POINT"] = str(max(len(words[0]), point - (len(prefix) - len(words[0]))))
    return run_app(args)


__all__ = ["FLAGS", "PRINT_ONLY", "complete", "hydra_flags", "run_app"]

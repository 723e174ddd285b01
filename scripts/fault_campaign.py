"""The fault and bad-input campaign of issues 16 and 39, run for real, as a table.

Each case runs the `hacrl` command a user would, against a micro zoo built here, and prints:
the case, what should happen, the exit code, the seconds to the end, whether everything the
user had is still there, and what it observed (the user-facing line, or the counts it checked). Exit 1 if any case did not behave (or none ran),
the last line naming those cases; exit 0 when every case that ran behaved.

    python scripts/fault_campaign.py [--only SUBSTRING,...] [--keep DIR]

About 25 minutes on 2 cores (the finishing sequence is killed at each of its points inside a
real sweep, and each sweep is then run again; a new store is killed at six moments of its
creation). `--only issue39` runs the cases of issue 39 (~10 minutes). Cases that need root (a
small tmpfs for a full disk, a read-only mount) are left out elsewhere, and say so.
tests/test_faults.py, test_store_creation.py and test_config_ranges.py are the quick version.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXPERIMENT = "hacrl-tiny"  # tracking.experiment at scale=tiny: where the jobs' runs are
QUICK = ["train.steps=2", "train.save_every=1", "train.prompts_per_step=2",
         "train.minibatch_prompts=2", "train.rollouts_per_prompt=2", "rollout.max_new_tokens=8",
         "validation.every=0", "eval.at_end=true", "eval.benchmarks=[tiny_gsm8k]"]
MINI = """# @package _global_
defaults:
  - override /hydra/sweeper: hacrl
  - override /launcher: local
hydra:
  sweep:
    dir: ${output_root}/sweeps/mini
    subdir: .jobs/${hydra.job.num}
  sweeper:
    name: mini
    grids:
      - pair: size
        method: hacpo
"""


@dataclass
class Outcome:
    case: str
    ok: bool
    code: int | None
    seconds: float
    line: str
    intact: bool = True
    expected: str = ""


class Campaign:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.zoo = work / "zoo"
        self.data = work / "data"
        self.results: list[Outcome] = []
        self.hacrl = [str(Path(sys.executable).parent / "hacrl")]
        self.mounts: list[Path] = []  # tmpfs disks of the full-disk cases, unmounted at the end
        self.quick, self.mini = list(QUICK), MINI  # for the cases in fault_campaign_39

    def env(self, root: Path, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI",
                                                                 "HACRL_FAULT")}
        env.update({"HACRL_ZOO_DIR": str(self.zoo), "HACRL_DATA": str(self.data),
                    "HACRL_OUTPUTS": str(root), "MLFLOW_DISABLE_TELEMETRY": "true",
                    "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        env.update(extra)
        return env

    def run(self, args: list[str], root: Path, cwd: Path | None = None, timeout: float = 900,
            extra_env: Mapping[str, str] | None = None) -> tuple[int, float, str, str]:
        tic = time.perf_counter()
        out = subprocess.run(args, env=self.env(root, **(extra_env or {})), cwd=cwd or self.work,
                             capture_output=True, text=True, timeout=timeout)
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hacrl:")]
        first = lines[-1] if lines else (out.stderr.strip().splitlines() or [""])[-1]
        return out.returncode, time.perf_counter() - tic, first, out.stderr

    def record(self, case: str, ok: bool, code: int | None, seconds: float, line: str,
               intact: bool = True, expected: str = "") -> None:
        outcome = Outcome(case, ok and intact, code, seconds, line, intact, expected)
        self.results.append(outcome)
        mark = "ok  " if outcome.ok else "FAIL"
        print(f"{mark} {case:<46} expect: {expected:<34} exit={code!s:<4} {seconds:6.1f} s  "
              f"intact={intact}  {line[:150]}", flush=True)

    def root(self, name: str) -> Path:
        path = self.work / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    def train(self, root: Path, *extra: str, **env: str) -> tuple[int, float, str, str]:
        return self.run([*self.hacrl, "train", *QUICK, f"output_root={root}", *extra], root,
                        extra_env=env)


def one_line(stderr: str) -> bool:
    return "Traceback" not in stderr


# -- cases ---------------------------------------------------------------------------------------


def report_out_dot(c: Campaign) -> None:
    cwd = c.root("user-cwd")
    cwd.mkdir()
    (cwd / "notes.txt").write_text("mine")
    code, secs, line, err = c.run([*c.hacrl, "report", "table1", "--out", ".",
                                   f"output_root={c.work / 'empty-store'}"], c.work, cwd=cwd)
    intact = (cwd / "notes.txt").read_text() == "mine"
    c.record("report --out . (cwd with files)", code == 1 and one_line(err), code, secs, line,
             intact)


def report_name_escape(c: Campaign) -> None:
    root = c.root("escape")
    code, secs, line, err = c.run([*c.hacrl, "report", "../../x", f"output_root={root}"], root)
    c.record("report ../../x", code == 2 and one_line(err), code, secs, line,
             not (c.work.parent / "x").exists())


def report_empty_store(c: Campaign) -> None:
    root = c.root("empty-store")
    code, secs, line, err = c.run([*c.hacrl, "report", "table1", f"output_root={root}"], root)
    c.record("report on an empty store", code == 1 and one_line(err), code, secs, line,
             not (root / "mlflow.db").exists())


def planted_pickle(c: Campaign) -> None:
    root = c.root("planted")
    c.train(root)
    marker = c.work / "PWNED"

    class Planted:
        def __reduce__(self) -> tuple[Callable[..., int], tuple[str]]:
            return os.system, (f"touch {marker}",)

    import torch

    from hacrl.core.fileio import sha256_file

    for folder in root.glob("runs/*/team-0/ckpt/step_*"):
        for agent in folder.iterdir():
            if (agent / "optimizer.pt").is_file():
                torch.save({"state": Planted()}, agent / "optimizer.pt")
        record = json.loads((folder / "COMPLETE").read_text())
        record["files"] = {str(p.relative_to(folder)): [p.stat().st_size, sha256_file(p)]
                           for p in folder.rglob("*") if p.is_file() and p.name != "COMPLETE"}
        (folder / "COMPLETE").write_text(json.dumps(record))
    for done in root.glob("runs/*/team-*/DONE.json"):
        done.unlink()
    code, secs, line, err = c.train(root)
    c.record("planted pickle in every checkpoint", code == 1 and one_line(err)
             and not marker.exists(), code, secs, line, len(list(root.glob("runs/*/team-0/ckpt/"
                                                                            "step_*"))) == 2)


def damaged_checkpoint(c: Campaign) -> None:
    root = c.root("damaged")
    c.train(root)
    newest = sorted(root.glob("runs/*/team-0/ckpt/step_*"))[-1]
    for weights in newest.glob("*/model/model.safetensors"):
        weights.write_bytes(weights.read_bytes()[:-50])
    for done in root.glob("runs/*/team-*/DONE.json"):
        done.unlink()
    code, secs, _, err = c.train(root)
    warned = [ln for ln in err.splitlines() if "checkpoint skipped" in ln]
    c.record("truncated latest checkpoint -> previous", code == 0 and bool(warned), code, secs,
             warned[0] if warned else "")
    for weights in root.glob("runs/*/team-0/ckpt/step_*/*/model/model.safetensors"):
        weights.write_bytes(weights.read_bytes()[:-50])
    for done in root.glob("runs/*/team-*/DONE.json"):
        done.unlink()
    code, secs, line, err = c.train(root)
    c.record("every checkpoint truncated", code == 1 and one_line(err), code, secs, line,
             len(list(root.glob("runs/*/team-0/ckpt/step_*"))) == 2)


def garbage_done(c: Campaign) -> None:
    root = c.root("garbage-done")
    c.train(root)
    for done in root.glob("runs/*/team-*/DONE.json"):
        done.write_text("")
    code, secs, _, err = c.train(root)
    warned = [ln for ln in err.splitlines() if "DONE.json" in ln]
    c.record("empty DONE.json", code == 0 and bool(warned) and "already finished" not in err,
             code, secs, warned[0] if warned else "")


def multirun_new_store(c: Campaign) -> None:
    root = c.root("multirun")
    code, secs, line, err = c.run([sys.executable, "-m", "hacrl.train", "-m", "seed=0,1,2",
                                   "launcher=local", f"output_root={root}", *QUICK,
                                   "eval.at_end=false"], root)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXPERIMENT)
    jobs = client.search_runs([exp.experiment_id], "tags.`hacrl.kind` = 'job'") if exp else []
    finished = sum(r.info.status == "FINISHED" for r in jobs)
    c.record("hydra -m seed=0,1,2 on a brand-new store", code == 0 and finished == 3, code, secs,
             f"{finished} of 3 jobs FINISHED")


def sweep(c: Campaign, root: Path, configs: Path, **env: str) -> tuple[int, float, str, str]:
    return c.run([*c.hacrl, "sweep", "mini", f"hydra.searchpath=[file://{configs}]",
                  f"output_root={root}", *QUICK], root, extra_env=env)


def sweep_rows(root: Path) -> dict[str, int]:
    rows = json.loads((root / "sweeps" / "mini" / "status.json").read_text())["rows"]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def running_runs(root: Path) -> int:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:  # no run was ever logged
        return 0
    return len(client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"))


def finishing_kills(c: Campaign) -> None:
    from hacrl.core.faults import FINISHING

    configs = c.work / "configs"
    (configs / "sweep").mkdir(parents=True, exist_ok=True)
    (configs / "sweep" / "mini.yaml").write_text(MINI)
    for point in FINISHING:
        root = c.root(f"finish-{point}")
        first = sweep(c, root, configs, HACRL_FAULT=point)
        again = sweep(c, root, configs)
        rows = sweep_rows(root)
        # killed before its runs were FINISHED the cell fails the first sweep; killed after,
        # the first sweep already finds it done (from the store), and the rerun skips it
        c.record(f"sweep job killed at {point}, rerun", again[0] == 0
                 and set(rows) <= {"done", "skipped"} and running_runs(root) == 0, again[0],
                 first[1] + again[1], f"first exit {first[0]}; rerun: {rows}, "
                 f"{running_runs(root)} RUNNING")


def dead_node(c: Campaign) -> None:
    """A cell whose state says running on a node that died (no heartbeat for an hour)."""
    configs = c.work / "configs"
    (configs / "sweep").mkdir(parents=True, exist_ok=True)
    (configs / "sweep" / "mini.yaml").write_text(MINI)
    root = c.root("dead-node")
    sweep(c, root, configs, HACRL_FAULT="final_checkpoint")  # a cell with a RUNNING-then-dead job
    from hacrl.core.fileio import write_json
    from hacrl.tracking import Tracker

    (state,) = (root / "sweeps" / "mini" / "cells").glob("*.json")
    data = json.loads(state.read_text())
    tracker = Tracker(f"sqlite:///{root / 'mlflow.db'}", EXPERIMENT)
    run = tracker.start_run("ghost", {"config_hash": data["cell"], "hacrl.kind": "job",
                                      "hacrl.host": "node-17"})
    write_json(state, {**data, "status": "running", "host": "node-17",
                       "heartbeat": time.time() - 3600})
    code, secs, _, err = sweep(c, root, configs)
    said = [ln for ln in err.splitlines() if "job is gone" in ln]
    status = tracker.client.get_run(run).info.status
    c.record("cell 'running' on a dead node", code == 0 and status == "KILLED"
             and sweep_rows(root) == {"done": 1}, code, secs,
             (said[0] if said else "") + f" [ghost run {status}]")


def infra(c: Campaign) -> None:
    root = c.root("infra")
    blocker = c.work / "a-file"
    blocker.write_text("")
    cases: list[tuple[str, list[str], int]] = [
        ("output_root under a file", [f"output_root={blocker / 'out'}"], 1),
        ("unreachable tracking server", [f"output_root={root}",
                                         "tracking.uri=http://127.0.0.1:9"], 1),
        ("bogus tracking URI scheme", [f"output_root={root}", "tracking.uri=bogus://x"], 1),
        ("sqlite folder under a file", [f"output_root={root}",
                                        f"tracking.uri=sqlite:///{blocker}/sub/mlflow.db"], 1),
    ]
    ro = readonly_mount(c)
    if ro is not None:
        cases.append(("read-only output root (ro mount)", [f"output_root={ro}"], 1))
    for name, args, expected in cases:
        code, secs, line, err = c.run([*c.hacrl, "train", *QUICK, *args], root)
        c.record(name, code == expected and one_line(err) and secs < 30, code, secs, line)
    odd = c.work / "odd?name#x"  # Hydra's grammar wants such a value quoted
    code, secs, line, err = c.run([*c.hacrl, "train", *QUICK, "eval.at_end=false",
                                   f"output_root='{odd}'"], odd)
    c.record("output_root with ? and #", code == 0 and (odd / "mlflow.db").is_file(), code, secs,
             f"mlflow.db in place: {(odd / 'mlflow.db').is_file()}")
    # state files and manifests of the wrong shape
    sweep_dir = root / "sweeps" / "table1"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "manifest.json").write_text(json.dumps(
        {"sweep": "table1", "tracking_uri": "sqlite:///x", "cells": [{"id": "a", "bogus": 1}]}))
    code, secs, line, err = c.run([*c.hacrl, "status", "table1", f"output_root={root}"], root)
    c.record("manifest with an unknown key", code == 1 and one_line(err), code, secs, line)
    zoo = c.work / "bad-zoo"
    shutil.rmtree(zoo, ignore_errors=True)
    shutil.copytree(c.zoo, zoo)
    weights = zoo / "qwen3-4b-base" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    code, secs, line, err = c.run([*c.hacrl, "train", "--dry-run", f"output_root={root}"], root,
                                  extra_env={"HACRL_ZOO_DIR": str(zoo)})
    c.record("truncated zoo model", code == 2 and one_line(err), code, secs, line)


def readonly_mount(c: Campaign) -> Path | None:
    """A read-only bind mount (root only); None where the machine does not allow it."""
    src, mnt = c.work / "ro-src", c.work / "ro"
    src.mkdir(exist_ok=True)
    mnt.mkdir(exist_ok=True)
    ok = subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)],
                             capture_output=True).returncode == 0:
        return mnt
    return None


def _issue39() -> list[Callable[[Campaign], None]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import fault_campaign_39

    for case in fault_campaign_39.CASES:  # selected with --only issue39 (or a case's name)
        if not case.__name__.startswith("issue39_"):
            case.__name__ = f"issue39_{case.__name__}"
    return list(fault_campaign_39.CASES)


CASES = [report_out_dot, report_name_escape, report_empty_store, planted_pickle,
         damaged_checkpoint, garbage_done, multirun_new_store, infra, dead_node, finishing_kills,
         *_issue39()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated: run the cases whose name "
                        "contains one of these")
    parser.add_argument("--keep", default=None, help="work folder to keep (default: temporary)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="hacrl-faults-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(work)
    from hacrl.zoo import build_micro_model

    for name, family, seed in (("qwen3-1.7b-base", "qwen", 1), ("qwen3-4b-base", "qwen", 0),
                               ("llama3.2-1b-instruct", "llama", 0)):
        if not (campaign.zoo / name / "config.json").is_file():
            build_micro_model(family, campaign.zoo / name, seed=seed)
    print(f"fault campaign in {work} on {socket.gethostname()}", flush=True)
    try:
        for case in CASES:
            if any(part in case.__name__ for part in args.only.split(",")):
                case(campaign)
    finally:
        subprocess.run(["umount", str(work / "ro")], capture_output=True)
        for disk in campaign.mounts:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return verdict(campaign.results, args.only)


def verdict(results: list[Outcome], only: str = "") -> int:
    """The exit code of a campaign with these outcomes, after its last line: 1 when a case did
    not behave or no case ran (`--only` matched none), 0 when every case that ran behaved."""
    bad = [r for r in results if not r.ok]
    if not results:
        print(f"fault campaign: FAIL: no case ran (--only {only!r} matches none of "
              f"{', '.join(case.__name__ for case in CASES)})")
        return 1
    if bad:
        print(f"fault campaign: FAIL: {len(bad)} of {len(results)} cases did not behave: "
              + "; ".join(r.case for r in bad))
        return 1
    print(f"fault campaign: ok: all {len(results)} cases behaved")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Faults and bad input: each ends in one line, a stated exit code, before any work it would
waste (no training step, no store or model opened), and removes nothing the user had. Checkpoints (planted pickles, damage, fallback), DONE.json, the finishing
sequence killed at every point, sweep state that expires, report destinations, zoo models.
`scripts/fault_campaign.py` runs the longer version and prints a table."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hacrl.checkpoint import pickle_audit
from hacrl.checkpoint import team as checkpoint
from hacrl.core.errors import CheckpointError
from hacrl.core.faults import FINISHING
from hacrl.core.fileio import sha256_file

# a job with no evaluation and no validation: seconds, and the checkpoint logic is all there
QUICK = ("train.steps=2", "train.save_every=1", "train.prompts_per_step=2",
         "train.minibatch_prompts=2", "train.rollouts_per_prompt=2", "rollout.max_new_tokens=8",
         "validation.every=0", "eval.at_end=false")
AGENTS = ["qwen3-1.7b-base", "qwen3-4b-base"]


def _client(root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")


def _runs(root: Path, query: str = "") -> list:
    client = _client(root)
    exp = client.get_experiment_by_name("hacrl-tiny")
    return list(client.search_runs([exp.experiment_id], query)) if exp else []


Hacrl = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def hacrl(hacrl_cmd, cli_env, tmp_path) -> Hacrl:
    """`hacrl <args>` in a subprocess (its own cwd)."""

    def run(*args: str, root: Path, env: dict[str, str] | None = None, zoo: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([*hacrl_cmd, *args], env={**cli_env(root, zoo), **(env or {})},
                              capture_output=True, text=True, timeout=timeout, cwd=tmp_path)

    return run


@pytest.fixture
def steps_run(monkeypatch) -> list[int]:
    """The training steps `TeamLoop` starts in this process, in order."""
    from hacrl.training.loop import TeamLoop

    started: list[int] = []
    step = TeamLoop.step

    def recording(self, n: int):
        started.append(n)
        return step(self, n)

    monkeypatch.setattr(TeamLoop, "step", recording)
    return started


def _one_line(out: subprocess.CompletedProcess) -> str:
    """The user-facing error line; fails if stderr holds a traceback."""
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("hacrl:")
             and "warning" not in ln]
    assert len(lines) == 1, out.stderr[-3000:]
    return lines[0]


def _ckpts(root: Path) -> list[Path]:
    return sorted(root.glob("runs/*/team-0/ckpt/step_*"), reverse=True)


def _train(hacrl: Hacrl, root: Path, *extra: str, env: dict[str, str] | None = None):
    return hacrl("train", *QUICK, f"output_root={root}", *extra, root=root, env=env)


def _train_here(root: Path, capsys, *extra: str) -> subprocess.CompletedProcess:
    """`hacrl train` in this process (no interpreter start: the reruns of these tests)."""
    from hacrl.cli import main

    capsys.readouterr()
    code = main(["train", *QUICK, f"output_root={root}", *extra])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["hacrl", "train"], code, captured.out, captured.err)


@pytest.fixture(scope="module")
def trained_root(tmp_path_factory, hacrl_cmd, micro_zoo, data_root, mlflow_template) -> Path:
    """One finished QUICK job (two checkpoints), trained once; tests work on copies."""
    import shutil

    root = tmp_path_factory.mktemp("trained") / "out"
    root.mkdir()
    shutil.copy(mlflow_template, root / "mlflow.db")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(HACRL_ZOO_DIR=str(micro_zoo), HACRL_DATA=str(data_root))
    out = subprocess.run([*hacrl_cmd, "train", *QUICK, f"output_root={root}"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return root


@pytest.fixture
def copied(trained_root, tmp_path, job_env) -> Path:
    """A copy of the trained output root; jobs in this process see the micro zoo."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(trained_root, root)
    return root


# -- checkpoints ---------------------------------------------------------------------------------


class Planted:
    """Runs `touch <marker>` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rewrite_record(folder: Path) -> None:
    """What an attacker with write access would do: make the COMPLETE record match."""
    record = json.loads((folder / "COMPLETE").read_text())
    record["files"] = {str(p.relative_to(folder)): [p.stat().st_size, sha256_file(p)]
                       for p in folder.rglob("*") if p.is_file() and p.name != "COMPLETE"}
    (folder / "COMPLETE").write_text(json.dumps(record))


@pytest.mark.slow
def test_a_planted_pickle_is_refused_and_runs_nothing(copied, tmp_path, capsys, steps_run):
    import torch

    root = copied
    marker = tmp_path / "PWNED"
    for folder in _ckpts(root):  # every checkpoint planted, records rewritten to match
        for name in AGENTS:
            torch_file = folder / name / "optimizer.pt"
            torch.save({"state": Planted(marker)}, torch_file)  # a real torch zip file
        (folder / "loop.pt").write_bytes(pickle.dumps(Planted(marker), protocol=4))
        _rewrite_record(folder)
    next(root.glob("runs/*/team-0/DONE.json")).unlink()  # so the rerun resumes from them

    again = _train_here(root, capsys)
    line = _one_line(again)
    assert again.returncode == 1 and "no usable checkpoint" in line and "not loaded" in line
    assert "force=true" in line
    assert not marker.exists()
    assert steps_run == []  # refused at resume: not re-trained from the start
    assert len(_ckpts(root)) == 2  # nothing deleted


def test_audit_reads_globals_without_unpickling(tmp_path) -> None:
    import io
    import zipfile

    import numpy as np
    import torch

    marker = tmp_path / "PWNED"
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pt"
        torch.save({"x": [Planted(marker)]}, path, pickle_protocol=protocol)
        with pytest.raises(CheckpointError, match="posix.system"):
            pickle_audit.safe_torch_load(path)
    # ways around a naive audit: torch's legacy format (pickles back to back, or a pickle with a
    # zip appended so that the zip's directory is found at the end), a member named .PKL
    legacy = tmp_path / "legacy.pt"
    legacy.write_bytes(pickle.dumps(119547037146038801333356) + pickle.dumps(Planted(marker)))
    fine = io.BytesIO()
    torch.save({"w": torch.ones(2)}, fine)
    appended = tmp_path / "appended.pt"
    appended.write_bytes(pickle.dumps(Planted(marker), protocol=2) + fine.getvalue())
    upper = tmp_path / "upper.pt"
    with zipfile.ZipFile(upper, "w") as archive:
        archive.writestr("archive/data.PKL", pickle.dumps(Planted(marker), protocol=2))
        archive.writestr("archive/version", "3\n")
    for path, reason in ((legacy, "not a torch zip file"), (appended, "not a torch zip file"),
                         (upper, "posix.system")):
        with pytest.raises(CheckpointError, match=reason):
            pickle_audit.audit_pickle(path)

    torch.save({"state": {0: {"exp_avg": torch.zeros(3)}}, "rng": np.random.get_state()},
               tmp_path / "fine.pt")
    pickle_audit.audit_pickle(tmp_path / "fine.pt")
    assert not marker.exists()


def test_loop_state_round_trips_through_json() -> None:
    import random

    import numpy as np
    import torch

    from hacrl.training.loop import rng_state, set_rng_state

    state = {"capability": {"history": [[0.5, 0.25]], "n_agents": 2}, "rng": rng_state()}
    decoded = checkpoint.decode_state(json.loads(json.dumps(checkpoint.encode_state(state))))
    expected = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(decoded["rng"])
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]
    assert decoded["capability"] == state["capability"]


def test_save_keeps_two_and_verify_names_the_damaged_file(tmp_path) -> None:
    import torch

    def agents(folder: Path) -> None:
        (folder / "a").mkdir()
        torch.save({"state": {0: torch.ones(64)}}, folder / "a" / "optimizer.pt")

    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, agents, {"rng": torch.get_rng_state()})
    kept = checkpoint.complete(tmp_path)
    assert [s for s, _ in kept] == [3, 2]
    for _, folder in kept:
        checkpoint.verify(folder)
    damaged = kept[0][1] / "a" / "optimizer.pt"
    damaged.write_bytes(damaged.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"a/optimizer.pt has \d+ bytes"):
        checkpoint.verify(kept[0][1])
    (kept[1][1] / "a" / "extra.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="was not part of the checkpoint"):
        checkpoint.verify(kept[1][1])
    loaded: list[Path] = []
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        checkpoint.restore(tmp_path, loaded.append)
    assert loaded == []  # nothing loaded from a checkpoint that did not verify


def test_a_link_out_of_the_checkpoint_is_refused(tmp_path) -> None:
    import torch

    def agents(folder: Path) -> None:
        (folder / "a" / "verl").mkdir(parents=True)
        torch.save({"w": torch.ones(2)}, folder / "a" / "verl" / "shard.pt")
        (folder / "a" / "model").symlink_to(Path("verl"))  # like verl's HF link: inside

    folder = checkpoint.save(tmp_path / "ckpt", 1, agents, {})
    checkpoint.verify(folder)
    outside = tmp_path / "elsewhere.pt"
    torch.save({"x": Planted(tmp_path / "PWNED")}, outside)
    (folder / "a" / "verl" / "shard.pt").unlink()
    (folder / "a" / "verl" / "shard.pt").symlink_to(outside)
    with pytest.raises(CheckpointError, match="links outside the checkpoint"):
        checkpoint.verify(folder)


def test_a_checkpoint_of_an_older_hacrl_is_refused_until_upgraded(tmp_path) -> None:
    import numpy as np
    import torch

    state = {"capability": {"history": [[0.5, 0.5]]}, "rng": {"numpy": np.random.get_state()}}
    folder = checkpoint.save(tmp_path, 3, lambda f: None, state)
    (folder / "loop.json").unlink()  # what an older hacrl wrote: a pickle and a step number
    torch.save(state, folder / "loop.pt")
    (folder / "COMPLETE").write_text("3")
    with pytest.raises(CheckpointError, match="python -m hacrl.checkpoint upgrade"):
        checkpoint.restore(tmp_path, lambda f: None)
    checkpoint.upgrade(folder)
    assert checkpoint.restore(tmp_path, lambda f: None) == (3, folder)
    assert checkpoint.load_state(folder)["capability"] == state["capability"]


@pytest.mark.slow
def test_a_job_trained_elsewhere_is_not_trained_twice(hacrl, new_output_root, job_env):
    from hacrl.config import compose, validate
    from hacrl.job import job_dir, job_lock

    root = new_output_root()
    spec = validate(compose([*QUICK, f"output_root={root}"]))
    with job_lock(job_dir(spec).path, spec.config_hash):  # this process trains the job
        out = _train(hacrl, root)
    line = _one_line(out)
    assert out.returncode == 1 and f"job {spec.config_hash} is being trained by pid" in line
    assert not _runs(root, "tags.`hacrl.kind` = 'job'")


@pytest.mark.parametrize("damage", ["model", "loop"])
@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous(copied, capsys, damage,
                                                                steps_run):
    root = copied
    newest, previous = _ckpts(root)
    target = {"model": newest / AGENTS[0] / "model" / "model.safetensors",
              "optimizer": newest / AGENTS[1] / "optimizer.pt",
              "loop": newest / "loop.json"}[damage]
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # truncated
    next(root.glob("runs/*/team-0/DONE.json")).unlink()

    again = _train_here(root, capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checkpoint skipped" in again.stderr and target.name in again.stderr
    assert "resuming from step 1" in again.stderr
    assert steps_run == [2]  # step 1 was not trained again
    jobs = sorted(_runs(root, "tags.`hacrl.kind` = 'job'"), key=lambda r: r.info.start_time)
    assert [r.info.status for r in jobs][-1] == "FINISHED"
    kids = _runs(root, f"tags.`mlflow.parentRunId` = '{jobs[-1].info.run_id}'")
    assert {r.data.tags["hacrl.resumed_at_step"] for r in kids} == {"1"}
    # the re-trained step 2 replaced the damaged one; step 1 is still there
    assert [p.name for p in _ckpts(root)] == ["step_000002", "step_000001"]
    checkpoint.verify(_ckpts(root)[0])


def _rerecord(folder: Path) -> None:
    """Rewrite a step folder's record for its files as they are now (a consistent forgery)."""
    mark = json.loads((folder / checkpoint.MARK).read_text())
    mark["files"] = {str(p.relative_to(folder)): [p.stat().st_size, checkpoint._digest(p)]
                     for p in checkpoint._files(folder)}
    (folder / checkpoint.MARK).write_text(json.dumps(mark))


@pytest.mark.parametrize("forgery", ["another_team", "foreign_loop_state", "renamed_step"])
@pytest.mark.slow
def test_a_checkpoint_that_is_not_this_teams_is_skipped_though_its_record_matches(
        copied, capsys, forgery, steps_run):
    """The newest checkpoint's files match its record, but it is not this team's (an agent
    folder of another model, a loop state of three agents, a step folder renamed): it is
    skipped with one warning naming why, and the job resumes from the previous one."""
    root = copied
    newest, _ = _ckpts(root)
    if forgery == "another_team":
        (newest / AGENTS[0]).rename(newest / "intruder-model")
        _rerecord(newest)
        why = f"holds the agents ['intruder-model', '{AGENTS[1]}'], not this team's"
    elif forgery == "foreign_loop_state":
        state = json.loads((newest / "loop.json").read_text())
        state["capability"]["history"] = [[0.5, 0.5, 0.5]]
        (newest / "loop.json").write_text(json.dumps(state))
        _rerecord(newest)
        why = "loop.json does not fit this team (ValueError: capability history is not rows"
    else:
        (newest / checkpoint.MARK).write_text((newest / checkpoint.MARK).read_text()
                                              .replace('"step": 2', '"step": 3'))
        why = "records step 3, not the folder's step_000002"
    next(root.glob("runs/*/team-0/DONE.json")).unlink()
    again = _train_here(root, capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    warnings = [ln for ln in again.stderr.splitlines() if "checkpoint skipped" in ln]
    assert len(warnings) == 1 and why in warnings[0], again.stderr[-3000:]
    assert "resuming from step 1" in warnings[0] and steps_run == [2]


@pytest.mark.slow
def test_no_usable_checkpoint_is_one_line_and_deletes_nothing(copied, capsys, steps_run):
    root = copied
    for folder in _ckpts(root):
        weights = folder / AGENTS[0] / "model" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    next(root.glob("runs/*/team-0/DONE.json")).unlink()
    before = sorted(p for p in root.rglob("*") if p.is_file() and "mlflow" not in p.name)

    again = _train_here(root, capsys)
    line = _one_line(again)
    assert again.returncode == 1 and "model.safetensors" in line and "force=true" in line
    assert steps_run == []  # refused at resume: not re-trained from the start
    after = sorted(p for p in root.rglob("*") if p.is_file() and "mlflow" not in p.name)
    assert set(before) <= set(after)


ACC = "eval/main/tiny_gsm8k/acc"


@pytest.mark.parametrize(("content", "why"), [
    ("", "unreadable"), ("{not json", "unreadable"), ("[1, 2]", "not a DONE record"),
    ('{"steps": 99}', "agents is not a list"),
    ('{"steps": 2, "agents": "x", "final": {}}', "agents is not a list"),
    ('{"steps": 2, "agents": [], "final": {}}', "agents is not a list"),
    ('{"steps": 2, "agents": ["b"], "final": {}}', "its agents ['b'] are not this team's ['a']"),
    ('{"steps": 2, "agents": ["a", "b"], "final": {}}', "are not this team's"),
    ('{"steps": 3, "agents": ["a"], "final": {}}', "it is for 3 steps, this job trains 2"),
    ('{"steps": true, "agents": ["a"], "final": {}}', "steps is not an integer"),
    ('{"steps": 2, "agents": ["a"], "final": {"b": {}}}', "final names models that are not"),
    ('{"steps": 2, "agents": ["a"], "final": []}', "final names models"),
    ('{"steps": 2, "agents": ["a"], "final": {"a": {"made/up": 1}}}', "final[a] is not"),
    (f'{{"steps": 2, "agents": ["a"], "final": {{"a": {{"{ACC}": NaN}}}}}}', "final[a] is not"),
    (f'{{"steps": 2, "agents": ["a"], "final": {{"a": {{"{ACC}": "0.9"}}}}}}', "final[a] is not"),
    ('{"steps": 2, "agents": ["a"], "final": {}, "phases": {"train_s": -1}}', "phases is not"),
    ('{"steps": 2, "agents": ["a"], "final": {}, "extra": 1}', "not a DONE record"),
])
def test_read_done_accepts_only_a_whole_record_of_this_team(tmp_path, content, why, capsys):
    path = tmp_path / "DONE.json"
    path.write_text(content)
    assert checkpoint.read_done(path, steps=2, agents=["a"]) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path} is damaged or not this team's" in err
    assert why in err, err
    whole = {"steps": 2, "agents": ["a"], "final": {"a": {ACC: 0.5}}, "phases": {"train_s": 1.0}}
    path.write_text(json.dumps(whole))
    assert checkpoint.read_done(path, steps=2, agents=["a"]) == whole


@pytest.mark.parametrize("tamper", ["made_up_scores", "an_extra_model"])
@pytest.mark.slow
def test_a_done_json_is_never_believed_over_the_runs(hacrl, new_output_root, job_env, capsys,
                                                     tamper):
    """Killed after DONE.json (before the job's metrics), its file doctored: the rerun's job
    run carries the scores the evaluation logged into the agent runs, never the file's; a file
    naming another model is refused in one line and the team is finished again, and the killed
    runs are not flipped to FINISHED."""
    root = new_output_root()
    evaluated = ["eval.at_end=true", "eval.benchmarks=[tiny_gsm8k]"]
    killed = _train(hacrl, root, *evaluated, env={"HACRL_FAULT": "done_json"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    done = next(root.glob("runs/*/team-0/DONE.json"))
    record = json.loads(done.read_text())
    if tamper == "made_up_scores":
        record["final"] = {m: {k: 0.987654 for k in v} for m, v in record["final"].items()}
    else:
        record["final"]["intruder-model"] = {ACC: 0.987654}
    done.write_text(json.dumps(record))
    again = _train_here(root, capsys, *evaluated)
    assert again.returncode == 0, again.stderr[-3000:]
    jobs = _runs(root, "tags.`hacrl.kind` = 'job'")
    finished = [r for r in jobs if r.info.status == "FINISHED"]
    assert len(finished) == 1 and not [r for r in jobs if r.info.status == "RUNNING"]
    scores = {k: v for k, v in finished[0].data.metrics.items() if k.startswith(("acc/", "avg/"))}
    assert scores and 0.987654 not in scores.values() and "intruder" not in str(scores)
    kids = _runs(root, f"tags.`mlflow.parentRunId` = '{finished[0].info.run_id}'")
    for kid in kids:
        model = kid.data.tags["model"]
        assert scores[f"acc/tiny_gsm8k/{model}"] == kid.data.metrics[ACC]
    if tamper == "an_extra_model":
        assert "DONE.json is damaged or not this team's (final names models that are not its " \
               "agents)" in again.stderr
        assert len(jobs) == 2 and {r.info.status for r in jobs} == {"FINISHED", "KILLED"}


@pytest.mark.slow
def test_a_damaged_done_json_means_not_done(copied, capsys):
    root = copied
    done = next(root.glob("runs/*/team-0/DONE.json"))
    done.write_text("")  # e.g. a full disk while it was written by an older hacrl
    again = _train_here(root, capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "DONE.json is damaged" in again.stderr and "already finished" not in again.stderr
    assert json.loads(done.read_text())["steps"] == 2  # written again, whole
    assert not _runs(root, "attributes.status = 'RUNNING'")


# -- the finishing sequence, killed at every point -----------------------------------------------


@pytest.mark.parametrize("point", FINISHING)
@pytest.mark.slow
def test_a_kill_at_any_point_of_finishing_is_repaired(hacrl, new_output_root, job_env, capsys,
                                                      point):
    """Killed at `point` (SIGKILL: no cleanup), the job's rerun ends FINISHED with every final
    evaluation in its agent runs and no run left RUNNING, and a third run says "finished"."""
    root = new_output_root()
    evaluated = ["eval.at_end=true", "eval.benchmarks=[tiny_gsm8k]"]
    killed = _train(hacrl, root, *evaluated, env={"HACRL_FAULT": point})
    assert killed.returncode == -9, killed.stderr[-3000:]
    again = _train_here(root, capsys, *evaluated)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not _runs(root, "attributes.status = 'RUNNING'")
    finished = _runs(root, "tags.`hacrl.kind` = 'job' and attributes.status = 'FINISHED'")
    assert len(finished) == 1
    kids = _runs(root, f"tags.`mlflow.parentRunId` = '{finished[0].info.run_id}'")
    assert sorted(r.data.tags["model"] for r in kids) == AGENTS
    for kid in kids:
        assert kid.info.status == "FINISHED" and kid.data.tags.get("hacrl.eval.main.key")
        assert "eval/main/tiny_gsm8k/acc" in kid.data.metrics
    assert "time/wall_s" in finished[0].data.metrics
    # ... and its tokens, summed from the agents' curves (the killed process's CPU is lost)
    assert finished[0].data.metrics["cost/tokens_trained"] > 0
    if point == "done_json":  # the point that used to wedge every rerun: now it is finished
        third = _train_here(root, capsys, *evaluated)
        assert third.returncode == 0 and "already finished" in third.stderr


# -- sweep state ---------------------------------------------------------------------------------


def _cell(cell_id: str, run_dir: Path):
    from hacrl.sweep.grid import Cell

    return Cell(id=cell_id, overrides=[], method="gspo", agents=["a"], seed=0,
                run_dir=str(run_dir))


def _tracker(root: Path):
    from hacrl.tracking import Tracker

    return Tracker(f"sqlite:///{root / 'mlflow.db'}", "hacrl-tiny")


@pytest.mark.parametrize("state", [
    {"host": "node-that-died", "heartbeat_age": 3600},       # lost node / OOM / time limit
    {"host": "this", "pid": "self", "pid_token": "x:1"},      # our pid, someone else's process
    {"host": "this", "pid": 2**22 + 7},                       # no such process
])
def test_a_dead_cell_expires_and_its_runs_are_killed(new_output_root, state, capsys):
    from hacrl.core.fileio import write_json
    from hacrl.sweep.state import cell_state_path, cell_status

    root = new_output_root()
    sweep_dir = root / "sweeps" / "x"
    tracker = _tracker(root)
    host = socket.gethostname() if state["host"] == "this" else state["host"]
    run = tracker.start_run("job", {"config_hash": "c1", "hacrl.kind": "job", "hacrl.host": host,
                                    "hacrl.pid": "1"})  # a run of the dead job's process
    record = {"status": "running", "host": host, "started": time.time() - 7200,
              "heartbeat": time.time() - state.get("heartbeat_age", 0),
              "pid": os.getpid() if state.get("pid") == "self" else state.get("pid", 1),
              "pid_token": state.get("pid_token")}
    write_json(cell_state_path(sweep_dir, "c1"), record)
    row = cell_status(_cell("c1", root / "runs" / "c1"), sweep_dir, tracker)
    assert row["status"] == "killed"  # so the sweep runs it again; its job, holding the
    assert tracker.reap_config_runs("c1") == [run]  # job's lock, marks the old runs KILLED
    assert tracker.client.get_run(run).info.status == "KILLED"


def test_a_live_cell_elsewhere_still_counts_as_running(new_output_root):
    from hacrl.core.fileio import write_json
    from hacrl.sweep.state import cell_state_path, cell_status

    root = new_output_root()
    sweep_dir = root / "sweeps" / "x"
    write_json(cell_state_path(sweep_dir, "c1"), {"status": "running", "host": "other-node",
                                                   "pid": 1, "heartbeat": time.time() - 5})
    row = cell_status(_cell("c1", root / "runs" / "c1"), sweep_dir, _tracker(root))
    assert row["status"] == "running"


@pytest.mark.parametrize("content", ["[1, 2]", "\"running\"", "{truncated", ""])
def test_a_damaged_state_file_is_no_state(new_output_root, content, capsys):
    from hacrl.sweep.state import cell_state_path, cell_status

    root = new_output_root()
    sweep_dir = root / "sweeps" / "x"
    path = cell_state_path(sweep_dir, "c1")
    path.parent.mkdir(parents=True)
    path.write_text(content)
    row = cell_status(_cell("c1", root / "runs" / "c1"), sweep_dir, _tracker(root))
    assert row["status"] == "pending"
    assert "not a hacrl state file" in capsys.readouterr().err


@pytest.mark.slow
def test_a_manifest_with_unknown_keys_is_one_line(hacrl, tmp_path):
    sweep_dir = tmp_path / "sweeps" / "table1"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "manifest.json").write_text(json.dumps(
        {"sweep": "table1", "tracking_uri": "sqlite:///x", "cells": [{"id": "a", "bogus": 1}]}))
    out = hacrl("status", "table1", f"output_root={tmp_path}", root=tmp_path)
    line = _one_line(out)
    assert out.returncode == 1 and "unknown key 'bogus'" in line and "hacrl sweep table1" in line


# -- outputs -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_never_replaces_a_folder_it_did_not_write(hacrl, new_output_root, tmp_path,
                                                         import_log):
    root = new_output_root()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    for out in (str(mine), "."):  # `.`: the cwd (tmp_path), which holds `mine`
        result = hacrl("report", "table1", "--out", out, f"output_root={root}", root=root,
                       env=import_log.env)
        line = _one_line(result)
        assert result.returncode == 1 and "hacrl report did not write" in line, line
        assert "mlflow" not in import_log.split(result.stderr)[0]  # refused before reading runs
    assert (mine / "thesis.tex").read_text() == "years of work"
    assert not _runs(root, "tags.`hacrl.kind` = 'report'")


@pytest.mark.slow
def test_sweep_and_report_names_cannot_leave_the_output_root(hacrl, tmp_path):
    for command in ("report", "sweep"):
        out = hacrl(command, "../../escape", f"output_root={tmp_path / 'out'}", root=tmp_path)
        line = _one_line(out)
        assert out.returncode == 2 and "sweep name" in line
    assert not (tmp_path / "escape").exists() and not list(tmp_path.parent.glob("escape*"))


@pytest.mark.slow
def test_report_of_an_empty_store_is_an_error_and_creates_nothing(hacrl, tmp_path):
    root = tmp_path / "empty"
    out = hacrl("report", "table1", f"output_root={root}", root=root)
    line = _one_line(out)
    assert out.returncode == 1 and "no MLflow store" in line and "hacrl sweep" in line
    assert not (root / "mlflow.db").exists() and not (root / "reports").exists()


@pytest.mark.slow
def test_report_of_a_store_without_runs_is_an_error(hacrl, new_output_root):
    root = new_output_root()  # a store with its tables, no runs
    out = hacrl("report", "table1", f"output_root={root}", root=root)
    line = _one_line(out)
    assert out.returncode == 1 and "no runs in" in line and "hacrl sweep table1" in line
    assert not (root / "reports").exists() and not _runs(root)


def test_report_replaces_its_own_previous_report(tmp_path):
    from analysis.report import MARKER, _swap_in
    from hacrl.core.errors import OutputError

    folder = tmp_path / "reports" / "table1-tiny"
    for generation in ("old", "new", "newer"):
        tmp = tmp_path / "reports" / f".tmp-{generation}"
        tmp.mkdir(parents=True)
        (tmp / "index.html").write_text(generation)
        (tmp / MARKER).write_text(json.dumps({"entries": ["index.html"]}))
        if generation == "newer":  # the user added a file to the last report: it stays
            (folder / "my-notes.md").write_text("mine")
            with pytest.raises(OutputError, match="did not write"):
                _swap_in(tmp, folder)
        else:
            _swap_in(tmp, folder)
    assert (folder / "index.html").read_text() == "new"
    assert (folder / "my-notes.md").read_text() == "mine"
    assert sorted(p.name for p in folder.parent.iterdir()) == [".tmp-newer", "table1-tiny"]


@pytest.mark.parametrize("command", ["train", "sweep"])
@pytest.mark.parametrize(("fault", "says"), [
    ("root-under-a-file", "cannot create the folder"),  # a folder under a file: never made
    ("tracking.uri=bogus://x", "no store for scheme 'bogus'"),
])
@pytest.mark.slow
def test_infrastructure_faults_are_one_line_and_quick(hacrl, tmp_path, command, fault, says,
                                                      import_log):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    root = blocker / "out" if fault == "root-under-a-file" else tmp_path / "out"
    args = [f"output_root={root}", *([] if fault.startswith("root") else [fault])]
    out = hacrl(command, *(["table1"] if command == "sweep" else QUICK), *args, root=tmp_path,
                env=import_log.env)
    line = _one_line(out)
    assert out.returncode == 1 and says in line, line
    # quick because found first: before MLflow (which retries a bad store for minutes) and
    # before any model is loaded
    assert not {"mlflow", "transformers"} & import_log.split(out.stderr)[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing half-written


def test_a_truncated_zoo_model_is_one_line(hacrl, micro_zoo, tmp_path):
    import shutil

    zoo = tmp_path / "zoo"
    shutil.copytree(micro_zoo, zoo)
    weights = zoo / AGENTS[0] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a copy cut short
    out = hacrl("train", "--dry-run", f"output_root={tmp_path / 'out'}", root=tmp_path, zoo=zoo)
    line = _one_line(out)
    assert out.returncode == 2 and "model.safetensors is truncated" in line
    assert f"hacrl zoo build --force {AGENTS[0]}" in line


@pytest.mark.parametrize("phase", ["training", "evaluating"])
@pytest.mark.slow
def test_a_sigterm_at_any_phase_is_one_line_and_the_rerun_finishes(hacrl_cmd, cli_env,
                                                                   new_output_root, phase):
    """SIGTERM while the job trains or while it evaluates: exit 143, one `hacrl:` line and no
    traceback, the runs KILLED; the same command then finishes the job."""
    import signal

    root = new_output_root()
    args = [*hacrl_cmd, "train", *QUICK, "train.steps=6", f"output_root={root}",
            "eval.at_end=true"]
    job = subprocess.Popen(args, env=cli_env(root), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    assert job.stderr is not None
    marker = b"step/s" if phase == "training" else b"generate_until"
    seen = b""
    while marker not in seen:
        chunk = os.read(job.stderr.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")[-3000:]
        seen += chunk
    job.send_signal(signal.SIGTERM)
    rest = job.stderr.read()
    assert job.wait(timeout=120) == 128 + signal.SIGTERM
    text = (seen + rest).decode(errors="replace")
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.startswith("hacrl:")]
    assert lines == ["hacrl: job stopped (SIGTERM); its MLflow runs are KILLED, and the same "
                     "command resumes it from its last checkpoint"], text[-3000:]
    assert "Traceback" not in text
    assert {r.info.status for r in _runs(root, "tags.`hacrl.kind` = 'job'")} == {"KILLED"}
    again = subprocess.run(args, env=cli_env(root), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_runs(root, "tags.`hacrl.kind` = 'job' and attributes.status = 'FINISHED'")) == 1


def _stderr_after(job: subprocess.Popen, marker: bytes, then: Callable[[], None]) -> str:
    """The job's stderr; `then()` runs once `marker` has appeared in it."""
    assert job.stderr is not None
    seen = b""
    while marker not in seen:
        chunk = os.read(job.stderr.fileno(), 4096)
        assert chunk, seen.decode(errors="replace")[-3000:]
        seen += chunk
    then()
    return (seen + job.stderr.read()).decode(errors="replace")


@pytest.mark.parametrize("how", ["deleted", "moved"])
@pytest.mark.slow
def test_a_store_deleted_or_moved_mid_job_is_one_line(hacrl_cmd, cli_env, new_output_root, how):
    root = new_output_root()
    db = root / "mlflow.db"
    job = subprocess.Popen([*hacrl_cmd, "train", *QUICK, "train.steps=8", f"output_root={root}"],
                           env=cli_env(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    text = _stderr_after(job, b"step/s", db.unlink if how == "deleted"
                         else lambda: db.rename(root / "elsewhere.db"))
    assert job.wait(timeout=300) == 1
    assert "Traceback" not in text and "sqlalchemy" not in text.lower(), text[-3000:]
    lines = [ln for ln in text.replace("\r", "\n").splitlines() if ln.startswith("hacrl:")]
    assert lines == [f"hacrl: the MLflow store {db} cannot be written: attempt to write a "
                     "readonly database (the file is gone: deleted or moved while the job ran); "
                     "restore it (or free space on its disk), then rerun the same command: the "
                     "job resumes from its newest checkpoint"], text[-3000:]


def test_a_full_disk_while_checkpointing_is_a_checkpoint_error_and_keeps_the_older_ones(
        tmp_path) -> None:
    import errno

    root = tmp_path / "ckpt"
    def whole(folder: Path) -> None:
        (folder / "w").write_text("1")

    checkpoint.save(root, 1, whole, {"step": 1})

    def full(folder: Path) -> None:
        (folder / "w").write_text("partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CheckpointError, match=r"cannot write the checkpoint of step 2 into .*: its "
                                              r"disk is full; free space there"):
        checkpoint.save(root, 2, full, {"step": 2})
    assert sorted(p.name for p in root.iterdir()) == ["step_000001"]  # no half step 2 left
    checkpoint.verify(root / "step_000001")
    with pytest.raises(ValueError, match="not a disk fault"):  # other faults stay themselves
        checkpoint.save(root, 3, lambda folder: (_ for _ in ()).throw(ValueError("not a disk "
                                                                                  "fault")), {})


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a real full disk) needs root")
def test_a_really_full_disk_mid_job_is_one_line_and_the_job_resumes(hacrl_cmd, cli_env, tmp_path,
                                                                     mlflow_template):
    """A 1.8 MB tmpfs holds the store and the first checkpoint, not the second: one line, exit
    1; with room again, the same command resumes from the checkpoint that is whole."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", str(disk)], check=True)
    try:
        root = disk / "out"
        root.mkdir()
        shutil.copy(mlflow_template, root / "mlflow.db")
        args = [*hacrl_cmd, "train", *QUICK, "train.steps=12", f"output_root={root}"]
        full = subprocess.run(args, env=cli_env(root), capture_output=True, text=True,
                              timeout=300)
        assert full.returncode == 1
        line = _one_line(full)
        assert "its disk is full; free space there, then rerun the same command" in line, line
        kept = _ckpts(root)
        assert kept
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = subprocess.run(args, env=cli_env(root), capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert _ckpts(root)[0].name == "step_000012"
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)

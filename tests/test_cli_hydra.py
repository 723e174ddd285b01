"""`hacrl train` and `hacrl sweep` are the Hydra app: Hydra's flags, multirun, shell completion,
and every example their help shows runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hacrl.cli.main import _parser
from hacrl.cli.sweep_commands import SWEEP_EXAMPLES
from hacrl.cli.train_command import TRAIN_EXAMPLES
from hacrl.config import compose


def _run(cmd: list[str], env: dict[str, str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env={**env, **extra}, cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_cfg_job_prints_the_composed_config_and_runs_nothing(hacrl_cmd, cli_env, tmp_path):
    out = _run([*hacrl_cmd, "train", "--cfg", "job", "pair=size", "train.lr=1e-4"],
               cli_env(tmp_path / "outputs"), tmp_path)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^\s+lr: 0\.0001$", out.stdout, re.M), out.stdout[:2000]
    assert "qwen3-1.7b-base" in out.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_multirun_with_comma_sweeps_runs_each_job(hacrl_cmd, cli_env, tmp_path, tiny_job):
    root = tmp_path / "outputs"
    out = _run([*hacrl_cmd, "train", "-m", "seed=0,1", "pair=size", "method=gspo",
                "agents=[qwen3-4b-base]", *tiny_job], cli_env(root), tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    jobs = client.search_runs(ids, "tags.`hacrl.kind` = 'job'")
    assert sorted(r.data.tags["seed"] for r in jobs) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in jobs)
    assert (root / "multirun").is_dir() and not (tmp_path / "multirun").exists()


@pytest.mark.slow
def test_shell_completion_installs_for_hacrl_and_completes_overrides(hacrl_cmd, cli_env,
                                                                       tmp_path):
    env = cli_env(tmp_path / "outputs")
    script = _run([*hacrl_cmd, "-sc", "install=bash"], env, tmp_path)
    assert script.returncode == 0, script.stderr
    assert re.search(r"complete .*-F hydra_bash_completion hacrl$", script.stdout.strip())

    def query(line: str) -> list[str]:
        out = _run([*hacrl_cmd, "-sc", "query=bash"], env, tmp_path, COMP_LINE=line,
                   COMP_POINT=str(len(line)))
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert query("hacrl sw") == ["sweep"]
    assert "table1" in query("hacrl sweep ")
    assert "pair=" in query("hacrl train pai")
    assert "size" in " ".join(query("hacrl train pair=si"))
    assert any(w.startswith("train.") for w in query("hacrl sweep table1 trai"))


def test_dry_run_refuses_hydra_flags_in_one_line(hacrl_cmd, cli_env, tmp_path):
    out = _run([*hacrl_cmd, "train", "--dry-run", "--cfg", "job"], cli_env(tmp_path), tmp_path)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "--cfg" in out.stderr


def _examples(text: str) -> list[str]:
    """The commands of an `examples:` epilog (two-space indent, before the description)."""
    out = []
    for line in text.splitlines():
        if line.startswith("  hacrl ") or line.startswith('  eval "$(hacrl'):
            command = re.split(r"\s{2,}", line.strip())[0]
            out.append(command)
    return out


@pytest.mark.parametrize("command", _examples(TRAIN_EXAMPLES) + _examples(SWEEP_EXAMPLES))
@pytest.mark.slow
def test_every_help_example_runs(command, hacrl_cmd, cli_env, tmp_path, tiny_job):
    """Train examples run for real on micro models (a few steps); sweep examples launch nothing
    (hydra.sweeper.dry_run=true, unless the example prints a config)."""
    if command.startswith("eval"):
        words = command.split('"$(')[1].rstrip(')"').split()
    else:
        words = command.split()
    args = words[1:]
    if args[0] == "train" and "--cfg" not in args:
        args += list(tiny_job)
    if args[0] == "sweep" and "--cfg" not in args and "hydra.sweeper.dry_run=true" not in args:
        args.append("hydra.sweeper.dry_run=true")
    out = _run([*hacrl_cmd, *args], cli_env(tmp_path / "outputs"), tmp_path)
    assert out.returncode == 0, f"{command}\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}"


def test_every_override_a_help_text_gives_as_an_example_composes() -> None:
    parser = _parser()
    texts = [a.help or "" for a in parser._actions if a.help != "==SUPPRESS=="]
    for action in parser._actions:
        choices = getattr(action, "choices", None)  # subcommands: name -> their parser
        for sub_parser in (choices.values() if isinstance(choices, dict) else ()):
            texts += [a.help or "" for a in sub_parser._actions if a.help != "==SUPPRESS=="]
            texts.append(sub_parser.epilog or "")
    found = {m for t in texts for m in re.findall(r"(?<!-sc )(?<![+~])\b([\w.]+=[^\s,):;]+)", t)}
    overrides = sorted(o for o in found if "..." not in o and not o.startswith("hydra."))
    assert "eval.use=[ablation]" in overrides and "scale=paper" in overrides
    for override in overrides:
        compose([override])  # raises ConfigError naming it otherwise


def test_hacrl_help_imports_no_torch() -> None:
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "hacrl.cli", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "transformers" not in imported


def test_a_plain_train_composes_and_validates_its_job_once(job_env, tmp_path, monkeypatch):
    """`hacrl train OVERRIDES` composes and validates once in its process and hands that spec
    to the job (the Hydra app, which would compose and validate again, is not run); a dry run
    too. The job itself is recorded, not run: what it is handed is the point here."""
    import hacrl.cli.hydra_app
    import hacrl.config
    import hacrl.job
    import hacrl.train
    from hacrl.cli.main import main

    calls: dict[str, list] = {"compose": [], "validate": [], "app": [], "job": []}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name].append(args)
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(hacrl.config, "compose", counted("compose", hacrl.config.compose))
    validate = counted("validate", hacrl.config.validate)
    monkeypatch.setattr(hacrl.config, "validate", validate)
    monkeypatch.setattr(hacrl.train, "validate", validate)
    monkeypatch.setattr(hacrl.cli.hydra_app, "run_app", counted("app", lambda args: 0))
    monkeypatch.setattr(hacrl.job, "run_job",
                        lambda spec: calls["job"].append(spec) or {"skipped": True})
    overrides = ["method=gspo", "agents=[qwen3-4b-base]", f"output_root={tmp_path / 'out'}"]
    assert main(["train", *overrides]) == 0
    assert [len(calls[k]) for k in ("compose", "validate", "app", "job")] == [1, 1, 0, 1]
    spec = calls["job"][0]
    assert spec.method.name == "gspo" and spec.settings.loss is spec.loss
    for key in calls:
        calls[key].clear()
    assert main(["train", "--dry-run", *overrides]) == 0
    assert [len(calls[k]) for k in ("compose", "validate", "app", "job")] == [1, 1, 0, 0]

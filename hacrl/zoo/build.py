"""Build the tiny model zoo: tokenizer + random init + SFT, saved like real checkpoints.

Each model is written into a private temporary directory next to its final place; its
``zoo_card.json`` is written last and the directory is then renamed into place, so a
killed build never leaves a model that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from hacrl.core.eta import ItemProgress
from hacrl.core.faults import die_with_parent
from hacrl.data.arith import load_probe, load_split
from hacrl.zoo.cards import CARD_NAME
from hacrl.zoo.schedule import expected_steps, group_runs, run_cost, schedule
from hacrl.zoo.sft import SFTConfig, SFTResult, probe_accuracy, sft_train, sft_train_stages
from hacrl.zoo.specs import ZOO, ZooSpec, make_config, shares_sft, validate_names
from hacrl.zoo.tokenizers import FAMILIES, build_tokenizer

__all__ = [
    "CARD_NAME",
    "VLLM_MICRO_ZOO",
    "build_micro_model",
    "build_model",
    "build_models",
    "build_vllm_micro_zoo",
    "build_zoo",
    "default_zoo_dir",
    "is_built",
    "kept_models",
    "load_card",
    "zoo_model_dir",
]

_CARD_FORMAT = 1


def default_zoo_dir() -> Path:
    """``$HACRL_ZOO_DIR`` if set, else ``~/.cache/hacrl/zoo/v1``."""
    env = os.environ.get("HACRL_ZOO_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hacrl" / "zoo" / "v1"


def zoo_model_dir(name: str, root: str | Path | None = None) -> Path:
    """Directory of zoo model ``name`` (loadable with ``from_pretrained`` once built)."""
    validate_names([name])
    return (Path(root) if root is not None else default_zoo_dir()) / name


def is_built(name: str, root: str | Path | None = None) -> bool:
    """Whether ``name`` is completely built under ``root`` (its card exists)."""
    return (zoo_model_dir(name, root) / CARD_NAME).is_file()


def load_card(name: str, root: str | Path | None = None) -> dict[str, Any]:
    """The ``zoo_card.json`` of a built model."""
    with (zoo_model_dir(name, root) / CARD_NAME).open(encoding="utf-8") as f:
        card: dict[str, Any] = json.load(f)
    return card


def _misfit(card: dict[str, Any], spec: ZooSpec, seed: int) -> str:
    """How the built model of ``card`` differs from what ``spec`` and ``seed`` build ("" if
    not). Spec fields an older card does not record are not held against it."""
    if card.get("seed") != seed:
        return f"seed {card.get('seed')}, not {seed}"
    built = card.get("spec", {})
    changed = [k for k, v in spec.to_dict().items() if k in built and built[k] != v]
    return f"another {', '.join(changed)}" if changed else ""


def _init_seed(spec: ZooSpec, seed: int) -> int:
    """Seed for initialisation and data order; shared by specs with the same ``init_key``."""
    key = f"{spec.init_key or spec.name}/{seed}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "big")


def _new_model(spec: ZooSpec, tok: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(spec, tok), dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    assert isinstance(model, PreTrainedModel)
    return model


def _remove_stale(root: Path, name: str) -> None:
    """Delete temporary directories of ``name`` left by build processes that are gone."""
    for tmp in root.glob(f".{name}.partial-*"):
        try:
            os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
        except (ValueError, ProcessLookupError):
            shutil.rmtree(tmp, ignore_errors=True)
        except PermissionError:
            pass  # process alive, owned by someone else


def _install(tmp: Path, final: Path) -> None:
    """Move the finished ``tmp`` directory to ``final``, replacing any previous content."""
    for path in tmp.iterdir():
        path.chmod(0o644)
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)


def _save_model_dir(model: PreTrainedModel, tok: PreTrainedTokenizerBase, card: dict[str, Any],
                    final: Path) -> None:
    """Write model, tokenizer and card (last) into a temp folder, then rename it into place."""
    tmp = final.with_name(f".{final.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # one bar per saved shard is noise here
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        with (tmp / CARD_NAME).open("w", encoding="utf-8") as f:  # written last
            json.dump(card, f, indent=2)
        _install(tmp, final)
    finally:
        if bars:  # a process that builds a model keeps its bars for everything else
            transformers.utils.logging.enable_progress_bar()
        shutil.rmtree(tmp, ignore_errors=True)


def build_model(spec: ZooSpec, out_dir: str | Path, seed: int = 0) -> dict[str, Any]:
    """Build one zoo model into ``out_dir`` atomically and return its card."""
    return build_models([spec], [out_dir], seed)[0]


def build_models(
    specs: Sequence[ZooSpec], out_dirs: Sequence[str | Path], seed: int = 0,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Build zoo models that share one SFT trajectory (see ``shares_sft``) with one SFT run;
    each is saved atomically into its ``out_dirs`` entry as soon as it reaches its target,
    with the weights a separate ``build_model`` would give it. Returns their cards.
    ``progress``: a line on stderr every ~15 s of the run (step, probe accuracy, target)."""
    if not specs or len(specs) != len(out_dirs):
        raise ValueError("build_models needs one output directory per spec")
    lead = specs[0]
    if not all(shares_sft(lead, s) for s in specs[1:]):
        raise ValueError(f"{[s.name for s in specs]} do not share one SFT run")
    t0 = time.perf_counter()
    finals = [Path(d) for d in out_dirs]
    for final in finals:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(final.parent, final.name)
    tok = build_tokenizer(lead.family)
    init_seed = _init_seed(lead, seed)
    model = _new_model(lead, tok, init_seed)
    cfg = SFTConfig(
        lr=lead.lr,
        batch_size=lead.batch_size,
        warmup_steps=lead.warmup_steps,
        max_steps=lead.max_steps,
        eval_every=lead.eval_every,
        seed=init_seed,
    )
    cards: list[dict[str, Any]] = [{} for _ in specs]

    def save(i: int, result: SFTResult) -> None:
        bench = probe_accuracy(model, tok, load_split("tiny_math500"))
        seconds = time.perf_counter() - t0  # of the shared run, up to this model
        cards[i] = _card(specs[i], seed, init_seed, result, bench, model, tok, seconds)
        _save_model_dir(model, tok, cards[i], finals[i])

    targets = [s.target_accuracy for s in specs]
    shown = [t0]

    def probed(step: int, acc: float) -> None:
        if time.perf_counter() - shown[0] < 15.0:
            return
        shown[0] = time.perf_counter()
        print(_progress_line(specs, step, acc, time.perf_counter() - t0), file=sys.stderr,
              flush=True)

    sft_train_stages(model, tok, load_split("train"), cfg, load_probe(), targets, save,
                     probed if progress else None)
    return cards


def _progress_line(specs: Sequence[ZooSpec], step: int, acc: float, seconds: float) -> str:
    """One progress line of a running SFT run; the expected steps (one machine's build:
    other CPUs take more or fewer, see ``_STEPS_SEEN``) only while the run is short of them."""
    expected = max((expected_steps(s.name) or 0 for s in specs), default=0)  # the last stop
    about = f" of ~{expected}" if expected and step < expected else ""
    return (f"[zoo] {'+'.join(s.name for s in specs)}: SFT step {step}{about}, probe accuracy "
            f"{acc:.2f} (target {max(s.target_accuracy for s in specs):.2f}), {seconds:.0f} s")


def _card(
    spec: ZooSpec,
    seed: int,
    init_seed: int,
    result: SFTResult,
    bench: float,
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    seconds: float,
) -> dict[str, Any]:
    return {
        "format": _CARD_FORMAT,
        "name": spec.name,
        "spec": spec.to_dict(),
        "seed": seed,
        "init_seed": init_seed,
        "sft_steps": result.steps,
        "probe_accuracy": result.probe_accuracy,
        "reached_target": result.reached_target,
        "probe_history": [list(h) for h in result.history],
        "final_loss": result.final_loss,
        "probe_seconds": round(result.eval_seconds, 2),
        "tiny_math500_greedy_accuracy": bench,
        "param_count": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "seconds": round(seconds, 2),
    }


def _summary(card: dict[str, Any]) -> str:
    return (
        f"probe accuracy {card['probe_accuracy']}, {card['param_count']} params, "
        f"{card['sft_steps']} SFT steps, {card['seconds']} s"
    )


def _build_in_worker(names: list[str], root: str, seed: int) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    return build_models([ZOO[n] for n in names], [Path(root) / n for n in names], seed,
                        progress=True)


def kept_models(
    root: Path, names: Sequence[str], seed: int = 0, force: bool = False
) -> dict[str, dict[str, Any]]:
    """The cards of the named models that ``build_zoo`` keeps (complete, and not ``force``).

    Raises ValueError if one of them was built with another seed or recipe: a build asking for
    seed 1 must not silently return seed-0 models.
    """
    if force:
        return {}
    cards = {name: load_card(name, root) for name in names if is_built(name, root)}
    misfits: dict[str, list[str]] = {}
    for name, card in cards.items():
        if why := _misfit(card, ZOO[name], seed):
            misfits.setdefault(why, []).append(name)
    if misfits:
        built = "; ".join(f"{', '.join(models)} with {why}" for why, models in misfits.items())
        raise ValueError(
            f"{root} holds models built differently from this request ({built}): build into "
            "another directory (--root) or replace them (--force)"
        )
    return cards


def build_zoo(
    root: str | Path | None = None,
    names: Sequence[str] | None = None,
    seed: int = 0,
    workers: int = 2,
    force: bool = False,
) -> dict[str, dict[str, Any]]:
    """Build every (or the named) zoo model under ``root``; returns the cards by name.

    Models already complete are skipped unless ``force``. Models sharing an SFT trajectory
    are built by one SFT run (``build_models``). Runs go to ``workers`` spawned processes,
    each limited to one torch thread (so a script calling this needs the usual
    ``if __name__ == "__main__":`` guard), in the order that ``schedule`` expects to finish
    first.
    """
    todo_names = validate_names(None if names is None else list(names))
    base = Path(root) if root is not None else default_zoo_dir()
    base.mkdir(parents=True, exist_ok=True)
    cards = kept_models(base, todo_names, seed, force)
    todo = [name for name in todo_names if name not in cards]
    runs = schedule(group_runs(todo), workers)
    # each model's share of its run's expected cost: the ETA weighs the long runs as such
    shown = ItemProgress("zoo", todo, {n: run_cost(r) / len(r) for r in runs for n in r})
    if workers <= 1 or len(runs) <= 1:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for run in runs:
                for card in build_models([ZOO[n] for n in run], [base / n for n in run], seed,
                                         progress=True):
                    cards[card["name"]] = card
                    shown.finished(card["name"], _summary(card))
        finally:
            torch.set_num_threads(threads)
    else:
        n = min(workers, len(runs))
        # the workers die with this process (a killed `hacrl zoo build` leaves none training,
        # and none writes a model into the zoo after it)
        with ProcessPoolExecutor(max_workers=n, mp_context=get_context("spawn"),
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
            futures = [pool.submit(_build_in_worker, run, str(base), seed) for run in runs]
            for fut in as_completed(futures):
                for card in fut.result():
                    cards[card["name"]] = card
                    shown.finished(card["name"], _summary(card))
    return {name: cards[name] for name in todo_names}


def build_micro_model(family: str, out_dir: str | Path, seed: int = 0, sft_steps: int = 60,
                      solve: float | None = None, head_dim: int | None = None) -> Path:
    """A very small model + tokenizer of ``family`` for unit tests (seconds to build).

    It is saved like a zoo model and can generate. By default it trains ``sft_steps`` steps on
    worked solutions and solves nothing: the verifier gives it reward 0.

    ``solve``: a greedy accuracy to reach on two-digit sums without a carry (level 1), so that
    jobs on the model see rewards, advantages and accuracies that vary. It then has four query
    and two key-value heads (learns sooner) and trains on the train split's level-1 problems
    answered by a bare ``\\boxed{N}`` (a dozen tokens: it fits a test job's short rollouts)
    until its greedy accuracy on the probe set's level-1 problems reaches ``solve``, at most
    ``sft_steps`` steps: 150-350 steps as the seed goes, about 2 s on an idle core.

    ``head_dim``: the attention heads' width (default hidden_size / heads = 8 or 16); vLLM's
    CPU attention refuses those, a vLLM micro model sets 32.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; valid: {', '.join(FAMILIES)}")
    heads = (2, 1) if solve is None else (4, 2)
    spec = ZooSpec(
        name=f"micro-{family}",
        paper_model="",
        family=family,
        hidden_size=32,
        num_layers=1,
        num_heads=heads[0],
        num_kv_heads=heads[1],
        intermediate_size=64,
        target_accuracy=solve or 0.0,
        head_dim=head_dim,
    )
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(family)
    model = _new_model(spec, tok, seed)
    if solve is None:
        cfg = SFTConfig(lr=1e-2, batch_size=16, warmup_steps=5, max_steps=sft_steps, seed=seed)
        result = sft_train(model, tok, load_split("train")[:2000], cfg)
    else:
        train = [replace(p, solution=f"\\boxed{{{p.answer}}}") for p in load_split("train")
                 if p.level == 1]
        probe = [p for p in load_probe() if p.level == 1]
        cfg = SFTConfig(lr=1e-2, batch_size=32, warmup_steps=5, max_steps=sft_steps,
                        target_accuracy=solve, seed=seed)
        result = sft_train(model, tok, train, cfg, probe)
    card = {
        "format": _CARD_FORMAT,
        "name": spec.name,
        "spec": spec.to_dict(),
        "seed": seed,
        "sft_steps": result.steps,
        "final_loss": result.final_loss,
        "param_count": sum(p.numel() for p in model.parameters()),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if solve is not None:  # greedy accuracy on the level-1 probe problems
        card.update(probe_accuracy=result.probe_accuracy, reached_target=result.reached_target)
    _save_model_dir(model, tok, card, out)
    return out


# A micro zoo vLLM's CPU attention accepts (head_dim 32; the zoo's and the test micro models'
# 8-16 are refused): two tokenizers (char-level Qwen, byte-level BPE Llama) under catalog names
# of `pair=model_small`, each trained to its own level-1 accuracy so that rewards vary.
# name -> (tokenizer family, seed, greedy accuracy to reach)
VLLM_MICRO_ZOO = {"qwen3-1.7b-base": ("qwen", 0, 0.7), "llama3.2-1b-instruct": ("llama", 0, 0.5)}
VLLM_HEAD_DIM = 32


def build_vllm_micro_zoo(root: str | Path, names: list[str] | None = None) -> Path:
    """`<root>/<name>/` for each model of `VLLM_MICRO_ZOO` (or `names` of it), built like the
    test micro models with `head_dim=32`; seconds each. Models already there are kept."""
    root = Path(root)
    for name in names or list(VLLM_MICRO_ZOO):
        family, seed, solve = VLLM_MICRO_ZOO[name]
        if not (root / name / "config.json").is_file():
            build_micro_model(family, root / name, seed=seed, sft_steps=600, solve=solve,
                              head_dim=VLLM_HEAD_DIM)
    return root

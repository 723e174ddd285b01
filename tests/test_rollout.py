"""Tokenizer-neutral trajectories and retokenisation between genuinely different tokenizers:
the micro zoo's qwen tokenizer is character level, its llama tokenizer is a byte-level BPE."""

from __future__ import annotations

import pytest

from hacrl.algo.rollout import (
    RetokenizationOverflow,
    Trajectory,
    eos_id,
    own_view,
    render_prompt_ids,
    retokenize,
)

TEXT = "47+38=85. \\boxed{85}"
MESSAGES = [{"role": "user", "content": "What is 47+38?"}]


def _traj(text: str = TEXT, finished: bool = True, source: int = 0, tokens: list[int] | None = None,
          uid: str = "train-17") -> Trajectory:
    return Trajectory(uid, MESSAGES, text, source, tokens if tokens is not None else [1, 2, 3],
                      finished)


def _text_ids(tok, text: str = TEXT) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_the_two_tokenizers_really_differ(tokenizers):
    qwen, llama = tokenizers["qwen"], tokenizers["llama"]
    assert eos_id(qwen) != eos_id(llama)
    assert len(_text_ids(qwen)) == len(TEXT)  # one token per character
    assert len(_text_ids(llama)) < len(TEXT)  # merges


@pytest.mark.parametrize("source,target", [("qwen", "llama"), ("llama", "qwen")])
def test_response_text_survives_retokenisation(tokenizers, source, target):
    src, tgt = tokenizers[source], tokenizers[target]
    src_tokens = _text_ids(src) + [eos_id(src)]
    traj = _traj(src.decode(src_tokens, skip_special_tokens=True), tokens=src_tokens)
    assert traj.response_text == TEXT
    view = retokenize(traj, tgt, render_prompt_ids(tgt, MESSAGES), max_response_tokens=64)
    assert tgt.decode(list(view.response_ids), skip_special_tokens=True) == TEXT
    assert len(view.response_ids) != len(src_tokens)
    assert view.response_ids[-1] == eos_id(tgt)
    assert not view.truncated


def test_lengths_follow_the_target_tokenizer(tokenizers):
    qwen, llama = tokenizers["qwen"], tokenizers["llama"]
    to_qwen = retokenize(_traj(), qwen, [], 64)
    to_llama = retokenize(_traj(), llama, [], 64)
    assert len(to_qwen.response_ids) == len(TEXT) + 1
    assert len(to_llama.response_ids) == len(_text_ids(llama)) + 1
    assert len(to_llama.response_ids) < len(to_qwen.response_ids)


@pytest.mark.parametrize("target", ["qwen", "llama"])
def test_finished_response_gets_the_targets_eos(tokenizers, target):
    tgt = tokenizers[target]
    other = tokenizers["llama" if target == "qwen" else "qwen"]
    view = retokenize(_traj(finished=True), tgt, [], 64)
    assert view.response_ids[-1] == eos_id(tgt)
    assert view.response_ids[-1] != eos_id(other)
    assert list(view.response_ids[:-1]) == _text_ids(tgt)
    assert view.response_ids.count(eos_id(tgt)) == 1


@pytest.mark.parametrize("target", ["qwen", "llama"])
def test_unfinished_response_gets_no_eos(tokenizers, target):
    tgt = tokenizers[target]
    view = retokenize(_traj(finished=False), tgt, [], 64)
    assert list(view.response_ids) == _text_ids(tgt)
    assert eos_id(tgt) not in view.response_ids
    assert not view.truncated


@pytest.mark.parametrize("target", ["qwen", "llama"])
def test_overflow_truncate_cuts_and_drops_eos(tokenizers, target):
    tgt = tokenizers[target]
    full = _text_ids(tgt)
    budget = len(full) - 3
    view = retokenize(_traj(finished=True), tgt, [7, 8], budget, overflow="truncate")
    assert view.truncated
    assert list(view.response_ids) == full[:budget]
    assert eos_id(tgt) not in view.response_ids
    assert view.prompt_ids == (7, 8)


def test_overflow_boundaries(tokenizers):
    tgt = tokenizers["llama"]
    n = len(_text_ids(tgt))
    # text fits but its EOS does not: only the EOS goes, and the response counts as cut
    only_eos = retokenize(_traj(finished=True), tgt, [], n)
    assert only_eos.truncated and list(only_eos.response_ids) == _text_ids(tgt)
    exact = retokenize(_traj(finished=True), tgt, [], n + 1)
    assert not exact.truncated and exact.response_ids[-1] == eos_id(tgt)
    unfinished = retokenize(_traj(finished=False), tgt, [], n)
    assert not unfinished.truncated and len(unfinished.response_ids) == n


def test_overflow_error_raises_naming_the_key(tokenizers):
    tgt = tokenizers["qwen"]
    traj = _traj(finished=True, source=1, uid="train-4242")
    with pytest.raises(RetokenizationOverflow) as err:
        retokenize(traj, tgt, [], 5, overflow="error")
    message = str(err.value)
    assert "rollout.max_new_tokens" in message
    assert "train-4242" in message
    assert isinstance(err.value, ValueError)
    # within budget, "error" behaves like "truncate"
    ok = retokenize(traj, tgt, [], 64, overflow="error")
    assert ok == retokenize(traj, tgt, [], 64, overflow="truncate")


def test_unknown_overflow_mode_is_rejected(tokenizers):
    with pytest.raises(ValueError, match="overflow"):
        retokenize(_traj(), tokenizers["qwen"], [], 64, overflow="wrap")


def test_own_view_keeps_the_sources_exact_tokens(tokenizers):
    llama = tokenizers["llama"]
    canonical = _text_ids(llama)
    # the same text spelled character by character: a valid, non-canonical segmentation that
    # a sampler can emit
    byte_tokens = [tid for ch in TEXT for tid in llama.encode(ch, add_special_tokens=False)]
    assert llama.decode(byte_tokens) == TEXT
    assert byte_tokens != canonical
    source_tokens = [*byte_tokens, eos_id(llama)]
    traj = _traj(llama.decode(byte_tokens), finished=True, tokens=source_tokens)
    prompt = render_prompt_ids(llama, MESSAGES)
    own = own_view(traj, prompt)
    assert own.response_ids == tuple(source_tokens)
    assert own.prompt_ids == tuple(prompt)
    assert not own.truncated
    # the round trip through text would have given different tokens
    assert retokenize(traj, llama, prompt, 64).response_ids != own.response_ids


def test_render_prompt_ids_uses_each_models_own_chat_template(tokenizers):
    qwen, llama = tokenizers["qwen"], tokenizers["llama"]
    q_ids, l_ids = render_prompt_ids(qwen, MESSAGES), render_prompt_ids(llama, MESSAGES)
    q_text = qwen.decode(q_ids, skip_special_tokens=False)
    l_text = llama.decode(l_ids, skip_special_tokens=False)
    assert q_text == "<|im_start|>user\nWhat is 47+38?<|im_end|>\n<|im_start|>assistant\n"
    assert l_text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 47+38?"
                      "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    # special tokens are single ids, and the template's BOS is not doubled by encode()
    assert q_ids[0] == qwen.convert_tokens_to_ids("<|im_start|>")
    bos = llama.convert_tokens_to_ids("<|begin_of_text|>")
    assert l_ids[0] == bos and l_ids.count(bos) == 1
    assert llama.convert_tokens_to_ids("<|start_header_id|>") in l_ids
    # a borrowed view carries the target's prompt, whatever the source saw
    view = retokenize(_traj(), llama, l_ids, 64)
    assert view.prompt_ids == tuple(l_ids)


def test_eos_id_accepts_lists_and_rejects_none() -> None:
    class Tok:
        eos_token_id: object = [7, 9]

    assert eos_id(Tok()) == 7  # type: ignore[arg-type]
    Tok.eos_token_id = None
    with pytest.raises(ValueError, match="eos"):
        eos_id(Tok())  # type: ignore[arg-type]

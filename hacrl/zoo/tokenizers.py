"""Two tokenizer families for the tiny zoo, built locally with the ``tokenizers`` library.

* ``qwen``: character level over printable ASCII and ``\\n`` with Qwen's special tokens
  and ChatML chat template.
* ``llama``: byte-level BPE trained on the task text (no token holds more than one digit),
  with Llama-3 special tokens and chat template. Like Llama 3, plain encoding adds
  ``<|begin_of_text|>``; chat-rendered prompts already contain it, so encode them
  with ``add_special_tokens=False``.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Iterator

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from hacrl.data.arith import load_split

__all__ = [
    "FAMILIES",
    "LLAMA_CHAT_TEMPLATE",
    "LLAMA_SPECIALS",
    "QWEN_CHAT_TEMPLATE",
    "QWEN_SPECIALS",
    "build_llama_tokenizer",
    "build_qwen_tokenizer",
    "build_tokenizer",
    "task_corpus",
]

FAMILIES: tuple[str, ...] = ("qwen", "llama")

QWEN_SPECIALS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA_SPECIALS: tuple[str, ...] = (
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|finetune_right_pad_id|>",
)

QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA_CHAT_TEMPLATE = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

_CHARS = "".join(c for c in string.printable if c.isprintable()) + "\n"  # ' '..'~' and newline


def _wrap(tok: Tokenizer, **special: str) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        clean_up_tokenization_spaces=False,
        model_max_length=256,
        **special,
    )
    return wrapped


def build_qwen_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with Qwen special tokens (pad ``<|endoftext|>``, eos ``<|im_end|>``)."""
    chars = sorted(set(_CHARS))
    vocab = {c: i for i, c in enumerate(chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(QWEN_SPECIALS))
    wrapped = _wrap(tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    wrapped.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    wrapped.chat_template = QWEN_CHAT_TEMPLATE
    return wrapped


def task_corpus() -> Iterator[str]:
    """Text the BPE is trained on: what the chat template puts between special tokens."""
    for p in load_split("train"):
        yield from ("user", "\n\n" + p.question, "assistant", p.solution)


def build_llama_tokenizer(
    corpus: Iterable[str] | None = None, vocab_size: int = 384
) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on ``corpus`` (default: the task text) with Llama-3 specials."""
    tok = Tokenizer(models.BPE())
    # Each pre-token holds at most one digit (attached to the text before it), so numbers
    # are never merged into multi-digit tokens but "+3", "=8" or "What is 4" can be.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\D*\d|\D+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(LLAMA_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus if corpus is not None else task_corpus()), trainer)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tok.token_to_id(bos))],
    )
    wrapped = _wrap(
        tok,
        bos_token=bos,
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    wrapped.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]}
    )
    wrapped.chat_template = LLAMA_CHAT_TEMPLATE
    return wrapped


def build_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """Tokenizer of a family (``"qwen"`` or ``"llama"``)."""
    if family == "qwen":
        return build_qwen_tokenizer()
    if family == "llama":
        return build_llama_tokenizer()
    raise ValueError(f"unknown tokenizer family {family!r}; valid: {', '.join(FAMILIES)}")

"""Turning a hub row into the project's row: `{uid, problem, prompt, answer, source, ...}`.

Each benchmark stores its final answer differently (a field, the last `\\boxed{}` of a worked
solution, the text after GSM8K's `####`, the first item of OlympiadBench's list); the source's
`answer_rule` says which. Answers are written as strings so the graders see one type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hacrl.data.sources import DataError, Source

__all__ = ["answer_text", "convert_rows", "last_boxed", "synthetic_rows"]

_LEVEL = re.compile(r"^\s*Level\s+(\d+)\s*$")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if absent."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None  # unbalanced: treat as absent rather than guess


def _scalar(value: Any) -> str:
    """A scalar answer as text: 27.0 -> "27" (amc23 stores floats), 0.5 -> "0.5"."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return str(value)


def _strip_math(text: str) -> str:
    """`$x^2$` -> `x^2`: OlympiadBench wraps answers in inline-math dollars."""
    text = text.strip()
    if len(text) >= 2 and text.startswith("$") and text.endswith("$"):
        text = text.strip("$").strip()
    return text


def answer_text(value: Any, rule: str) -> str | None:
    """The final answer under `rule` (see `ANSWER_RULES`); None when it cannot be found."""
    if rule == "first_item":
        if isinstance(value, str) or not hasattr(value, "__len__") or len(value) == 0:
            return None
        value = value[0]
    if value is None:
        return None
    text = _scalar(value)
    if rule == "last_boxed":
        found = last_boxed(text)
        if found is None:
            return None
        text = found
    elif rule == "after_hashes":
        if "####" not in text:
            return None
        text = text.rsplit("####", 1)[1]
    answer = _strip_math(text)
    return answer or None


def _extra(field: str, value: Any) -> Any:
    """A kept field, JSON-ready; MATH's "Level 3" becomes 3 ("Level ?" becomes None)."""
    if field == "level" and isinstance(value, str):
        match = _LEVEL.match(value)
        return int(match.group(1)) if match else None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "tolist"):  # numpy values from parquet-backed columns
        return value.tolist()
    return value


def convert_rows(source: Source, rows: Sequence[Mapping[str, Any]],
                 instruction: str) -> list[dict[str, Any]]:
    """Rows of a hub source in the project schema; a row without problem or answer raises."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        where = f"data.sources.{source.name}: row {index}"
        for field in (source.problem, source.answer, *source.keep,
                      *([source.id_field] if source.id_field else [])):
            if field not in row:
                raise DataError(f"{where} has no field {field!r} (fields: {', '.join(row)}); "
                                "fix the source's field names in experiments/data/catalog.yaml")
        problem = str(row[source.problem] or "").strip()
        answer = answer_text(row[source.answer], source.answer_rule)
        if not problem or answer is None:
            what = "problem" if not problem else f"answer ({source.answer_rule} of {source.answer!r})"
            raise DataError(f"{where}: empty or unreadable {what}; check the source's "
                            "problem/answer/answer_rule")
        ident = row[source.id_field] if source.id_field else f"{index:05d}"
        uid = f"{source.name}-{_scalar(ident)}"
        if uid in seen:
            raise DataError(f"{where}: duplicate uid {uid}; id_field={source.id_field} is not "
                            "unique, set id_field: null to number rows instead")
        seen.add(uid)
        prompt = f"{problem} {instruction}" if source.instruction else problem
        record: dict[str, Any] = {"uid": uid, "problem": problem, "prompt": prompt,
                                  "answer": answer, "source": source.name}
        for field in source.keep:
            record[field] = _extra(field, row[field])
        out.append(record)
    return out


def synthetic_rows(source: Source, instruction: str) -> list[dict[str, Any]]:
    """Rows of a `hacrl.data.arith` split; the tiny models learnt the bare question, so no instruction
    unless the source asks for one."""
    from hacrl.data.arith import load_split

    out = []
    for p in load_split(source.split):
        prompt = f"{p.question} {instruction}" if source.instruction else p.question
        out.append({"uid": p.uid, "problem": p.question, "prompt": prompt, "answer": p.answer,
                    "source": source.name, "level": p.level, "solution": p.solution})
    return out

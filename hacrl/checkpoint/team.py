"""A team's checkpoints: written atomically, verified before use, never unpickled blindly.

Layout of `<run dir>/team-<i>/ckpt/`:
    step_<t>/<agent>/...        what each engine saves (HF model, optimizer, verl shards)
    step_<t>/loop.json          the loop's state (capability history, RNG states) as tagged JSON
    step_<t>/COMPLETE           JSON: {"format", "step", "files": {relative path: [bytes, sha256]}}
    .tmp_step_<t>/              a checkpoint being written (ignored, removed by the next save)
and next to it `team-<i>/DONE.json`, the record of a finished team (`read_done`).

Why this shape:
- A checkpoint is written into a temporary folder and renamed into place only after COMPLETE
  (with the size and hash of every file) is written, so a kill while saving leaves the previous
  checkpoint as the latest. The `KEEP` newest checkpoints are kept, so a latest checkpoint
  damaged after it was written (a truncated file, a bad disk) falls back to the one before.
- Nothing from disk is unpickled by hacrl, and pickles other code loads (verl's
  `torch.load(weights_only=False)` of its shards) are audited first against an allow-list
  (`hacrl.checkpoint.pickle_audit`): `verify` audits every file of a step folder that is or looks like a
  pickle, so a planted file is refused before any loader reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hacrl.checkpoint.pickle_audit import PICKLED, audit_pickle, looks_pickled
from hacrl.core.errors import CheckpointError
from hacrl.core.fileio import sha256_file

FORMAT = 2
KEEP = 2  # the latest checkpoint and the one before it (the fallback)
HASH_LIMIT = 256 * 2**20  # bytes: files above are checked by size only (see `_digest`)
STATE_FILE = "loop.json"
MARK = "COMPLETE"

# -- the loop's state as JSON -------------------------------------------------------------------


def encode_state(value: Any) -> Any:
    """A state dict of tensors, arrays, tuples and plain values -> JSON-safe values (tagged)."""
    if isinstance(value, torch.Tensor):
        return {"__tensor__": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape), "data": value.detach().cpu().flatten().tolist()}
    if isinstance(value, np.ndarray):
        return {"__ndarray__": value.dtype.str, "shape": list(value.shape),
                "data": value.flatten().tolist()}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {"__tuple__": [encode_state(v) for v in value]}
    if isinstance(value, list):
        return [encode_state(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"state keys must be strings, got {list(value)[:3]}")
        return {k: encode_state(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint's JSON state")


def decode_state(value: Any) -> Any:
    """Inverse of `encode_state`: builds tensors, arrays and tuples, nothing else."""
    if isinstance(value, list):
        return [decode_state(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        dtype = getattr(torch, str(value["__tensor__"]))
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown tensor dtype {value['__tensor__']!r}")
        return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])
    if "__ndarray__" in value:
        return np.array(value["data"], dtype=np.dtype(str(value["__ndarray__"]))).reshape(
            value["shape"])
    if "__tuple__" in value:
        return tuple(decode_state(v) for v in value["__tuple__"])
    return {k: decode_state(v) for k, v in value.items()}


def read_done(path: Path, steps: int | None = None,
              agents: list[str] | None = None) -> dict[str, Any] | None:
    """A team's DONE.json if it is whole, of this job's `steps` and team `agents` (when given),
    and of its schema (`done_problem`); else None, with one warning line naming the file and
    what is wrong: the team then counts as not finished and is trained (or evaluated) again.
    Its scores are never the job's results: those are read from the agent runs' evaluations."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        problem = done_problem(record, steps, agents)
    except (OSError, ValueError) as err:
        problem = f"unreadable ({type(err).__name__})"
    if problem is not None:
        print(f"hacrl: warning: {path} is damaged or not this team's ({problem}); the team "
              "counts as not finished",
              file=sys.stderr, flush=True)
        return None
    return dict(record)


def done_problem(record: Any, steps: int | None, agents: list[str] | None) -> str | None:
    """What makes a DONE.json record unusable, or None. Schema: {"agents": [names], "steps": int,
    "final": {agent: {eval metric: finite number}}, "phases": {name: seconds >= 0}}."""
    from hacrl.schema.metric_names import parse_eval

    if not isinstance(record, dict) or set(record) - {"agents", "steps", "final", "phases"}:
        return "not a DONE record (keys agents, steps, final, phases)"
    names = record.get("agents")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        return "agents is not a list of model names"
    if agents is not None and sorted(names) != sorted(agents):
        return f"its agents {names} are not this team's {agents}"
    if isinstance(record.get("steps"), bool) or not isinstance(record.get("steps"), int):
        return "steps is not an integer"
    if steps is not None and record["steps"] != steps:
        return f"it is for {record['steps']} steps, this job trains {steps}"
    final = record.get("final")
    if not isinstance(final, dict) or set(final) - set(names):
        return "final names models that are not its agents"
    for model, metrics in final.items():
        if not isinstance(metrics, dict) or not all(
                parse_eval(str(k)) is not None and _finite(v) for k, v in metrics.items()):
            return f"final[{model}] is not a mapping of evaluation metrics to numbers"
    phases = record.get("phases", {})
    if not isinstance(phases, dict) or not all(_finite(v) and v >= 0 for v in phases.values()):
        return "phases is not a mapping of names to seconds"
    return None


def _finite(value: Any) -> bool:
    import math

    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def damaged_weights(model_dir: Path) -> str | None:
    """Why a Hugging Face model folder cannot be loaded (config.json unreadable, a safetensors
    file shorter than its header says), or None. Reads headers only: fast at any model size."""
    try:
        json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        return f"{model_dir / 'config.json'} is unreadable ({type(err).__name__})"
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with path.open("rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                if header_len <= 0 or 8 + header_len > size:
                    raise ValueError
                header = json.loads(f.read(header_len))
            end = max((int(v["data_offsets"][1]) for k, v in header.items()
                       if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            return f"{path} has no valid safetensors header (truncated or not safetensors)"
        if size < 8 + header_len + end:
            return f"{path} is truncated ({size} of {8 + header_len + end} bytes)"
    return None


# -- writing --------------------------------------------------------------------------------------


def _digest(path: Path) -> str | None:
    """sha256 of files up to HASH_LIMIT; larger ones (paper-scale shards, many GB) are
    recorded by size only: hashing them would cost minutes per save and per resume, and their
    loaders read only tensors (safetensors) or audited pickles, so a hash would only catch bit
    rot, while the size catches the truncation that kills and full disks cause."""
    return sha256_file(path) if path.stat().st_size <= HASH_LIMIT else None


def _files(folder: Path) -> list[Path]:
    # links (verl's `model` -> `verl/huggingface`) point at files listed under their own name
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()
                  and p.name != MARK)


def _out_of_space(folder: Path, err: BaseException) -> bool:
    """Whether a failed write was a full disk (ENOSPC, a quota, or a disk that has less free
    than a checkpoint's first file needs: torch reports it only as a bad zip position)."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return True
    if "No space left on device" in str(err) or "os error 28" in str(err):
        return True
    try:
        return shutil.disk_usage(folder).free < 1024 * 1024  # under 1 MiB left
    except OSError:
        return False


def step_dir(ckpt_root: Path, step: int) -> Path:
    return ckpt_root / f"step_{step:06d}"


def save(ckpt_root: Path, step: int, save_agents: Callable[[Path], None],
         state: dict[str, Any]) -> Path:
    """Write step `step`: agents (by `save_agents(folder)`), the loop state, then COMPLETE with
    each file's size and hash; rename into place; keep the `KEEP` newest complete ones."""
    final = step_dir(ckpt_root, step)
    tmp = ckpt_root / f".tmp_{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        save_agents(tmp)
        (tmp / STATE_FILE).write_text(json.dumps(encode_state(state)))
        files = {str(p.relative_to(tmp)): [p.stat().st_size, _digest(p)] for p in _files(tmp)}
        (tmp / MARK).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}))
    except Exception as err:  # torch, safetensors and json each say a full disk their own way
        shutil.rmtree(tmp, ignore_errors=True)  # the older checkpoints stay whole
        if not _out_of_space(ckpt_root, err):
            raise
        raise CheckpointError(f"cannot write the checkpoint of step {step} into {ckpt_root}: "
                              "its disk is full; free space there, then rerun the same command: "
                              "the job resumes from its newest whole checkpoint") from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for _, old in complete(ckpt_root)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


# -- reading --------------------------------------------------------------------------------------


def agent_weights(folder: Path, agent: str) -> Path:
    """An agent's HF weights in a step folder: engines save an agent into `<agent>/`, its
    weights in `model/` next to its optimizer state."""
    return folder / agent / "model"


def has_record(folder: Path) -> bool:
    """The step folder's COMPLETE holds this hacrl's record (sizes and hashes), not an older
    hacrl's bare step number."""
    return (folder / MARK).read_text().lstrip().startswith("{")


def complete(ckpt_root: Path) -> list[tuple[int, Path]]:
    """Checkpoints marked complete, newest first (not yet verified)."""
    found = []
    for path in ckpt_root.glob("step_*"):
        step = path.name.removeprefix("step_")
        if step.isdigit() and (path / MARK).is_file():
            found.append((int(step), path))
    return sorted(found, reverse=True)


def verify(folder: Path) -> None:
    """Raise CheckpointError naming the first file that is missing, short or changed."""
    try:
        mark = json.loads((folder / MARK).read_text())
        files = dict(mark["files"])
        if mark.get("format") != FORMAT:
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{folder / MARK} is not a hacrl checkpoint record of format "
                              f"{FORMAT} (written by an older hacrl, or damaged)") from err
    if mark.get("step") != int(folder.name.removeprefix("step_")):
        raise CheckpointError(f"{folder / MARK} records step {mark.get('step')!r}, not the "
                              f"folder's {folder.name} (moved or edited)")
    _check_links(folder)  # first: the checks below would follow a link
    for name, (size, digest) in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        if path.stat().st_size != size:
            raise CheckpointError(f"{path} has {path.stat().st_size} bytes, {size} were written")
        if digest is not None and sha256_file(path) != digest:
            raise CheckpointError(f"{path} changed since it was written (sha256 differs)")
    for path in _files(folder):
        if str(path.relative_to(folder)) not in files:
            raise CheckpointError(f"{path} was not part of the checkpoint when it was written")
        if path.suffix.lower() in PICKLED or looks_pickled(path):
            audit_pickle(path)


def _check_links(folder: Path) -> None:
    """Links may only point inside the checkpoint (verl's `model` -> `verl/huggingface`): a
    link out of it would let a loader read a file the record does not cover."""
    inside = folder.resolve()
    for directory, subdirs, names in os.walk(folder):
        for name in [*subdirs, *names]:
            path = Path(directory) / name
            if path.is_symlink() and not path.resolve().is_relative_to(inside):
                raise CheckpointError(f"{path} links outside the checkpoint (to "
                                      f"{path.resolve()}); it was not loaded")


def check_team(folder: Path, agents: list[str]) -> None:
    """The checkpoint holds exactly these agents' folders (CheckpointError otherwise): one of
    another team (copied in, or of an edited config) is never loaded into this one."""
    found = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if found != sorted(agents):
        raise CheckpointError(f"{folder} holds the agents {found}, not this team's "
                              f"{sorted(agents)}")


def load_state(folder: Path) -> dict[str, Any]:
    try:
        state = decode_state(json.loads((folder / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
        raise CheckpointError(f"{folder / STATE_FILE} is unreadable ({type(err).__name__})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{folder / STATE_FILE} does not hold a state dict")
    return state


def restore(ckpt_root: Path, load: Callable[[Path], None]) -> tuple[int, Path] | None:
    """Load the newest usable checkpoint with `load(folder)`; None if there is none at all.

    A checkpoint that does not verify (or whose files a loader refuses: CheckpointError) falls
    back to the previous one with a warning; when none is usable, one CheckpointError names
    each bad file and says how to start over. Any other error of a loader (out of memory, a
    lost worker, I/O) is not the checkpoint's fault: it propagates, and nothing is skipped."""
    problems = []
    for step, folder in complete(ckpt_root):
        try:
            verify(folder)
            load(folder)
        except CheckpointError as err:
            problems.append(str(err))
        else:
            for problem in problems:
                print(f"hacrl: warning: checkpoint skipped: {problem}; resuming from step {step}",
                      file=sys.stderr, flush=True)
            return step, folder
    if problems:
        older = any("older hacrl" in p for p in problems)
        raise CheckpointError(
            f"no usable checkpoint in {ckpt_root}: {'; '.join(problems)}; "
            + ("a checkpoint you wrote yourself with an older hacrl can be converted with "
               "`python -m hacrl.checkpoint upgrade <step folder>`, or " if older else "")
            + f"remove {ckpt_root} to train this team from the start (force=true re-trains the "
            "whole job)")
    return None


def upgrade(folder: Path) -> None:
    """Convert a checkpoint of an older hacrl (COMPLETE = step number, pickled loop.pt) to this
    format. It unpickles loop.pt without restriction: only for checkpoints you wrote yourself."""
    step = int((folder / MARK).read_text().strip())
    state = torch.load(folder / "loop.pt", map_location="cpu", weights_only=False)
    (folder / STATE_FILE).write_text(json.dumps(encode_state(state)))
    (folder / "loop.pt").unlink()
    files = {str(p.relative_to(folder)): [p.stat().st_size, _digest(p)] for p in _files(folder)}
    (folder / MARK).write_text(json.dumps({"format": FORMAT, "step": step, "files": files}))
    verify(folder)


def main() -> None:
    """`python -m hacrl.checkpoint upgrade <step folder>...`"""
    if len(sys.argv) < 3 or sys.argv[1] != "upgrade":
        sys.exit("usage: python -m hacrl.checkpoint upgrade <step folder>... (checkpoints you "
                 "wrote yourself: their loop.pt is unpickled)")
    for arg in sys.argv[2:]:
        upgrade(Path(arg))
        print(f"{arg}: upgraded to checkpoint format {FORMAT}")

"""Pickles other code loads, audited before it does: never unpickled blindly.

hacrl unpickles nothing from disk itself (its own state is JSON, `hacrl.checkpoint`), but other
code does: verl's `torch.load(weights_only=False)` of its shards, torch's optimizer state. Those
files are audited first: every global a pickle names must be on an allow-list of
tensor-rebuilding functions and plain types (`SAFE_GLOBALS`). Anyone who can write into a shared
output root could otherwise run code in every job that resumes there.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hacrl.core.errors import CheckpointError

# Globals a torch checkpoint may name: tensor/storage rebuilding, DTensor metadata (verl's FSDP
# shards), numpy arrays (RNG states) and plain containers. Anything else (os.system, eval,
# subprocess, builtins.exec, torch.hub.load, ...) makes the file refused unread.
SAFE_GLOBALS = {
    ("collections", "OrderedDict"), ("_codecs", "encode"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("numpy", "dtype"), ("numpy", "ndarray"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("torch", "Size"), ("torch", "device"), ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._utils", "_rebuild_tensor_v3"), ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"), ("torch.nn.parameter", "Parameter"),
    ("torch.distributed.tensor", "DTensor"),
    ("torch.distributed.tensor._dtensor_spec", "DTensorSpec"),
    ("torch.distributed.tensor._dtensor_spec", "TensorMeta"),
    ("torch.distributed.tensor._dtensor_spec", "ShardOrderEntry"),
    ("torch.distributed.tensor.placement_types", "Shard"),
    ("torch.distributed.tensor.placement_types", "Replicate"),
    ("torch.distributed.tensor.placement_types", "Partial"),
    ("torch.distributed.device_mesh", "DeviceMesh"),
    ("torch.distributed._mesh_layout", "_MeshLayout"),
    ("torch.distributed._mesh_layout", "_FlatLayout"),
}


def _safe_global(module: str, name: str) -> bool:
    if (module, name) in SAFE_GLOBALS:
        return True
    # torch.FloatStorage, torch.float32, ...: storage classes and dtypes, looked up by name only
    return module == "torch" and (name.endswith("Storage") or
                                  isinstance(getattr(torch, name, None), torch.dtype))


def _pickle_globals(data: bytes) -> Iterator[tuple[str, str]]:
    """(module, name) of every global the pickles in `data` refer to, read without unpickling.

    `data` may hold several pickles one after another (torch's legacy format does): all are
    read, to the last byte; bytes that are not a pickle raise ValueError. Protocol 2 (torch.save's)
    names globals inline (GLOBAL); protocol 4+ takes them from the two values pushed just before
    STACK_GLOBAL, directly or from the memo. A name that cannot be followed, an extension-registry
    code (EXT*) or an old-style INST/OBJ is reported as "?" and so refused: the audit fails closed.
    """
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        recent: list[str | None] = []  # what each opcode pushed: a string, or None
        memo: dict[int, str | None] = {}
        for op, arg, _ in pickletools.genops(stream):
            if op.name == "GLOBAL":
                module, _, name = str(arg).partition(" ")
                yield module, name
            elif op.name == "STACK_GLOBAL":
                pair = recent[-2:]
                yield (pair[0] or "?", pair[1] or "?") if len(pair) == 2 else ("?", "?")
            elif op.name in ("INST", "OBJ") or op.name.startswith("EXT"):
                yield "?", f"{op.name} {arg}"
            elif op.name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg or 0)] = recent[-1] if recent else None
            elif op.name in ("GET", "BINGET", "LONG_BINGET"):
                recent.append(memo.get(int(arg or 0)))
            elif "UNICODE" in op.name or op.name.endswith("STRING"):
                recent.append(str(arg))
            elif op.name not in ("FRAME", "PROTO"):
                recent.append(None)


ZIP_MAGIC = b"PK\x03\x04"
PICKLED = (".pt", ".pth", ".bin", ".pkl", ".ckpt", ".pickle")


def audit_pickle(path: Path) -> None:
    """Raise CheckpointError unless `path` is a torch zip file whose pickles name only
    `SAFE_GLOBALS`. Torch picks its reader from the first bytes, so the file must begin as a
    zip; every member that is a pickle (any case of `.pkl`) is read; other files are refused."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
        if head != ZIP_MAGIC:
            raise CheckpointError(f"{path} is not a torch zip file (legacy or foreign format); "
                                  "it was not loaded")
        with zipfile.ZipFile(path) as archive:
            blobs = [archive.read(n) for n in archive.namelist() if n.lower().endswith(".pkl")]
        if not blobs:
            raise CheckpointError(f"{path} holds no pickle a torch file has; it was not loaded")
        for blob in blobs:
            for module, name in _pickle_globals(blob):
                if not _safe_global(module, name):
                    raise CheckpointError(
                        f"{path} refers to {module}.{name}, which a checkpoint never holds; it "
                        "was not loaded (a planted or foreign file?)")
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable torch file ({err})") from err


def safe_torch_load(path: Path) -> Any:
    """torch.load restricted to tensors and plain containers (never runs pickled code)."""
    audit_pickle(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"{path} could not be loaded safely ({type(err).__name__}); "
                              "it was not used") from err


def looks_pickled(path: Path) -> bool:
    """The file begins like a torch zip or a pickle, whatever its name."""
    with path.open("rb") as f:
        head = f.read(4)
    return head == ZIP_MAGIC or head[:1] == b"\x80"  # a zip (torch) or a pickle's PROTO

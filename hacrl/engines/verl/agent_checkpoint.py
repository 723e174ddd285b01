"""One agent's verl checkpoint: verl's sharded FSDP state to resume from, the weight version,
and the Hugging Face copy evaluation reads (`model` -> `verl/huggingface`, its dtype corrected).

    <directory>/verl/...            verl's FSDP checkpoint (model, optimizer, extra, hf_model)
    <directory>/engine.json         {"version": optimizer updates so far}
    <directory>/model               link to verl/huggingface
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def save_agent(workers: Any, directory: Path, version: int) -> None:
    """verl's checkpoint of the agent's worker group at weight `version`, and the HF copy."""
    directory.mkdir(parents=True, exist_ok=True)
    workers.save_checkpoint(local_path=str((directory / "verl").resolve()),
                            global_step=version, max_ckpt_to_keep=None)
    (directory / "engine.json").write_text(json.dumps({"version": version}))
    true_dtype(directory / "verl" / "huggingface")
    link = directory / "model"  # the Hugging Face copy evaluation reads
    if not link.exists():
        os.symlink(Path("verl") / "huggingface", link)


def load_agent(workers: Any, directory: Path) -> int:
    """Load a `save_agent` checkpoint into the worker group; returns its weight version."""
    workers.load_checkpoint(local_path=str((directory / "verl").resolve()))
    return int(json.loads((directory / "engine.json").read_text())["version"])


SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def true_dtype(hf_dir: Path) -> None:
    """verl writes `dtype: bfloat16` into its Hugging Face copy's config whatever the tensors
    are (verl/utils/checkpoint/fsdp_checkpoint_manager.py:445-446 builds the model to save in
    bf16, then saves the full fp32 state dict): a reader loading with the config's dtype would
    round an fp32 run's weights to bf16. Make the config say what the tensors are."""
    import struct

    weights, config = hf_dir / "model.safetensors", hf_dir / "config.json"
    if not weights.is_file() or not config.is_file():
        return  # sharded or absent: leave verl's copy as it is
    with weights.open("rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    if len(dtypes) != 1 or next(iter(dtypes)) not in SAFETENSORS_DTYPES:
        return
    settings = json.loads(config.read_text())
    settings["dtype"] = SAFETENSORS_DTYPES[dtypes.pop()]
    config.write_text(json.dumps(settings, indent=2) + "\n")


__all__ = ["SAFETENSORS_DTYPES", "load_agent", "save_agent", "true_dtype"]

"""Peak memory of this process and its device, under the schema's metric names
(`hacrl.schema.metric_names`; `hacrl.core` measures time but names nothing, as the schema sits
on top of it)."""

from __future__ import annotations

import resource
import sys

import torch

from hacrl.schema import metric_names as M


def peak_memory_metrics(device: torch.device | None = None) -> dict[str, float]:
    """On GPU: device memory used/total from NVML (what an inference engine holds included) and
    torch's max allocated. On CPU: the process's peak resident set size (peak RSS)."""
    out: dict[str, float] = {}
    if device is not None and device.type == "cuda":
        out[M.TORCH_MAX_ALLOCATED] = torch.cuda.max_memory_allocated(device) / 2**30
        try:
            import pynvml  # from nvidia-ml-py, optional

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out[M.DEVICE_USED] = info.used / 2**30
            out[M.DEVICE_TOTAL] = info.total / 2**30
            out[M.DEVICE_USED_FRAC] = info.used / info.total
        except Exception:  # NVML absent: torch's numbers are still reported
            pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out[M.PEAK_RSS] = rss / (2**30 if sys.platform == "darwin" else 2**20)
    return out


__all__ = ["peak_memory_metrics"]

"""Wall-clock phases and peak memory, named for what they measure."""

from __future__ import annotations

import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseTimer:
    """Accumulates seconds per named phase (generate, verify, logprob, update, ...)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start

    def metrics(self, prefix: str = "time/") -> dict[str, float]:
        return {f"{prefix}{k}_s": v for k, v in self.seconds.items()}


def peak_memory_metrics(device: torch.device | None = None) -> dict[str, float]:
    """On GPU: device memory used/total from NVML (what an inference engine holds included) and
    torch's max allocated. On CPU: the process's peak resident set size (peak RSS)."""
    out: dict[str, float] = {}
    if device is not None and device.type == "cuda":
        out["memory/torch_max_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        try:
            import pynvml  # from nvidia-ml-py, optional

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out["memory/device_used_gb"] = info.used / 2**30
            out["memory/device_total_gb"] = info.total / 2**30
            out["memory/device_used_frac"] = info.used / info.total
        except Exception:  # NVML absent: torch's numbers are still reported
            pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out["memory/peak_rss_gb"] = rss / (2**30 if sys.platform == "darwin" else 2**20)
    return out

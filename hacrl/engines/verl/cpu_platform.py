"""verl on CPU: a `cpu` platform for verl's platform registry, and the few workarounds it needs.

verl 0.9.1 has no CPU platform: with no accelerator it falls back to `nvidia`
(verl/plugin/platform/platform_manager.py:114-117, "Falling back to 'nvidia'") and the first
collective fails with "Distributed package doesn't have NCCL built in". verl's own extension
hook is enough to run its FSDP2 training workers on CPU, without editing verl: a module named
in `VERL_USE_EXTERNAL_MODULES` is imported by `import verl` (verl/__init__.py:49-52) in the
driver and in every Ray worker, and `VERL_PLATFORM=cpu` selects the platform it registers
(platform_manager.py:92-95). This is that module. `environment()` is what the driver sets in
its own environment before importing verl and hands to every Ray worker (runtime_env).

What each piece answers (verl 0.9.1 file:line):
- `PlatformCPU`: device "cpu", collectives over gloo; memory, stream and accelerator-RNG calls
  are harmless stand-ins (there is no device to synchronise), the RNG is torch's CPU RNG.
- `current_device()` returns "cpu", not an index: verl moves modules to `get_device_id()`
  (utils/fsdp_utils.py:507-509 and :527, workers/engine/fsdp/transformer_impl.py:935, 1028,
  1052, 1074, 1552), and an index would mean "accelerator 0" ("Cannot access accelerator device").
- `VERL_ENGINE_DEVICE=cuda`: the FSDP engines are registered for cuda/npu only
  (transformer_impl.py:1143, "No engine registered for device='cpu'"); the override hands out
  the same FSDP engine class (workers/engine/base.py:405-406).
- The process group: verl asks for "cpu:gloo,<device>:<backend>" (utils/distributed.py:89),
  which is "cpu:gloo,cpu:gloo" here ("Duplicate device type cpu in backend string").
  `hacrl.engines.verl.workers` starts a plain gloo group first (`init_process_group`); verl then
  finds it initialised and keeps it (utils/distributed.py:92).
- Pinned memory: the reference model (forward only) gets `CPUOffloadPolicy(pin_memory=True)`
  (transformer_impl.py:462-465); pinning needs an accelerator. `_unpinned_offload` makes that
  policy unpinned on this platform (offloading to the CPU one is already on is a no-op).
- FSDP1 (`strategy=fsdp`) fails in utils/fsdp_utils.py:229 ("Invalid device string
  'cpu:cpu'"); the config layer uses FSDP2 on CPU.
"""

from __future__ import annotations

import os
import resource
import sys
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

MODULE = __name__
# what the driver and every Ray worker need before `import verl`
ENV = {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}


def environment(extra_modules: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment variables of verl-on-CPU (driver and workers): this module imported by
    `import verl`, the cpu platform selected, the FSDP engine handed out."""
    modules = [MODULE, *extra_modules]
    return {**ENV, "VERL_USE_EXTERNAL_MODULES": ",".join(dict.fromkeys(modules))}


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class _Stream:
    """verl waits on and switches streams; on CPU every op is already complete."""

    def synchronize(self) -> None:
        return None

    def wait_stream(self, other: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return _Event()

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Event:
    def record(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


def _device_module() -> ModuleType:
    """What verl calls through `get_torch_device()` (a `torch.cuda` look-alike for the CPU).

    Memory figures are the process's resident memory: the only memory a CPU worker has."""
    m = ModuleType("hacrl_cpu_device")
    none = lambda *a, **k: None  # noqa: E731 (stand-ins that do nothing)
    m.is_available = lambda: True  # type: ignore[attr-defined]
    m.device_count = lambda: 1  # type: ignore[attr-defined]
    m.current_device = lambda: "cpu"  # type: ignore[attr-defined]
    m.set_device = none  # type: ignore[attr-defined]
    m.synchronize = none  # type: ignore[attr-defined]
    m.empty_cache = none  # type: ignore[attr-defined]
    m.ipc_collect = none  # type: ignore[attr-defined]
    m.reset_peak_memory_stats = none  # type: ignore[attr-defined]
    m.set_per_process_memory_fraction = none  # type: ignore[attr-defined]
    m.memory_allocated = lambda *a, **k: _rss_bytes()  # type: ignore[attr-defined]
    m.memory_reserved = lambda *a, **k: _rss_bytes()  # type: ignore[attr-defined]
    m.max_memory_allocated = lambda *a, **k: _peak_rss_bytes()  # type: ignore[attr-defined]
    m.max_memory_reserved = lambda *a, **k: _peak_rss_bytes()  # type: ignore[attr-defined]

    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    m.mem_get_info = mem_get_info  # type: ignore[attr-defined]
    m.get_device_name = lambda *a, **k: "cpu"  # type: ignore[attr-defined]
    m.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[attr-defined]
    m.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[attr-defined]
    m.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[attr-defined]
    m.manual_seed_all = lambda seed: torch.manual_seed(seed)  # type: ignore[attr-defined]
    m.Stream = lambda *a, **k: _Stream()  # type: ignore[attr-defined]
    m.Event = lambda *a, **k: _Event()  # type: ignore[attr-defined]
    m.current_stream = lambda *a, **k: _Stream()  # type: ignore[attr-defined]
    m.default_stream = lambda *a, **k: _Stream()  # type: ignore[attr-defined]
    m.stream = lambda *a, **k: _Stream()  # type: ignore[attr-defined]
    return m


def init_process_group() -> None:
    """The job's gloo process group, before verl asks for its "cpu:gloo,cpu:gloo" one
    (utils/distributed.py:89). RANK / WORLD_SIZE / MASTER_* are set by verl's Ray worker."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))


def _unpinned_offload() -> None:
    """transformer_impl.py:462-465 builds `CPUOffloadPolicy(pin_memory=True)` for forward-only
    (reference) models; without an accelerator pinning fails. Same policy, unpinned."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from verl.workers.engine.fsdp import transformer_impl

    if getattr(transformer_impl, "CPUOffloadPolicy", None) is CPUOffloadPolicy:
        def unpinned(pin_memory: bool = True) -> CPUOffloadPolicy:
            return CPUOffloadPolicy(pin_memory=False)

        transformer_impl.CPUOffloadPolicy = unpinned  # type: ignore[misc, assignment]


# Long on purpose: the class subclasses verl's PlatformBase, which can only be imported here,
# inside the function (this module runs inside `import verl`, see the module docstring), and it
# is one flat list of one-line answers to verl's platform interface; split, it reads worse.
def _register() -> None:
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """The CPU as verl's accelerator: gloo collectives, no device memory or streams."""

        _module = _device_module()

        @property
        def device_name(self) -> str:
            return "cpu"

        @property
        def vendor_name(self) -> str:
            return "cpu"

        @property
        def device_module(self) -> ModuleType:
            return self._module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # never auto-detected: only VERL_PLATFORM=cpu selects it
            return False

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: Any) -> None:
            return None

        def synchronize(self, device_index: Any = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "HACRL_CPU_VISIBLE_DEVICES"  # nothing to hide: no variable Ray sets

        @contextmanager
        def nvtx_range(self, msg: str) -> Any:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {}  # workers take CPU bundles of their pool; nothing more to reserve

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None


def _install() -> None:
    """Register the platform; patch what must be patched once verl's FSDP engine is importable.
    Runs when verl imports this module (VERL_USE_EXTERNAL_MODULES), i.e. inside `import verl`."""
    _register()
    if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
        _unpinned_offload()


_install()

__all__ = ["ENV", "environment", "init_process_group"]

"""The SLURM allocation a job runs in: its hosts, this task's node rank, its GPUs and CPUs.

`SlurmAllocation.from_env` reads SLURM's variables (pure, so the tests cover every spelling);
`expand_nodelist` expands SLURM's compressed node lists without calling `scontrol`. The Ray
cluster over these nodes is planned in `ray_plan` and started in `ray_nodes`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_NUMBER = re.compile(r"[0-9]+")


def expand_nodelist(nodelist: str) -> list[str]:
    """Hostnames of a compressed SLURM node list, as `scontrol show hostnames` prints them.

    `gpu[01-03,07],cpu5` -> gpu01 gpu02 gpu03 gpu07 cpu5. Ranges keep the lower bound's zero
    padding, and several bracket groups in one name expand to their product. Pure Python,
    because scontrol is not on every node (nor in the tests).
    """
    return [host for item in _split_items(nodelist) for host in _expand_item(item, nodelist)]


def _split_items(nodelist: str) -> list[str]:
    """Split at the commas outside brackets: `a[1,2],b` -> `a[1,2]`, `b`."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in nodelist.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"SLURM node list {nodelist!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"SLURM node list {nodelist!r}: unbalanced brackets")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str, nodelist: str) -> list[str]:
    """One name with bracket groups -> every hostname it stands for."""
    parts = _BRACKETS.split(item)   # literal, range, ...: _split_items let no stray bracket by
    choices = [[part] if i % 2 == 0 else _expand_ranges(part, nodelist)
               for i, part in enumerate(parts)]
    return ["".join(names) for names in itertools.product(*choices)]


def _expand_ranges(spec: str, nodelist: str) -> list[str]:
    """`01-03,07` -> 01 02 03 07 (the width of the lower bound is kept)."""
    out: list[str] = []
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
            raise ValueError(f"SLURM node list {nodelist!r}: cannot read the range {part!r}")
        if not dash:
            out.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"SLURM node list {nodelist!r}: the range {part!r} runs backwards")
        out.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return out


def _first(env: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` set (non-empty) in env: SLURM spells some values two ways."""
    return next((env[name] for name in names if env.get(name)), None)


def _first_int(env: Mapping[str, str], *names: str) -> int | None:
    value = _first(env, *names)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{'/'.join(names)}={value!r}: not an integer") from None


def _gpu_count(value: str | None) -> int | None:
    """GPUs in `8`, `h100:8`, `gpu:h100:8(S:0-1)` or `a100:4,v100:2` (summed); None if unknown."""
    if not value:
        return None
    total = 0
    for item in value.split(","):
        count = re.sub(r"\(.*?\)", "", item).strip().rpartition(":")[2]
        if not _NUMBER.fullmatch(count):
            return None
        total += int(count)
    return total


@dataclass(frozen=True)
class SlurmAllocation:
    """The SLURM job this process runs in, as much of it as a Ray cluster over its nodes needs."""

    job_id: str
    hosts: tuple[str, ...]           # every node of the job, in SLURM's order (rank 0 first)
    node_rank: int                   # this task's node: 0 is the Ray head
    nnodes: int
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    head_addr: str | None = None     # how to reach the head when its name does not resolve

    @property
    def head_host(self) -> str:
        return self.hosts[0]

    @property
    def head_address(self) -> str:
        """The head's host as the other nodes reach it: its NodeAddr when one was looked up
        (`with_head_address`), else its name."""
        return self.head_addr or self.head_host

    def with_head_address(self, lookup: Callable[[str], str | None]) -> SlurmAllocation:
        """This allocation with the head's address from `lookup(head_host)` (None: its name)."""
        if not self.hosts:
            return self
        return replace(self, head_addr=lookup(self.head_host))

    @classmethod
    def from_env(cls, env: Mapping[str, str],
                 expand: Callable[[str], Sequence[str]] = expand_nodelist,
                 ) -> SlurmAllocation | None:
        """Read the allocation from SLURM's variables; None outside a SLURM job.

        The job-wide spellings come first (SLURM_JOB_NODELIST, SLURM_JOB_NUM_NODES): submitit's
        srun step spans the whole job, so they agree with the step's. `expand` replaces the
        node-list expansion (tests, or a site that wants `scontrol show hostnames`).
        """
        job_id = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
        if job_id is None:
            return None
        nodelist = _first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        hosts = tuple(expand(nodelist)) if nodelist else ()
        nnodes = _first_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or len(hosts) or 1
        return cls(job_id=job_id, hosts=hosts,
                   node_rank=_first_int(env, "SLURM_NODEID", "SLURM_PROCID") or 0,
                   nnodes=nnodes,
                   gpus_per_node=_gpu_count(_first(env, "SLURM_GPUS_ON_NODE",
                                                   "SLURM_GPUS_PER_NODE")),
                   cpus_per_task=_first_int(env, "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"))


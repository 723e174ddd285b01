"""What this process does about Ray: join a running cluster, start a local one, or be the
head or a worker node of a cluster over the nodes of its SLURM allocation.

`plan` decides from engine.ray, engine.nnodes/gpus_per_node and the allocation (pure, so the
tests cover every branch) and names the fix when the job cannot get the nodes it asks for;
`plan_from_env` is the same for this process (SLURM and RAY_ADDRESS read from its environment).
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hacrl.core.errors import ConfigError
from hacrl.engines.verl.slurm_allocation import SlurmAllocation

DEFAULT_PORT = 6379
LOCAL = "local"   # connect's answer when ray.init() should start a one-node Ray in-process

Role = Literal["join", "local", "head", "worker"]


def ray_start_commands(alloc: SlurmAllocation, port: int, temp_dir: str | None = None, *,
                       num_gpus: int | None = None, num_cpus: int | None = None) -> list[str]:
    """This node's `ray start` argv: the head on the allocation's first host, else a worker.

    Both block (`--block`) so that the process running the command owns the Ray node and
    stopping it stops the node. `num_gpus` and `num_cpus` default to what SLURM gave the node
    (on CPU, the engine asks for the logical CPUs its worker pools reserve on each node).
    """
    gpus = alloc.gpus_per_node if num_gpus is None else num_gpus
    cpus = alloc.cpus_per_task if num_cpus is None else num_cpus
    argv = ["ray", "start", "--block", "--disable-usage-stats"]
    if alloc.node_rank == 0:
        argv += ["--head", f"--port={port}"]
    else:
        argv.append(f"--address={alloc.head_address}:{port}")
    if gpus is not None:
        argv.append(f"--num-gpus={gpus}")
    if cpus is not None:
        argv.append(f"--num-cpus={cpus}")
    if temp_dir:
        argv.append(f"--temp-dir={temp_dir}")
    return argv


@dataclass(frozen=True)
class Plan:
    """What this process does about Ray.

    join: connect to a running cluster at `address` (engine.ray.address or RAY_ADDRESS).
    local: start nothing; `ray.init()` starts a one-node Ray in this process (`address` "local").
    head: run `start` here (the head), wait for `nnodes` nodes, then train against `address`.
    worker: run `start` here (a worker node joining `address`) and never train.
    """

    role: Role
    address: str
    nnodes: int
    hosts: tuple[str, ...] = ()
    start: tuple[str, ...] = ()


def plan(cfg: Mapping[str, Any], nnodes: int, gpus_per_node: int,
         alloc: SlurmAllocation | None, cpus_per_node: int | None = None) -> Plan:
    """Decide this process's part from engine.ray (`cfg`), engine.nnodes/gpus_per_node and SLURM.

    Raises ConfigError when the job cannot get the nodes it asks for, naming the key and the fix.
    """
    if nnodes < 1:
        raise ConfigError(f"engine.nnodes={nnodes}: need at least 1 node")
    address = cfg.get("address")
    if address:
        _check_joinable(str(address), alloc)
        return Plan("join", str(address), nnodes)
    if nnodes == 1:
        _check_single_task(alloc)
        return Plan("local", LOCAL, 1)
    alloc = _check_allocation(nnodes, gpus_per_node, alloc)
    port = int(cfg.get("port") or DEFAULT_PORT)
    temp_dir = cfg.get("temp_dir")
    start = ray_start_commands(alloc, port, str(temp_dir) if temp_dir else None,
                               num_gpus=gpus_per_node, num_cpus=cpus_per_node)
    return Plan("head" if alloc.node_rank == 0 else "worker", f"{alloc.head_address}:{port}",
                nnodes, alloc.hosts, tuple(start))


def _check_joinable(address: str, alloc: SlurmAllocation | None) -> None:
    """Joining a running cluster trains in one task: extra SLURM nodes would each train too."""
    if alloc is not None and alloc.nnodes > 1:
        raise ConfigError(
            f"engine.ray.address={address}: joining a running Ray cluster needs one SLURM node, "
            f"but job {alloc.job_id} holds {alloc.nnodes} ({','.join(alloc.hosts)}); set "
            f"hydra.launcher.nodes=1, or drop engine.ray.address to make this job's nodes the "
            f"cluster")


def _check_single_task(alloc: SlurmAllocation | None) -> None:
    """A one-node job on node rank > 0 is a second copy that would train the same cell again."""
    if alloc is not None and alloc.node_rank > 0:
        raise ConfigError(
            f"engine.nnodes=1 but this is node {alloc.node_rank} of the {alloc.nnodes} nodes of "
            f"SLURM job {alloc.job_id}: every node would train the same job; set "
            f"hydra.launcher.nodes=1 (launcher=slurm asks for engine.nnodes nodes) or "
            f"engine.nnodes={alloc.nnodes}")


def _check_allocation(nnodes: int, gpus_per_node: int,
                      alloc: SlurmAllocation | None) -> SlurmAllocation:
    """A multi-node job needs a SLURM job of exactly that many nodes, with the GPUs asked for."""
    if alloc is None:
        raise ConfigError(
            f"engine.nnodes={nnodes}: a multi-node job runs inside a SLURM allocation of "
            f"{nnodes} nodes (launcher=slurm asks for engine.nnodes nodes; or set "
            f"hydra.launcher.nodes={nnodes}) or joins a running Ray cluster "
            f"(engine.ray.address=host:port); this process is in no SLURM job")
    if alloc.nnodes != nnodes:
        raise ConfigError(
            f"engine.nnodes={nnodes} but SLURM job {alloc.job_id} has {alloc.nnodes} node(s) "
            f"({','.join(alloc.hosts)}); set hydra.launcher.nodes={nnodes} (launcher=slurm "
            f"takes it from engine.nnodes) or engine.nnodes={alloc.nnodes}")
    if len(alloc.hosts) != alloc.nnodes or alloc.node_rank >= len(alloc.hosts):
        raise ConfigError(
            f"engine.nnodes={nnodes}: SLURM job {alloc.job_id} lists {len(alloc.hosts)} host(s) "
            f"({','.join(alloc.hosts)}) for {alloc.nnodes} node(s) and this is node "
            f"{alloc.node_rank}; run the job with one task per node (hydra.launcher."
            f"tasks_per_node=1) so SLURM_JOB_NODELIST and SLURM_NODEID describe it")
    if alloc.gpus_per_node is not None and alloc.gpus_per_node < gpus_per_node:
        raise ConfigError(
            f"engine.gpus_per_node={gpus_per_node} but SLURM gave node {alloc.node_rank} "
            f"({alloc.hosts[alloc.node_rank]}) {alloc.gpus_per_node} GPU(s); set "
            f"engine.gpus_per_node={alloc.gpus_per_node} or ask SLURM for more "
            f"(hydra.launcher.gpus_per_node)")
    return alloc


def _address_cfg(cfg: Mapping[str, Any], env: Mapping[str, str],
                 alloc: SlurmAllocation | None) -> Mapping[str, Any]:
    """engine.ray with RAY_ADDRESS as the address when the config sets none.

    Not inside a multi-node allocation: there this job's nodes are the cluster, and a
    RAY_ADDRESS inherited from the submitting shell must not redirect it.
    """
    if cfg.get("address") or not env.get("RAY_ADDRESS"):
        return cfg
    if alloc is not None and alloc.nnodes > 1:
        return cfg
    return {**cfg, "address": env["RAY_ADDRESS"]}


SCONTROL_TIMEOUT_S = 30.0   # a controller that does not answer: use the name (module constant)


def node_address(host: str, resolve: Callable[[str], str] = socket.gethostbyname,
                 run: Callable[..., Any] = subprocess.run) -> str | None:
    """How the other nodes reach SLURM node `host` when its name does not resolve: the
    NodeAddr slurm.conf gives it (`scontrol show node`: nodes named apart from their hosts, such
    as scripts/local_slurm.sh's n1 and n2 on 127.0.0.1). None: use the name (it resolves, or
    nothing better is known and the join's timeout names the host)."""
    try:
        resolve(host)
        return None
    except OSError:
        pass
    try:
        shown = run(["scontrol", "-o", "show", "node", host], capture_output=True, text=True,
                    timeout=SCONTROL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\bNodeAddr=(\S+)", shown.stdout or "")
    return found.group(1) if shown.returncode == 0 and found else None


def plan_from_env(cfg: Mapping[str, Any], nnodes: int, gpus_per_node: int,
                  env: Mapping[str, str], cpus_per_node: int | None = None) -> Plan:
    """`plan` for this process: the allocation and RAY_ADDRESS read from `env`, the head's
    address looked up when its name does not resolve."""
    alloc = SlurmAllocation.from_env(env)
    if alloc is not None and alloc.nnodes > 1:
        alloc = alloc.with_head_address(node_address)
    return plan(_address_cfg(cfg, env, alloc), nnodes, gpus_per_node, alloc, cpus_per_node)

"""The `ray start` processes of a Ray cluster over a SLURM allocation, and waiting for its nodes.

Each `ray start` runs with `--block` as a child of the process that needs it, so stopping that
child stops exactly that Ray node: `ray stop` would also end any other Ray of this user on the
machine. `start_head` starts this node's head (`shutdown` stops it, also at exit),
`serve_as_worker` is a worker node until the head goes away, `wait_for_nodes` blocks until the
cluster has every node and otherwise names the hosts that never joined.

Ray is imported inside functions only: hacrl installs and runs without it.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hacrl.core.errors import EngineError
from hacrl.engines.verl.ray_plan import Plan

# Waits, in seconds; module constants (read at call time) so tests can shorten them.
HEAD_START_S = 180.0    # `ray start --head` until its port accepts connections
NODES_WAIT_S = 600.0    # the head until every worker node has joined
HEAD_WAIT_S = 900.0     # a worker node until the head's port opens (rank 0 may start late)
HEAD_GONE_S = 60.0      # a worker node ends once the head's port has been closed this long
POLL_S = 2.0
CONNECT_TIMEOUT_S = 2.0  # one look at the head's port (a host that drops packets never answers)
STOP_S = 60.0           # a `ray start --block` child after SIGTERM, before SIGKILL

NodeInfo = Mapping[str, Any]   # one entry of ray.nodes()


class RayClusterError(RuntimeError):
    """The Ray cluster did not come up as asked; the message names what is missing."""


@dataclass
class _Head:
    process: subprocess.Popen[bytes]
    address: str


_head: _Head | None = None   # the head this process started (one per process at most)


def running_head_address() -> str | None:
    """The address of the Ray head this process started, while it runs; else None."""
    if _head is not None and _head.process.poll() is None:
        return _head.address
    return None


def _resolve(argv: Sequence[str]) -> list[str]:
    """Run the `ray` of this interpreter's environment, whatever PATH says: the same Ray as the
    training process, on every node."""
    ray_bin = Path(sys.executable).with_name("ray")
    head = str(ray_bin) if argv[0] == "ray" and ray_bin.exists() else argv[0]
    return [head, *argv[1:]]


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _wait_port(host: str, port: int, timeout_s: float,
               alive: Callable[[], bool] = lambda: True) -> bool:
    """Until host:port accepts connections (True), `timeout_s` passes or `alive()` turns False."""
    deadline = time.monotonic() + timeout_s
    while alive():
        if _port_open(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(POLL_S, 0.5))
    return False


def start_head(p: Plan) -> subprocess.Popen[bytes]:
    """Start this node's Ray head as a child process; return once its port accepts connections.

    Its output goes to this task's log. `shutdown` (also run at exit) stops it, which is what
    lets the worker nodes end.
    """
    global _head
    process = _launch(p.start)
    _head = _Head(process, p.address)
    atexit.unregister(shutdown)   # registered once, however many heads this process starts
    atexit.register(shutdown)
    host, port = _split(p.address)
    if not _wait_port(host, port, HEAD_START_S, alive=lambda: process.poll() is None):
        rc = process.poll()
        shutdown()
        raise RayClusterError(
            f"ray start --head on {host} did not open port {port} within {HEAD_START_S:.0f} s "
            f"(exit code {rc}); its output is above in this log; check that the port is free "
            f"(engine.ray.port) and engine.ray.temp_dir is writable and short")
    return process


def shutdown() -> None:
    """Stop the Ray head this process started, if any: the worker nodes then see it gone."""
    global _head
    head, _head = _head, None
    if head is not None:
        _stop(head.process)


def _launch(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Run a blocking `ray start` in a process group of its own, so `_stop` can find every
    process of that Ray node (and only those) by the group's id."""
    with children_deaf_to_usr2():
        return subprocess.Popen(_resolve(argv), start_new_session=True)


@contextmanager
def children_deaf_to_usr2() -> Iterator[None]:
    """Processes started in this block, and the ones they start, never act on SIGUSR2.

    SLURM sends USR2 to every process of a job that must make way (preemption, a time limit
    near), Ray's included, and its default action ends a process: Ray's raylets and workers
    would die before the job stops at a step's end with its checkpoint (hacrl.job.requeue).
    A blocked signal stays blocked across fork and exec; here it is blocked only while the
    children start, and one arriving meanwhile reaches this process after the block.
    """
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _stop(process: subprocess.Popen[bytes], graceful: bool = True) -> None:
    """SIGTERM a blocking `ray start` (it stops its node's Ray processes), SIGKILL if it hangs,
    then SIGKILL what is left of its process group: agents whose raylet died with the head
    gone outlive it otherwise. Not graceful: SIGKILL at once (a worker whose head is gone
    would spend half a minute trying to tell the head it leaves)."""
    if graceful and process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def serve_as_worker(p: Plan) -> int:
    """Be a Ray worker node of the head at `p.address` until the head goes away; then return.

    Waits for the head's port first (rank 0 may still be starting), runs this node's blocking
    `ray start`, and ends it once the head's port has been closed for HEAD_GONE_S: a worker
    whose raylet exits cleanly would otherwise block until the time limit. Returns the exit
    code of `ray start` (1 if the head never came); the caller returns normally, so the
    submitit task ends 0 and the head's log is where a failure shows.
    """
    host, port = _split(p.address)
    if not _wait_port(host, port, HEAD_WAIT_S):
        print(f"hacrl: no Ray head at {p.address} after {HEAD_WAIT_S:.0f} s; this worker node "
              f"ends (the head node's log says why)", file=sys.stderr, flush=True)
        return 1
    print(f"hacrl: this node joins the Ray head at {p.address} as a worker node",
          file=sys.stderr, flush=True)
    process = _launch(p.start)
    head_gone = False
    try:
        head_gone = _serve_until_head_gone(process, host, port)
    finally:
        _stop(process, graceful=not head_gone)
    return int(process.returncode)


def _serve_until_head_gone(process: subprocess.Popen[bytes], host: str, port: int) -> bool:
    """Until the worker's `ray start` exits (False) or the head's port stays closed for
    HEAD_GONE_S (True)."""
    last_seen = time.monotonic()
    while process.poll() is None:
        if _port_open(host, port):
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen >= HEAD_GONE_S:
            return True
        time.sleep(POLL_S)
    return False


@contextmanager
def _ray_nodes(address: str) -> Iterator[Callable[[], list[NodeInfo]]]:
    """`ray.nodes` of the cluster at `address`, connected for the duration (left as found)."""
    import ray

    connected_here = not ray.is_initialized()
    if connected_here:
        ray.init(address=address, log_to_driver=False)
    try:
        yield ray.nodes
    finally:
        if connected_here:
            ray.shutdown()


def wait_for_nodes(address: str, nnodes: int, hosts: Sequence[str] = (),
                   nodes: Callable[[], Sequence[NodeInfo]] | None = None) -> None:
    """Block until the cluster at `address` has `nnodes` live nodes (NODES_WAIT_S at most).

    `nodes` replaces `ray.nodes` (tests). The timeout error names the hosts of `hosts` that
    never joined and what to check on them.
    """
    if nodes is not None:
        _poll_nodes(address, nnodes, hosts, nodes)
        return
    with _ray_nodes(address) as ray_nodes:
        _poll_nodes(address, nnodes, hosts, ray_nodes)


def _poll_nodes(address: str, nnodes: int, hosts: Sequence[str],
                nodes: Callable[[], Sequence[NodeInfo]]) -> None:
    deadline = time.monotonic() + NODES_WAIT_S
    while True:
        alive = [node for node in nodes() if node.get("Alive")]
        if len(alive) >= nnodes:
            return
        if time.monotonic() >= deadline:
            raise RayClusterError(_missing_message(address, nnodes, hosts, alive))
        time.sleep(POLL_S)


def _ip(host: str) -> str | None:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def missing_hosts(hosts: Sequence[str], alive: Sequence[NodeInfo],
                  resolve: Callable[[str], str | None] = _ip) -> list[str]:
    """The hosts with no live Ray node: matched by short hostname or by IP address."""
    seen: set[str] = set()
    for node in alive:
        if name := node.get("NodeManagerHostname"):
            seen.add(str(name).split(".")[0])
        if address := node.get("NodeManagerAddress"):
            seen.add(str(address))
    return [host for host in hosts
            if host.split(".")[0] not in seen and resolve(host) not in seen]


# What torch.distributed's backends say on the surviving ranks when a peer's process is gone
# (gloo on CPU, NCCL on GPUs): the survivors fail before Ray has noticed the dead node.
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing",
             "NCCL communicator was aborted", "remote process exited")


def _one_line(text: str, limit: int = 240) -> str:
    flat = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", text).split())
    return f"{flat[:limit]}{'...' if len(flat) > limit else ''}"


def lost_ray_worker(err: BaseException) -> str | None:
    """What Ray lost, when `err` says one of its processes or nodes died under a call, or a
    surviving worker's collective lost its peer (one line); None for any other error."""
    import ray.exceptions as rex

    lost = (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError, rex.ObjectLostError,
            rex.OwnerDiedError)
    if isinstance(err, lost):
        return f"{type(err).__name__}: {_one_line(str(err))}"
    if isinstance(err, rex.RayTaskError):
        cause = getattr(err, "cause", None) or err.__cause__
        text = str(cause) if cause is not None else str(err)
        if any(sign in text for sign in PEER_GONE):
            first = next((line for line in text.splitlines() if line.strip()), text)
            return f"a collective lost its peer: {_one_line(first)}"
    return None


def dead_vllm_engine(err: BaseException) -> str | None:
    """`err` is a vLLM server's call failing because its engine processes died (killed for
    memory, a crash): vLLM's EngineDeadError, in one line; None for any other error. (By name:
    vLLM is imported only where it runs.)"""
    import ray.exceptions as rex

    cause = (getattr(err, "cause", None) or err.__cause__) if isinstance(err, rex.RayTaskError) \
        else err
    if any(kind.__name__ == "EngineDeadError" for kind in type(cause).__mro__):
        # vLLM's message is its first argument (str() of it shows the argument tuple)
        args = getattr(cause, "args", ())
        text = args[0] if args and isinstance(args[0], str) else str(cause)
        return f"{type(cause).__name__}: {_one_line(text)}"
    return None


def worker_faults(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates an engine method: a Ray worker that died under it (a node that left a
    multi-node job, a worker killed for memory) is one EngineError naming the agent
    (`self.context.agent_name`) and what to do, not Ray's trace."""
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as err:
            if (engine := dead_vllm_engine(err)) is not None:
                raise EngineError(
                    f"{self.context.agent_name}: its vLLM rollout server's engine died during "
                    f"{method.__name__} ({engine}); the vLLM log above says why (a process "
                    f"killed for memory: lower engine.rollout.gpu_memory_utilization or the "
                    f"batch); rerun the same command: the job resumes from its newest "
                    f"checkpoint") from err
            if (what := lost_ray_worker(err)) is None:
                raise
            raise EngineError(
                f"{self.context.agent_name}: a verl worker died during {method.__name__} "
                f"({what}); on a multi-node job, a node left the Ray cluster (its SLURM task "
                f"log says why); rerun the same command: the job resumes from its newest "
                f"checkpoint") from err
    return guarded


def placement_line(actors: Sequence[Any]) -> str:
    """Which Ray node each of a worker group's actors runs on (rank order), in one line: a
    multi-node job's log shows that its pools spread over the nodes."""
    import ray

    def node_of(_actor: Any) -> str:
        return str(ray.get_runtime_context().get_node_id())

    nodes = ray.get([actor.__ray_call__.remote(node_of) for actor in actors])
    ranks = ", ".join(f"rank {rank} on node {node[:8]}" for rank, node in enumerate(nodes))
    return f"verl workers {ranks} ({len(set(nodes))} node(s))"


def _missing_message(address: str, nnodes: int, hosts: Sequence[str],
                     alive: Sequence[NodeInfo]) -> str:
    missing = missing_hosts(hosts, alive) if hosts else []
    which = ", ".join(missing) if missing else "unknown (a cluster hacrl did not start)"
    return (f"Ray cluster at {address}: {len(alive)} of {nnodes} nodes alive after "
            f"{NODES_WAIT_S:.0f} s; missing: {which}. Check each missing node's task log in the "
            f"submitit folder (its `ray start` output), that it reaches {address} (firewall, "
            f"engine.ray.port), and that it runs the same Python and Ray as the head")

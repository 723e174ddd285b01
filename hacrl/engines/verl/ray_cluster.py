"""The Ray cluster a verl job runs on: one cluster over the nodes of its SLURM allocation.

A paper-scale verl job is one submitit task per node, each holding all of its node's GPUs
(`launcher=slurm` asks SLURM for `engine.nnodes` nodes). verl places its worker groups through
Ray, so those tasks have to become one Ray cluster: node rank 0 starts the Ray head and trains;
every other rank starts a Ray worker node that joins the head, serves it until the head goes
away, and then returns without training (its submitit task ends 0).

`plan` decides what this process does (pure, so the tests cover every branch); `connect` carries
the plan out with `ray start` subprocesses and returns the address `ray.init` should use. Each
`ray start` runs with `--block` as a child of the process that needs it, so stopping that child
stops exactly that Ray node: `ray stop` would also end any other Ray of this user on the machine.

Ray is imported inside functions only: hacrl installs and runs without it.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hacrl.errors import ConfigError

DEFAULT_PORT = 6379
LOCAL = "local"   # connect's answer when ray.init() should start a one-node Ray in-process
# Waits, in seconds; module constants (read at call time) so tests can shorten them.
HEAD_START_S = 180.0    # `ray start --head` until its port accepts connections
NODES_WAIT_S = 600.0    # the head until every worker node has joined
HEAD_WAIT_S = 900.0     # a worker node until the head's port opens (rank 0 may start late)
HEAD_GONE_S = 60.0      # a worker node ends once the head's port has been closed this long
POLL_S = 2.0
STOP_S = 60.0           # a `ray start --block` child after SIGTERM, before SIGKILL

Role = Literal["join", "local", "head", "worker"]
NodeInfo = Mapping[str, Any]   # one entry of ray.nodes()


class RayClusterError(RuntimeError):
    """The Ray cluster did not come up as asked; the message names what is missing."""


class WorkerNodeFinished(Exception):
    """Raised by `connect` on a worker node after it served the head: this task must not train.

    The job's entry point catches it (or checks `plan_from_env(...).role == "worker"` first and
    calls `serve_as_worker` itself) and returns normally, so submitit records a result for the
    task and it ends 0.
    """


# -- the allocation ---------------------------------------------------------------------------

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
    parts = _BRACKETS.split(item)   # literal, range, literal, range, ..., literal
    if any("[" in lit or "]" in lit for lit in parts[0::2]):
        raise ValueError(f"SLURM node list {nodelist!r}: unbalanced brackets in {item!r}")
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

    @property
    def head_host(self) -> str:
        return self.hosts[0]

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


# -- the plan ---------------------------------------------------------------------------------

def ray_start_commands(alloc: SlurmAllocation, port: int, temp_dir: str | None = None, *,
                       num_gpus: int | None = None) -> list[str]:
    """This node's `ray start` argv: the head on the allocation's first host, else a worker.

    Both block (`--block`) so that the process running the command owns the Ray node and
    stopping it stops the node. `num_gpus` defaults to what SLURM gave the node.
    """
    gpus = alloc.gpus_per_node if num_gpus is None else num_gpus
    argv = ["ray", "start", "--block", "--disable-usage-stats"]
    if alloc.node_rank == 0:
        argv += ["--head", f"--port={port}"]
    else:
        argv.append(f"--address={alloc.head_host}:{port}")
    if gpus is not None:
        argv.append(f"--num-gpus={gpus}")
    if alloc.cpus_per_task is not None:
        argv.append(f"--num-cpus={alloc.cpus_per_task}")
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
         alloc: SlurmAllocation | None) -> Plan:
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
                               num_gpus=gpus_per_node)
    return Plan("head" if alloc.node_rank == 0 else "worker", f"{alloc.head_host}:{port}",
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


def plan_from_env(cfg: Mapping[str, Any], nnodes: int, gpus_per_node: int,
                  env: Mapping[str, str]) -> Plan:
    """`plan` for this process: the allocation and RAY_ADDRESS read from `env`."""
    alloc = SlurmAllocation.from_env(env)
    return plan(_address_cfg(cfg, env, alloc), nnodes, gpus_per_node, alloc)


# -- carrying it out --------------------------------------------------------------------------

@dataclass
class _Head:
    process: subprocess.Popen[bytes]
    address: str


_head: _Head | None = None   # the head this process started (one per process at most)


def auth_mode(env: Mapping[str, str], home: Path | None = None) -> str:
    """The Ray authentication mode every process of the job uses (RAY_AUTH_MODE).

    Ray 2.5x decides per process: a local `ray.init()` turns token auth on (and writes
    ~/.ray/auth_token), `ray start` turns it on only when a token already exists, and a client
    may end up with another mode than the cluster it joins ("InvalidAuthToken"). The job picks
    one mode for all: the user's RAY_AUTH_MODE, else token when a token is there for every node
    to read (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token on a shared home), else
    disabled.
    """
    if env.get("RAY_AUTH_MODE"):
        return str(env["RAY_AUTH_MODE"])
    path = env.get("RAY_AUTH_TOKEN_PATH") or str((home or Path.home()) / ".ray" / "auth_token")
    return "token" if env.get("RAY_AUTH_TOKEN") or Path(path).is_file() else "disabled"


def use_auth_mode(mode: str, env: MutableMapping[str, str] = os.environ) -> None:
    """Set RAY_AUTH_MODE for this process and its children. Ray caches its config when first
    used, so an already imported Ray re-reads it (what Ray itself does when it turns token
    auth on)."""
    env["RAY_AUTH_MODE"] = mode
    if env is os.environ and "ray" in sys.modules:
        import importlib

        raylet: Any = importlib.import_module("ray._raylet")
        raylet.Config.initialize("")


def connect(engine_ray_cfg: Mapping[str, Any], nnodes: int, gpus_per_node: int,
            env: MutableMapping[str, str] = os.environ) -> str:
    """Make sure the Ray cluster the job asks for exists; the address `ray.init` should use.

    "local" means: start nothing, call `ray.init()` without an address. On the head and when
    joining, RAY_ADDRESS is set in `env` (os.environ: child processes find the cluster) after
    every node is alive. On a worker node this serves the head and raises WorkerNodeFinished
    instead of returning. Calling it again in the process that started the head returns the
    same address (one engine per agent, one cluster).
    """
    if _head is not None and _head.process.poll() is None:
        env["RAY_ADDRESS"] = _head.address
        return _head.address
    p = plan_from_env(engine_ray_cfg, nnodes, gpus_per_node, env)
    if p.role in ("head", "worker"):  # `ray start` children and this driver: one auth mode
        use_auth_mode(auth_mode(env), env)
    if p.role == "worker":
        rc = serve_as_worker(p)
        raise WorkerNodeFinished(f"worker node of the Ray cluster at {p.address} done "
                                 f"(ray start exit code {rc})")
    if p.role == "local":
        return LOCAL
    if p.role == "head":
        start_head(p)
    try:
        wait_for_nodes(p.address, p.nnodes, p.hosts)
    except BaseException:
        shutdown()
        raise
    env["RAY_ADDRESS"] = p.address
    return p.address


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
        with socket.create_connection((host, port), timeout=2.0):
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
    return subprocess.Popen(_resolve(argv), start_new_session=True)


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
        seen.add(str(node.get("NodeManagerHostname", "")).split(".")[0])
        seen.add(str(node.get("NodeManagerAddress", "")))
    return [host for host in hosts
            if host.split(".")[0] not in seen and resolve(host) not in seen]


def _missing_message(address: str, nnodes: int, hosts: Sequence[str],
                     alive: Sequence[NodeInfo]) -> str:
    missing = missing_hosts(hosts, alive) if hosts else []
    which = ", ".join(missing) if missing else "unknown (a cluster hacrl did not start)"
    return (f"Ray cluster at {address}: {len(alive)} of {nnodes} nodes alive after "
            f"{NODES_WAIT_S:.0f} s; missing: {which}. Check each missing node's task log in the "
            f"submitit folder (its `ray start` output), that it reaches {address} (firewall, "
            f"engine.ray.port), and that it runs the same Python and Ray as the head")

"""The Ray cluster a verl job runs on: one cluster over the nodes of its SLURM allocation.

A paper-scale verl job is one submitit task per node, each holding all of its node's GPUs
(`launcher=slurm` asks SLURM for `engine.nnodes` nodes). verl places its worker groups through
Ray, so those tasks have to become one Ray cluster: node rank 0 starts the Ray head and trains;
every other rank starts a Ray worker node that joins the head, serves it until the head goes
away, and then returns without training (its submitit task ends 0).

`connect` is the whole of it for the engine: `ray_plan.plan` decides what this process does,
`ray_nodes` carries the plan out with `ray start` subprocesses, and `connect` returns the
address `ray.init` should use, with one Ray authentication mode for every process of the job
(`auth_mode`, `use_auth_mode`). The allocation itself is read in `slurm_allocation`.

Ray is imported inside functions only: hacrl installs and runs without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hacrl.engines.verl.ray_nodes import (
    running_head_address,
    serve_as_worker,
    shutdown,
    start_head,
    wait_for_nodes,
)
from hacrl.engines.verl.ray_plan import LOCAL, plan_from_env


class WorkerNodeFinished(Exception):
    """Raised by `connect` on a worker node after it served the head: this task must not train.

    The job's entry point catches it (or checks `plan_from_env(...).role == "worker"` first and
    calls `serve_as_worker` itself) and returns normally, so submitit records a result for the
    task and it ends 0.
    """


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
            env: MutableMapping[str, str] = os.environ, cpus_per_node: int | None = None) -> str:
    """Make sure the Ray cluster the job asks for exists; the address `ray.init` should use.

    "local" means: start nothing, call `ray.init()` without an address. On the head and when
    joining, RAY_ADDRESS is set in `env` (os.environ: child processes find the cluster) after
    every node is alive. On a worker node this serves the head and raises WorkerNodeFinished
    instead of returning. Calling it again in the process that started the head returns the
    same address (one engine per agent, one cluster).
    """
    running = running_head_address()
    if running is not None:
        env["RAY_ADDRESS"] = running
        return running
    p = plan_from_env(engine_ray_cfg, nnodes, gpus_per_node, env, cpus_per_node)
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


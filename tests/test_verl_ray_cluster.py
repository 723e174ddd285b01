"""engine=verl's Ray bootstrap in a SLURM allocation: node lists, the plan, the sbatch script.

Everything but the last test runs without Ray: `ray start` is replaced by small Python
processes (a listening socket stands in for the head's port). The last test starts a real
one-node Ray head where Ray is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from hacrl.config import CONFIG_DIR, ConfigError
from hacrl.engines.verl import ray_cluster as rc
from hacrl.engines.verl import ray_nodes as rn
from hacrl.engines.verl import ray_plan as rp
from hacrl.engines.verl.ray_plan import Plan, plan
from hacrl.engines.verl.slurm_allocation import SlurmAllocation, expand_nodelist
from hacrl.sweep.slurm import render_sbatch

pytestmark = pytest.mark.verl
CFG: dict[str, Any] = {"address": None, "port": 6379, "temp_dir": None}


def _alloc(rank: int = 0, hosts: tuple[str, ...] = ("gpu01", "gpu02"), gpus: int | None = 8,
           cpus: int | None = 64) -> SlurmAllocation:
    return SlurmAllocation("42", hosts, rank, len(hosts), gpus, cpus)


def _slurm_env(**extra: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_PER_TASK": "64"}
    return {**env, **extra}


# -- node lists ------------------------------------------------------------------------------

@pytest.mark.parametrize(("nodelist", "hosts"), [
    ("node1", ["node1"]),
    ("gpu[01-03,07],cpu5", ["gpu01", "gpu02", "gpu03", "gpu07", "cpu5"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("gpu[098-100]", ["gpu098", "gpu099", "gpu100"]),
    ("a[1-2]-b[1-2]", ["a1-b1", "a1-b2", "a2-b1", "a2-b2"]),
    ("x[3],y[1,4-5].site", ["x3", "y1.site", "y4.site", "y5.site"]),
    (" n1 , n2 ", ["n1", "n2"]),
    ("", []),
])
def test_nodelists_expand_like_scontrol(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["gpu[01-03", "gpu01]", "gpu[[1]]", "gpu[a-b]",
                                      "gpu[5-3]", "gpu[1-]"])
def test_unreadable_nodelists_raise_naming_the_list(nodelist: str) -> None:
    with pytest.raises(ValueError, match="SLURM node list"):
        expand_nodelist(nodelist)


# -- the allocation --------------------------------------------------------------------------

def test_no_slurm_job_is_no_allocation() -> None:
    assert SlurmAllocation.from_env({"PATH": "/bin"}) is None


def test_allocation_reads_the_job_wide_variables() -> None:
    alloc = SlurmAllocation.from_env(_slurm_env(SLURM_NODEID="1"))
    assert alloc == SlurmAllocation("42", ("gpu01", "gpu02"), 1, 2, 8, 64)
    assert alloc.head_host == "gpu01"


@pytest.mark.parametrize(("variables", "gpus"), [
    ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "gpu:h100:8(S:0-1)"}, 8),
    ({"SLURM_GPUS_PER_NODE": "a100:4,v100:2"}, 6),
    ({"SLURM_GPUS_PER_NODE": "h100"}, None),
    ({"SLURM_GPUS_ON_NODE": "2", "SLURM_GPUS_PER_NODE": "h100:8"}, 2),
    ({}, None),
])
def test_gpus_per_node_from_either_variable(variables: dict[str, str], gpus: int | None) -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_NODELIST": "n1", **variables}
    alloc = SlurmAllocation.from_env(env)
    assert alloc is not None and alloc.gpus_per_node == gpus


def test_allocation_falls_back_to_step_variables_and_an_expand_override() -> None:
    env = {"SLURM_JOBID": "9", "SLURM_NODELIST": "whatever", "SLURM_PROCID": "2",
           "SLURM_CPUS_ON_NODE": "16"}
    alloc = SlurmAllocation.from_env(env, expand=lambda _: ["a", "b", "c"])
    assert alloc == SlurmAllocation("9", ("a", "b", "c"), 2, 3, None, 16)


def test_a_garbled_integer_variable_names_itself() -> None:
    with pytest.raises(ValueError, match="SLURM_NODEID/SLURM_PROCID='x'"):
        SlurmAllocation.from_env(_slurm_env(SLURM_NODEID="x"))


# -- start commands --------------------------------------------------------------------------

def test_head_command_on_the_first_host() -> None:
    assert rp.ray_start_commands(_alloc(0), 6380, "/tmp/r") == [
        "ray", "start", "--block", "--disable-usage-stats", "--head", "--port=6380",
        "--num-gpus=8", "--num-cpus=64", "--temp-dir=/tmp/r"]


def test_worker_command_joins_the_head() -> None:
    argv = rp.ray_start_commands(_alloc(1, gpus=None, cpus=None), 6379, num_gpus=4)
    assert argv == ["ray", "start", "--block", "--disable-usage-stats", "--address=gpu01:6379",
                    "--num-gpus=4"]


# -- the plan: every branch ------------------------------------------------------------------

def test_an_address_joins_that_cluster() -> None:
    for alloc in (None, _alloc(0, hosts=("gpu01",))):
        assert plan({**CFG, "address": "auto"}, 2, 8, alloc) == Plan("join", "auto", 2)


def test_an_address_inside_a_multi_node_allocation_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine.ray.address=h:1.*hydra.launcher.nodes=1"):
        plan({**CFG, "address": "h:1"}, 2, 8, _alloc(0))


def test_one_node_starts_nothing() -> None:
    for alloc in (None, _alloc(0, hosts=("gpu01",))):
        assert plan(CFG, 1, 8, alloc) == Plan("local", "local", 1)


def test_one_node_job_on_a_second_node_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine.nnodes=1 but this is node 1.*engine.nnodes=2"):
        plan(CFG, 1, 8, _alloc(1))


def test_multi_node_rank_zero_is_the_head() -> None:
    p = plan({**CFG, "port": 6400, "temp_dir": "/scratch/ray"}, 2, 8, _alloc(0))
    assert (p.role, p.address, p.nnodes, p.hosts) == ("head", "gpu01:6400", 2, ("gpu01", "gpu02"))
    assert p.start == tuple(rp.ray_start_commands(_alloc(0), 6400, "/scratch/ray"))


def test_multi_node_other_ranks_are_workers() -> None:
    p = plan(CFG, 2, 4, _alloc(1))
    assert (p.role, p.address) == ("worker", "gpu01:6379")
    assert "--address=gpu01:6379" in p.start and "--num-gpus=4" in p.start
    assert plan({**CFG, "port": None}, 2, 8, _alloc(1)).address == "gpu01:6379"


def test_a_head_whose_name_does_not_resolve_is_reached_at_its_node_addr() -> None:
    """SLURM nodes named apart from their hosts (NodeName=n1 NodeAddr=127.0.0.1, as
    scripts/local_slurm.sh makes them): the workers join the head at its NodeAddr."""
    import subprocess

    def unknown(host: str) -> str:
        raise socket.gaierror(f"{host}: Name or service not known")

    def scontrol(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        assert argv == ["scontrol", "-o", "show", "node", "n1"]
        return subprocess.CompletedProcess(argv, 0, "NodeName=n1 Arch=x86_64 CoresPerSocket=1 "
                                           "NodeAddr=127.0.0.1 NodeHostName=localhost\n", "")

    assert rp.node_address("n1", unknown, scontrol) == "127.0.0.1"
    assert rp.node_address("n1", lambda host: "10.0.0.7", scontrol) is None  # it resolves
    assert rp.node_address("n1", unknown, lambda argv, **_: subprocess.CompletedProcess(
        argv, 1, "", "Node n1 not found")) is None

    def absent(argv: list[str], **_: Any) -> None:
        raise FileNotFoundError("scontrol")

    assert rp.node_address("n1", unknown, absent) is None
    alloc = SlurmAllocation("7", ("n1", "n2"), 1, 2).with_head_address(lambda host: "127.0.0.1")
    p = plan(CFG, 2, 0, alloc)
    assert (p.role, p.address, p.hosts) == ("worker", "127.0.0.1:6379", ("n1", "n2"))
    assert "--address=127.0.0.1:6379" in p.start
    assert plan(CFG, 2, 0, alloc.with_head_address(lambda host: None)).address == "n1:6379"


def test_multi_node_outside_slurm_names_engine_nnodes_and_the_fixes() -> None:
    with pytest.raises(ConfigError, match=r"^engine.nnodes=2: .*hydra.launcher.nodes=2.*"
                                          r"engine.ray.address=host:port"):
        plan(CFG, 2, 8, None)


def test_multi_node_with_the_wrong_node_count_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine.nnodes=4 but SLURM job 42 has 2 node"):
        plan(CFG, 4, 8, _alloc(0))


def test_multi_node_with_an_inconsistent_host_list_is_refused() -> None:
    alloc = SlurmAllocation("42", ("gpu01",), 0, 2, 8, 64)
    with pytest.raises(ConfigError, match="lists 1 host"):
        plan(CFG, 2, 8, alloc)


def test_multi_node_with_too_few_gpus_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"engine.gpus_per_node=8 but SLURM gave node 1 "
                                          r"\(gpu02\) 4 GPU"):
        plan(CFG, 2, 8, _alloc(1, gpus=4))


def test_zero_nodes_is_refused() -> None:
    with pytest.raises(ConfigError, match="engine.nnodes=0"):
        plan(CFG, 0, 8, None)


def test_ray_address_from_the_environment_joins_unless_the_job_is_the_cluster() -> None:
    env = {"RAY_ADDRESS": "10.0.0.1:6379"}
    assert rp.plan_from_env(CFG, 1, 8, env) == Plan("join", "10.0.0.1:6379", 1)
    # inherited from the submitting shell: this allocation's nodes are the cluster
    assert rp.plan_from_env(CFG, 2, 8, {**_slurm_env(), **env}).role == "head"
    # the config's address wins over the environment's
    assert rp.plan_from_env({**CFG, "address": "auto"}, 1, 8, env).address == "auto"


def test_plan_accepts_the_composed_engine_ray_node() -> None:
    cfg = OmegaConf.load(CONFIG_DIR / "engine" / "verl.yaml")
    assert plan(cfg.ray, 2, 8, _alloc(0)).address == f"gpu01:{cfg.ray.port}"


# -- carrying it out, with stand-ins for `ray start` -----------------------------------------

@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("HEAD_START_S", 10.0), ("NODES_WAIT_S", 0.3), ("HEAD_WAIT_S", 10.0),
                        ("HEAD_GONE_S", 0.3), ("POLL_S", 0.05), ("STOP_S", 5.0)):
        monkeypatch.setattr(rn, name, value)


@pytest.fixture
def head_port() -> Iterator[socket.socket]:
    """A listening socket on this host: the head's port, as a worker node sees it."""
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def _python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def _port(server: socket.socket) -> int:
    return int(server.getsockname()[1])


def test_worker_serves_until_the_head_port_closes(fast: None, head_port: socket.socket) -> None:
    p = Plan("worker", f"127.0.0.1:{_port(head_port)}", 2,
             start=_python("import time; time.sleep(60)"))
    closed = threading.Event()

    def close() -> None:
        head_port.close()
        closed.set()

    threading.Timer(0.3, close).start()
    # the stand-in was SIGKILLed at once because the head went away: not finished (0), not
    # asked to leave first (SIGTERM, for a head that is still there)
    assert rn.serve_as_worker(p) == -signal.SIGKILL
    assert closed.is_set()


def test_worker_returns_when_its_ray_start_ends(fast: None, head_port: socket.socket) -> None:
    p = Plan("worker", f"127.0.0.1:{_port(head_port)}", 2, start=_python("raise SystemExit(3)"))
    assert rn.serve_as_worker(p) == 3


def test_worker_without_a_head_gives_up(fast: None, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rn, "HEAD_WAIT_S", 0.2)
    server = socket.create_server(("127.0.0.1", 0))
    port = _port(server)
    server.close()
    p = Plan("worker", f"127.0.0.1:{port}", 2, start=_python("raise SystemExit(0)"))
    assert rn.serve_as_worker(p) == 1
    assert "no Ray head at" in capsys.readouterr().err


def test_connect_on_a_worker_node_serves_and_never_returns_an_address(
        fast: None, head_port: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rp, "ray_start_commands",
                        lambda *a, **k: list(_python("raise SystemExit(0)")))
    env = _slurm_env(SLURM_JOB_NODELIST="127.0.0.1,gpu02", SLURM_NODEID="1")
    with pytest.raises(rc.WorkerNodeFinished, match="exit code 0"):
        rc.connect({**CFG, "port": _port(head_port)}, 2, 8, env)
    assert "RAY_ADDRESS" not in env


_FAKE_HEAD = ("import socket, sys, time\n"
              "s = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
              "time.sleep(60)\n")


def _fake_head(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make `ray start --head` a process that listens on a free port; return the port."""
    probe = socket.create_server(("127.0.0.1", 0))
    port = _port(probe)
    probe.close()
    monkeypatch.setattr(rp, "ray_start_commands",
                        lambda *a, **k: [sys.executable, "-c", _FAKE_HEAD, str(port)])
    return port


def test_connect_on_the_head_waits_for_the_nodes_and_sets_ray_address(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _fake_head(monkeypatch)
    seen: list[tuple[str, int]] = []
    monkeypatch.setattr(rc, "wait_for_nodes", lambda address, n, hosts: seen.append((address, n)))
    env = _slurm_env(SLURM_JOB_NODELIST="127.0.0.1,gpu02")
    try:
        assert rc.connect({**CFG, "port": port}, 2, 8, env) == f"127.0.0.1:{port}"
        assert seen == [(f"127.0.0.1:{port}", 2)] and env["RAY_ADDRESS"] == f"127.0.0.1:{port}"
        # a second engine of the same job gets the same cluster, nothing started twice
        assert rc.connect({**CFG, "port": port}, 2, 8, {}) == f"127.0.0.1:{port}"
        assert len(seen) == 1
    finally:
        rn.shutdown()
    assert not rn._port_open("127.0.0.1", port)


def test_connect_stops_its_head_when_nodes_do_not_come(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _fake_head(monkeypatch)
    only_head = [{"Alive": True, "NodeManagerHostname": "head", "NodeManagerAddress": "127.0.0.1"}]
    real_wait = rc.wait_for_nodes
    monkeypatch.setattr(rc, "wait_for_nodes",
                        lambda address, n, hosts: real_wait(address, n, hosts, lambda: only_head))
    env = _slurm_env(SLURM_JOB_NODELIST="127.0.0.1,ghost[07]")
    with pytest.raises(rn.RayClusterError, match=r"1 of 2 nodes alive.*missing: ghost07\."):
        rc.connect({**CFG, "port": port}, 2, 8, env)
    assert rn._head is None and not rn._port_open("127.0.0.1", port)
    assert "RAY_ADDRESS" not in env


def test_a_head_that_dies_at_start_is_one_clear_error(fast: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    p = Plan("head", "127.0.0.1:1", 2, start=_python("raise SystemExit(5)"))
    with pytest.raises(rn.RayClusterError, match=r"did not open port 1 .*exit code 5"):
        rn.start_head(p)
    assert rn._head is None


def test_connect_local_and_misconfigured() -> None:
    env: dict[str, str] = {}
    assert rc.connect(CFG, 1, 8, env) == "local" and env == {}
    with pytest.raises(ConfigError, match="engine.nnodes=2"):
        rc.connect(CFG, 2, 8, env)


def test_missing_hosts_match_short_names_and_addresses() -> None:
    alive = [{"NodeManagerHostname": "gpu01.cluster.org", "NodeManagerAddress": "10.0.0.1"},
             {"NodeManagerHostname": "localhost", "NodeManagerAddress": "10.0.0.3"}]
    ips = {"gpu03": "10.0.0.3"}
    assert rn.missing_hosts(["gpu01", "gpu02", "gpu03"], alive, ips.get) == ["gpu02"]


# -- the sbatch script of a two-node verl job ------------------------------------------------

def test_two_node_verl_job_asks_slurm_for_two_whole_nodes(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("HACRL_VENV", "/opt/hacrl/.venv")
    monkeypatch.delenv("HACRL_SLURM_GPUS", raising=False)
    overrides = ["scale=paper", "engine=verl", "pair=size", "launcher=slurm",
                 "engine.nnodes=2", f"output_root={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        local = compose(config_name="train", overrides=["scale=paper", "engine=local",
                                                          "launcher=slurm"],
                        return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(launcher, dict)
    lines = set(render_sbatch({str(k): v for k, v in launcher.items()}, tmp_path / ".submitit" / "%j").splitlines())
    for flag in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--cpus-per-task=64"):
        assert f"#SBATCH {flag}" in lines, flag
    assert "source /opt/hacrl/.venv/bin/activate" in lines
    assert "export RAY_DEDUP_LOGS=0 RAY_USAGE_STATS_ENABLED=0 SLURM_KILL_BAD_EXIT=1" in lines
    assert any(line.startswith("srun") and "submitit.core._submit" in line for line in lines)
    # the local engine has no nnodes/gpus_per_node: one node, HACRL_SLURM_GPUS GPUs as before
    monkeypatch.setenv("HACRL_SLURM_GPUS", "4")
    assert "nnodes" not in local.engine
    assert (local.hydra.launcher.nodes, local.hydra.launcher.gpus_per_node) == (1, 4)


def test_one_auth_mode_for_the_whole_job(tmp_path: Path) -> None:
    assert rc.auth_mode({"RAY_AUTH_MODE": "disabled"}, home=tmp_path) == "disabled"
    assert rc.auth_mode({}, home=tmp_path) == "disabled"
    assert rc.auth_mode({"RAY_AUTH_TOKEN": "x"}, home=tmp_path) == "token"
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    assert rc.auth_mode({}, home=tmp_path) == "token"
    assert rc.auth_mode({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "none")}, home=tmp_path) == "disabled"


# -- a real Ray head, where Ray is installed -------------------------------------------------

@pytest.mark.slow
def test_a_real_one_node_ray_head(fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed in this environment "
                                            "(pip install -e '.[verl]'); the real head needs it")
    monkeypatch.setattr(rn, "HEAD_START_S", 60.0)
    monkeypatch.setattr(rn, "NODES_WAIT_S", 60.0)
    host = socket.gethostname()
    probe = socket.create_server(("", 0))
    port = _port(probe)
    probe.close()
    temp_dir = tempfile.mkdtemp(prefix="hr", dir="/tmp")   # Ray's socket paths: < 108 chars
    alloc = SlurmAllocation("1", (host, "ghost-node"), 0, 2, gpus_per_node=0, cpus_per_task=1)
    p = plan({"address": None, "port": port, "temp_dir": temp_dir}, 2, 0, alloc)
    assert p.role == "head" and "--num-gpus=0" in p.start and "--num-cpus=1" in p.start
    # what connect() does first: the head and this driver agree on Ray's auth mode, whatever
    # an earlier local ray.init() left in ~/.ray
    monkeypatch.setenv("RAY_AUTH_MODE", "")
    rc.use_auth_mode(rc.auth_mode({k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}))
    try:
        rn.start_head(p)
        rn.wait_for_nodes(p.address, 1, p.hosts)
        monkeypatch.setattr(rn, "NODES_WAIT_S", 0.0)
        with pytest.raises(rn.RayClusterError, match=r"1 of 2 nodes alive.*missing: ghost-node\."):
            rn.wait_for_nodes(p.address, 2, p.hosts)
        ray.init(address=p.address, log_to_driver=False)
        try:
            assert len([node for node in ray.nodes() if node["Alive"]]) == 1
        finally:
            ray.shutdown()
    finally:
        rn.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not rn._port_open(host, port)


def test_ray_processes_outlive_slurms_usr2_and_this_process_still_gets_it(fast: None) -> None:
    """SLURM signals USR2 to every process of a job that must make way: a `ray start` node
    (and what it starts) must not die of it, while the training process still stops at a
    step's end (hacrl.job.requeue): one sent to it while the nodes start arrives after."""
    import subprocess

    got: list[int] = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: got.append(signum))
    try:
        # a `ray start` stand-in that starts a child of its own, as raylets start workers
        node = rn._launch(_python("import subprocess, sys, time; subprocess.Popen([sys.executable,"
                                  " '-c', 'import time; time.sleep(60)']); time.sleep(60)"))
        with rn.children_deaf_to_usr2():
            # to this thread: a signal to the process may reach another thread of the test
            # process (one an earlier test left), which does not block it (SLURM's to the job
            # may too: the job then acts on it at once, as it would after the block)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)
            assert not got  # held while the children start
        assert got == [signal.SIGUSR2]
        threading.Event().wait(0.5)  # its child started
        import psutil

        family = [psutil.Process(node.pid), *psutil.Process(node.pid).children(recursive=True)]
        assert len(family) == 2
        for process in family:
            os.kill(process.pid, signal.SIGUSR2)
        threading.Event().wait(0.3)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)
        rn._stop(node, graceful=False)
        assert node.returncode == -signal.SIGKILL
    finally:
        signal.signal(signal.SIGUSR2, before)
    # without the block, the same stand-in dies of it: what the block is for
    plain = subprocess.Popen(_python("import time; time.sleep(60)"))
    os.kill(plain.pid, signal.SIGUSR2)
    assert plain.wait(10) == -signal.SIGUSR2


def test_each_cpu_ray_node_declares_exactly_one_nodes_share_of_the_pools() -> None:
    """On CPU the pools' bundles are logical CPUs: a node that declared more could hold the
    bundles of both nodes, and the job would not spread over its allocation."""
    from hacrl.config import compose
    from hacrl.engines.verl.job_cluster import ray_node_shape

    base = ["engine=verl", "engine.device=cpu", "engine.nnodes=2"]
    colocated = compose([*base, "engine.cpu_workers=1"])
    assert ray_node_shape(colocated, 2) == (0, 3)        # one pool, 1 worker, 3 per worker
    assert ray_node_shape(colocated, 4) == (0, 5)        # 4 agents + 1 per worker
    split = compose([*base, "engine.cpu_workers=4", "engine.placement=split"])
    assert ray_node_shape(split, 2) == (0, 2 * 2 * 3)    # a pool per agent, 2 workers each
    assert ray_node_shape(compose(["engine=verl", "engine.gpus_per_node=4"]), 2) == (4, None)
    # a worker node sizes itself for the team the head trains: a pair, or one agent alone
    from hacrl.engines.verl.job_cluster import team_size

    assert team_size(compose([*base, "pair=size", "method=hacpo"])) == 2
    assert team_size(compose([*base, "pair=size", "method=gspo"])) == 1
    start = plan(CFG, 2, 0, _alloc(1), cpus_per_node=3).start
    assert "--num-cpus=3" in start and "--num-gpus=0" in start and "--num-cpus=64" not in start


def test_a_worker_that_dies_under_a_call_is_one_engine_error_naming_the_agent() -> None:
    """A node that leaves a multi-node job kills the workers on it; the next call of the agent
    then fails with Ray's multi-line trace. The engine says it in one line, with what to do."""
    pytest.importorskip("ray")
    import ray.exceptions as rex

    from hacrl.core.errors import EngineError
    from hacrl.engines.verl.ray_nodes import worker_faults

    class Stand:
        context = type("Context", (), {"agent_name": "qwen3-4b-base"})()

        def __init__(self, err: Exception) -> None:
            self.err = err

        @worker_faults
        def train_minibatch(self) -> None:
            raise self.err

    # a surviving rank's collective whose peer is gone, as gloo says it on CPU
    peer_gone = rex.RayTaskError("compute_log_prob", "Traceback ...", RuntimeError(
        "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4533. This is "
        "typically caused by a remote worker crashing."))
    for err in (rex.ActorDiedError(), rex.NodeDiedError("node 3f2a died\nmore lines"),
                peer_gone):
        with pytest.raises(EngineError) as caught:
            Stand(err).train_minibatch()
        message = str(caught.value)
        assert message.startswith("qwen3-4b-base: a verl worker died during train_minibatch (")
        assert "\n" not in message and "rerun the same command" in message
        assert caught.value.__cause__ is err
    other_task_error = rex.RayTaskError("compute_log_prob", "Traceback ...",
                                        RuntimeError("shape mismatch"))
    with pytest.raises(rex.RayTaskError):  # a worker's own bug is not a lost worker
        Stand(other_task_error).train_minibatch()
    with pytest.raises(ValueError, match="not Ray's"):  # any other error goes through as it is
        Stand(ValueError("not Ray's")).train_minibatch()


def test_a_vllm_server_whose_engine_died_is_one_engine_error_saying_so() -> None:
    """vLLM's engine processes die under a rollout (killed for memory): the server actor lives
    and its call fails with vLLM's EngineDeadError, which Ray wraps in a RayTaskError. The
    engine says it in one line: the agent, the rollout server's engine, what to do."""
    pytest.importorskip("ray")
    import ray.exceptions as rex

    from hacrl.core.errors import EngineError
    from hacrl.engines.verl.ray_nodes import dead_vllm_engine, worker_faults

    class VLLMServerError(Exception):
        pass

    class EngineDeadError(VLLMServerError):  # vllm.v1.engine.exceptions' (by name)
        pass

    class Stand:
        context = type("Context", (), {"agent_name": "llama3.2-1b-instruct"})()

        @worker_faults
        def generate(self, err: Exception) -> None:
            raise err

    # vLLM's EngineDeadError passes its message first and the caller's after it
    died = EngineDeadError("EngineCore encountered an issue.\nSee stack trace", "more")
    for err in (rex.RayTaskError("generate", "Traceback ...", died).as_instanceof_cause(),
                rex.RayTaskError("generate", "Traceback ...", died), died):
        with pytest.raises(EngineError) as caught:
            Stand().generate(err)
        message = str(caught.value)
        assert message.startswith(
            "llama3.2-1b-instruct: its vLLM rollout server's engine died during generate "
            "(EngineDeadError: EngineCore encountered an issue. See stack trace); "), message
        assert "\n" not in message and "rerun the same command" in message
    assert dead_vllm_engine(rex.RayTaskError("generate", "...", VLLMServerError("x"))) is None
    assert dead_vllm_engine(ValueError("EngineDeadError")) is None


# -- edges the mutation run (scripts/mutation.py ray) found untested -------------------------

def test_node_list_errors_name_the_whole_list_and_single_ranges_expand() -> None:
    assert expand_nodelist("gpu[3-3]") == ["gpu3"]
    for bad in ("gpu[01-03", "x,gpu[5-3]", "a,gpu[a]"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            expand_nodelist(bad)


def test_node_count_spellings_and_a_job_without_a_node_list() -> None:
    base = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a,b,c"}
    for extra, nnodes in (({"SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "4"}, 2),
                          ({"SLURM_NNODES": "4"}, 4), ({}, 3)):
        alloc = SlurmAllocation.from_env({**base, **extra})
        assert alloc is not None and alloc.nnodes == nnodes, extra
    bare = SlurmAllocation.from_env({"SLURM_JOB_ID": "5"})
    assert bare is not None and (bare.hosts, bare.nnodes, bare.node_rank) == ((), 1, 0)


def test_plan_from_env_looks_up_the_head_of_multi_node_jobs_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[str] = []

    def lookup(host: str) -> str:
        looked.append(host)
        return "127.0.0.9"

    monkeypatch.setattr(rp, "node_address", lookup)
    one = _slurm_env(SLURM_JOB_NODELIST="n1", SLURM_JOB_NUM_NODES="1")
    assert rp.plan_from_env(CFG, 1, 8, one) == Plan("local", "local", 1) and looked == []
    # a one-node allocation takes RAY_ADDRESS from the environment: it joins that cluster
    assert rp.plan_from_env(CFG, 1, 8, {**one, "RAY_ADDRESS": "10.0.0.1:6379"}) == Plan(
        "join", "10.0.0.1:6379", 1)
    two = rp.plan_from_env(CFG, 2, 8, _slurm_env(SLURM_JOB_NODELIST="n[1-2]"), cpus_per_node=6)
    assert two.address == "127.0.0.9:6379" and looked == ["n1"]
    assert "--num-cpus=6" in two.start and not any(a.startswith("--temp-dir") for a in two.start)


def test_allocation_errors_list_the_hosts() -> None:
    with pytest.raises(ConfigError, match=r"has 2 node\(s\) \(gpu01,gpu02\)"):
        plan(CFG, 4, 8, _alloc(0))
    with pytest.raises(ConfigError, match=r"lists 2 host\(s\) \(gpu01,gpu02\) for 3 node"):
        plan(CFG, 3, 8, SlurmAllocation("42", ("gpu01", "gpu02"), 0, 3))
    with pytest.raises(ConfigError, match=r"and this is node 2;"):   # a rank past the list
        plan(CFG, 2, 8, SlurmAllocation("42", ("gpu01", "gpu02"), 2, 2))
    with pytest.raises(ConfigError, match=r"holds 2 \(gpu01,gpu02\)"):
        plan({**CFG, "address": "h:1"}, 2, 8, _alloc(0))


def _unknown(host: str) -> str:
    raise socket.gaierror(f"{host}: Name or service not known")


def test_node_address_asks_the_real_scontrol_and_gives_up_on_a_silent_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "scontrol"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    def scontrol(script: str) -> None:
        fake.write_text(f"#!/bin/sh\n{script}\n")
        fake.chmod(0o755)

    scontrol("echo 'NodeName=n1 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=host1'")
    assert rp.node_address("n1", _unknown) == "10.1.2.3"
    scontrol("echo 'NodeName=n1 NodeAddr=10.9.9.9'; exit 1")   # only a clean answer counts
    assert rp.node_address("n1", _unknown) is None
    monkeypatch.setattr(rp, "SCONTROL_TIMEOUT_S", 0.5)
    scontrol("exec sleep 60")
    assert rp.node_address("n1", _unknown) is None


def test_auth_mode_set_here_and_in_an_imported_ray(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    assert rc.auth_mode({"RAY_AUTH_MODE": "token"}, home=tmp_path) == "token"
    initialized: list[Any] = []
    raylet = types.SimpleNamespace(Config=types.SimpleNamespace(initialize=initialized.append))
    monkeypatch.setitem(sys.modules, "ray", types.ModuleType("ray"))
    monkeypatch.setitem(sys.modules, "ray._raylet", raylet)
    env: dict[str, str] = {}
    rc.use_auth_mode("token", env)       # another mapping: Ray's config is not this process's
    assert env == {"RAY_AUTH_MODE": "token"} and initialized == []
    monkeypatch.setenv("RAY_AUTH_MODE", "before")
    rc.use_auth_mode("disabled")         # this process, Ray imported: Ray re-reads its config
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and initialized == [""]
    monkeypatch.delitem(sys.modules, "ray")
    rc.use_auth_mode("token")            # Ray not imported: it reads the variable when it is
    assert os.environ["RAY_AUTH_MODE"] == "token" and initialized == [""]


def test_connect_passes_the_node_shape_and_one_auth_mode_to_the_nodes(
        fast: None, monkeypatch: pytest.MonkeyPatch, head_port: socket.socket) -> None:
    asked: list[dict[str, Any]] = []

    def start(*args: Any, **kwargs: Any) -> list[str]:
        asked.append(kwargs)
        return list(_python("raise SystemExit(0)"))

    monkeypatch.setattr(rp, "ray_start_commands", start)
    env = _slurm_env(SLURM_JOB_NODELIST="127.0.0.1,gpu02", SLURM_NODEID="1",
                     RAY_AUTH_TOKEN="secret")
    with pytest.raises(rc.WorkerNodeFinished):
        rc.connect({**CFG, "port": _port(head_port)}, 2, 0, env, cpus_per_node=6)
    assert asked[0]["num_cpus"] == 6 and env["RAY_AUTH_MODE"] == "token"
    local: dict[str, str] = {"RAY_AUTH_TOKEN": "secret"}
    assert rc.connect(CFG, 1, 8, local) == "local" and "RAY_AUTH_MODE" not in local


def test_a_second_connect_in_the_head_process_sets_ray_address_too(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    port = _fake_head(monkeypatch)
    monkeypatch.setattr(rc, "wait_for_nodes", lambda address, n, hosts: None)
    try:
        env = _slurm_env(SLURM_JOB_NODELIST="127.0.0.1,gpu02", RAY_AUTH_TOKEN="secret")
        rc.connect({**CFG, "port": port}, 2, 8, env)
        assert env["RAY_AUTH_MODE"] == "token"   # the head's `ray start` and driver: one mode
        again: dict[str, str] = {}
        rc.connect({**CFG, "port": port}, 2, 8, again)
        assert again == {"RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        rn.shutdown()


def test_one_line_strips_colours_and_marks_what_it_cut() -> None:
    assert rn._one_line("\x1b[31mred\x1b[0m  a\n b") == "red a b"
    assert rn._one_line("x" * 6, limit=5) == "xxxxx..."
    assert rn._one_line("x" * 5, limit=5) == "xxxxx"
    assert rn._one_line("y" * 241) == "y" * 240 + "..."


def test_lost_worker_lines_name_the_error_and_read_a_task_error_without_cause() -> None:
    pytest.importorskip("ray")
    import ray.exceptions as rex

    line = rn.lost_ray_worker(rex.NodeDiedError("node 3f2a died\nmore lines"))
    assert line is not None and line.startswith("NodeDiedError: ") and "3f2a died more" in line
    no_cause = rex.RayTaskError("update", "Traceback: ... Connection reset by peer ...", None)
    assert rn.lost_ray_worker(no_cause) == (
        "a collective lost its peer: Traceback: ... Connection reset by peer ...")


def test_missing_hosts_compare_short_names_of_fully_qualified_hosts() -> None:
    alive = [{"NodeManagerHostname": "gpu01", "NodeManagerAddress": "10.0.0.1"}]
    assert rn.missing_hosts(["gpu01.cluster.org", "gpu02"], alive, lambda host: None) == ["gpu02"]
    assert "missing: unknown (a cluster hacrl did not start)." in rn._missing_message(
        "h:1", 2, [], alive)
    assert "missing: gpu02, gpu03." in rn._missing_message("h:1", 3, ["gpu01", "gpu02", "gpu03"],
                                                           alive)


def test_waiting_for_nodes_returns_once_enough_are_alive_and_names_the_cluster(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rn, "NODES_WAIT_S", 5.0)
    polls: list[int] = []

    def joining() -> list[dict[str, Any]]:   # the second node joins on the third poll
        polls.append(1)
        return [{"Alive": True}, {"Alive": len(polls) >= 3}, {"Alive": False}]

    rn.wait_for_nodes("h:1", 2, (), joining)
    assert len(polls) == 3
    monkeypatch.setattr(rn, "NODES_WAIT_S", 0.2)
    with pytest.raises(rn.RayClusterError, match=r"^Ray cluster at h:1: 1 of 2 nodes alive"):
        rn.wait_for_nodes("h:1", 2, (), lambda: [{"Alive": True}])


def test_the_ray_next_to_this_python_runs_whatever_path_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert rn._resolve(["ray", "start"]) == ["ray", "start"]      # none there: PATH's
    (tmp_path / "ray").write_text("")
    assert rn._resolve(["ray", "start"]) == [str(tmp_path / "ray"), "start"]
    assert rn._resolve(["python", "ray"]) == ["python", "ray"]
    assert rn._split("fe80::1:6379") == ("fe80::1", 6379)


def test_stopping_a_ray_start_asks_first_and_kills_one_that_ignores_it(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    polite = rn._launch(_python("import time; time.sleep(60)"))
    threading.Event().wait(0.3)
    rn._stop(polite)
    assert polite.returncode == -signal.SIGTERM
    monkeypatch.setattr(rn, "STOP_S", 0.5)
    deaf = subprocess.Popen(_python("import signal, time\n"
                                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                    "print('ready', flush=True); time.sleep(60)"),
                            stdout=subprocess.PIPE, start_new_session=True)
    assert deaf.stdout is not None and deaf.stdout.readline() == b"ready\n"
    rn._stop(deaf)
    assert deaf.returncode == -signal.SIGKILL


@pytest.fixture
def head_elsewhere() -> Iterator[socket.socket]:
    """The head's port on 127.0.0.2 (another address of this host): a check that forgot the
    head's host would reach 127.0.0.1 and find it closed."""
    server = socket.create_server(("127.0.0.2", 0))
    yield server
    server.close()


def test_a_worker_node_watches_the_heads_own_host(
        fast: None, head_elsewhere: socket.socket, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    port = _port(head_elsewhere)
    address = f"127.0.0.2:{port}"
    monkeypatch.setattr(rn, "HEAD_GONE_S", 0.3)
    # ray start ends by itself while the head's port stays open: not "head gone"
    ends = rn._launch(_python("import time; time.sleep(1.0)"))
    assert rn._serve_until_head_gone(ends, "127.0.0.2", port) is False
    # a worker whose ray start ends by itself while the head stays: it ends with its exit code
    p = Plan("worker", address, 2, start=_python("import time; time.sleep(1.0)"))
    assert rn.serve_as_worker(p) == 0
    assert f"hacrl: this node joins the Ray head at {address} as a worker node" in (
        capsys.readouterr().err)
    # interrupted while serving: the node is asked to leave (SIGTERM), not killed
    def interrupted(*_: Any) -> bool:
        raise KeyboardInterrupt
    monkeypatch.setattr(rn, "_serve_until_head_gone", interrupted)
    sleeper = Plan("worker", address, 2, start=_python("import time; time.sleep(60)"))
    launched: list[Any] = []
    real_launch = rn._launch

    def launch(argv: Any) -> Any:
        launched.append(real_launch(argv))
        return launched[-1]

    monkeypatch.setattr(rn, "_launch", launch)
    with pytest.raises(KeyboardInterrupt):
        rn.serve_as_worker(sleeper)
    assert launched[0].returncode == -signal.SIGTERM


def test_a_head_gone_is_noticed_only_after_head_gone_s(fast: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    probe = socket.create_server(("127.0.0.2", 0))
    port = _port(probe)
    probe.close()
    monkeypatch.setattr(rn, "HEAD_GONE_S", 0.5)   # ten polls of POLL_S (0.05) at least
    looks: list[bool] = []
    real_port_open = rn._port_open

    def port_open(host: str, port: int) -> bool:
        looks.append(real_port_open(host, port))
        return looks[-1]

    monkeypatch.setattr(rn, "_port_open", port_open)
    node = rn._launch(_python("import time; time.sleep(60)"))
    try:
        assert rn._serve_until_head_gone(node, "127.0.0.2", port) is True
        # gone means closed at every look for HEAD_GONE_S, not at the first closed look
        assert len(looks) >= 3 and not any(looks)
    finally:
        rn._stop(node, graceful=False)


def test_a_fake_head_on_another_address_starts_and_registers_one_exit_hook(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    probe = socket.create_server(("127.0.0.2", 0))
    port = _port(probe)
    probe.close()
    code = ("import socket, sys, time\n"
            "s = socket.create_server(('127.0.0.2', int(sys.argv[1])))\n"
            "time.sleep(60)\n")
    p = Plan("head", f"127.0.0.2:{port}", 2, start=(sys.executable, "-c", code, str(port)))
    hooks: list[Any] = []
    monkeypatch.setattr(rn, "atexit", types.SimpleNamespace(
        register=hooks.append, unregister=lambda f: hooks.remove(f) if f in hooks else None))
    try:
        for _ in range(3):
            rn.start_head(p)
            rn.shutdown()
        assert hooks == [rn.shutdown]   # one hook, not one per head
    finally:
        rn.shutdown()


def test_a_head_that_dies_at_start_is_reported_when_it_dies(
        fast: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # with a long start budget, only watching the process ends the wait early
    monkeypatch.setattr(rn, "HEAD_START_S", 300.0)
    p = Plan("head", "127.0.0.1:1", 2, start=_python("raise SystemExit(5)"))
    with pytest.raises(rn.RayClusterError, match=r"exit code 5"):
        rn.start_head(p)


def test_a_port_that_never_answers_is_closed_after_connect_timeout_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A head behind a host that drops packets: each look at its port gives up in time (here a
    listener whose backlog is full, so the kernel drops further connection attempts)."""
    full = socket.socket()
    full.bind(("127.0.0.2", 0))
    full.listen(0)
    port = _port(full)
    first = socket.create_connection(("127.0.0.2", port), timeout=1.0)
    monkeypatch.setattr(rn, "CONNECT_TIMEOUT_S", 0.3)
    try:
        assert rn._port_open("127.0.0.2", port) is False
    finally:
        first.close()
        full.close()


def test_waiting_and_placement_through_rays_api(fast: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The calls into Ray itself (connect to the head, ray.nodes, the actors' node ids), with
    Ray's API stood in for: the real Ray runs them in the slow and cluster tests."""
    import types

    calls: list[tuple[Any, ...]] = []
    connected = {"now": False}
    here = {"node": ""}
    ray = types.ModuleType("ray")

    def init(address: str | None = None, log_to_driver: bool = True) -> None:
        calls.append(("init", address))
        connected["now"] = True

    def shutdown() -> None:
        calls.append(("shutdown",))
        connected["now"] = False

    ray.is_initialized = lambda: connected["now"]  # type: ignore[attr-defined]
    ray.init, ray.shutdown = init, shutdown  # type: ignore[attr-defined]
    ray.nodes = lambda: [  # type: ignore[attr-defined]
        {"Alive": True, "NodeManagerHostname": "a", "NodeManagerAddress": "10.0.0.1"},
        {"Alive": True, "NodeManagerHostname": "b", "NodeManagerAddress": "10.0.0.2"}]
    ray.get = lambda refs: list(refs)  # type: ignore[attr-defined]
    ray.get_runtime_context = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        get_node_id=lambda: here["node"])
    monkeypatch.setitem(sys.modules, "ray", ray)
    rn.wait_for_nodes("h:9", 2, ("a", "b"))
    assert calls == [("init", "h:9"), ("shutdown",)]
    monkeypatch.setattr(rn, "NODES_WAIT_S", 0.0)
    with pytest.raises(rn.RayClusterError,
                       match=r"^Ray cluster at h:9: 2 of 3 nodes alive.*missing: c\."):
        rn.wait_for_nodes("h:9", 3, ("a", "b", "c"))

    class Actor:
        def __init__(self, node: str) -> None:
            def remote(function: Any) -> Any:
                here["node"] = node      # the call runs in the actor, on its node
                return function(self)
            self.__ray_call__ = types.SimpleNamespace(remote=remote)

    line = rn.placement_line([Actor("0123456789abcdef"), Actor("fedcba9876543210"),
                              Actor("0123456789abcdef")])
    assert line == ("verl workers rank 0 on node 01234567, rank 1 on node fedcba98, "
                    "rank 2 on node 01234567 (2 node(s))")

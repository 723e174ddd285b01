"""`hacrl ui [output_root=PATH] [--uri URI] [--port N]`: the MLflow UI of a store, on 127.0.0.1.

The server is `mlflow ui` in a process group of its own, and it ends with `hacrl ui`: Ctrl-C or a
SIGTERM to `hacrl ui` stops the whole group (the server and any worker it started), and if
`hacrl ui` is killed outright the kernel sends the server SIGTERM (Linux's parent-death signal).
A UI left running would keep the port and hold the store open after its terminal is gone.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from hacrl.sweep.warm import term_with_parent

STOP_GRACE_S = 10.0  # the server's time to shut down before the group is killed


def parse_overrides(overrides: list[str]) -> dict[str, str]:
    """`output_root=PATH` as every other command takes it; anything else is a ValueError."""
    out: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or key != "output_root" or not value:
            raise ValueError(f"hacrl ui: {item!r}: the only setting is output_root=PATH "
                             "(and --uri, --port)")
        out[key] = value
    return out


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the server's group, then SIGKILL what is left after the grace period."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def view_links(store: str, base: str) -> list[str]:
    """Write the results-table views of every hacrl experiment of the store
    (`hacrl.tracking.ui_views`) and say where they open; nothing when the store has none yet."""
    from hacrl.tracking.mlflow_store import sqlite_path

    db = sqlite_path(store)
    if db is not None and not db.is_file():
        return []
    try:
        from mlflow.tracking import MlflowClient

        from hacrl.tracking.ui_views import view_url, write_group_views, write_views

        client = MlflowClient(store)
        lines = []
        for experiment in client.search_experiments():
            if not experiment.name.startswith("hacrl"):
                continue
            for name, key in write_views(client, experiment.experiment_id).items():
                what = "all jobs" if name == "jobs" else f"the jobs of sweep {name}"
                lines.append(f"  {experiment.name}, {what}: "
                             f"{view_url(base, experiment.experiment_id, key)}")
            for sweep, key in write_group_views(client, experiment.experiment_id).items():
                what = "seed groups" + ("" if sweep is None else f" of sweep {sweep}")
                lines.append(f"  {experiment.name}, {what} (AVG: mean, 95% interval low/high, "
                             f"seeds): {view_url(base, experiment.experiment_id, key)}")
        return ["views (runs named by method, pair and seed; each agent's AVG as a column; "
                "a cell's seeds nested under its seed group):", *lines] if lines else []
    except Exception as err:  # the UI still opens; the views are a convenience
        return [f"(no saved views: {type(err).__name__}: {str(err).splitlines()[0]})"]


def check_port(port: int) -> None:
    """The port is free on 127.0.0.1 (else the server fails to bind, and a link would open
    whatever else listens there): HacrlError naming it otherwise."""
    import socket

    from hacrl.core.errors import HacrlError

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as err:
            raise HacrlError(f"ui: port {port} on 127.0.0.1 is not free ({err.strerror or err}): "
                             "another process listens there; pass --port N (another port), "
                             "or stop that process") from None


def serve(uri: str | None, output_root: str, port: int) -> int:
    from hacrl.tracking.mlflow_store import check_readable, resolve_uri

    store = resolve_uri(uri, Path(output_root).resolve())
    check_readable(store)  # no store there: one line, not a new empty one served
    check_port(port)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    print(f"MLflow UI for {store} at http://127.0.0.1:{port} (Ctrl-C stops it)", file=sys.stderr)
    for line in view_links(store, f"http://127.0.0.1:{port}"):
        print(line, file=sys.stderr)
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store,
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env=env, start_new_session=True, preexec_fn=term_with_parent)
    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = proc.wait()
        # the server serves until it is stopped: one that ends by itself has failed
        print(f"hacrl: ui: the MLflow server for {store} ended by itself (exit {code}); its "
              "lines above say why", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        _stop(proc)
        return 128 + (stopping[0] if stopping else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if proc.poll() is None:
            _stop(proc)


def add_parsers(sub: Any) -> None:
    ui = sub.add_parser("ui", help="serve the MLflow UI for the store on 127.0.0.1 (stops "
                        "with Ctrl-C, SIGTERM or its parent): hacrl ui [output_root=PATH]")
    ui.add_argument("overrides", nargs="*", help="output_root=PATH (default: outputs, or "
                    "$HACRL_OUTPUTS), as for every other command")
    ui.add_argument("--outputs", default=None, help=argparse.SUPPRESS)  # the old spelling
    ui.add_argument("--uri", default=None, help="tracking URI (default: the job store)")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(command_run=lambda args, unknown: run(args))


def run(args: argparse.Namespace) -> int:
    try:
        settings = parse_overrides(args.overrides)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    output_root = settings.get("output_root") or args.outputs or os.environ.get(
        "HACRL_OUTPUTS", "outputs")
    return serve(args.uri, output_root, args.port)

"""Open a sweep's jobs in the MLflow UI in headless Chromium: the named runs (jobs, or the seed
groups they are nested under) and the method, pair, seed and AVG columns must be on the runs
page; take a screenshot.

    python scripts/check_mlflow_ui.py <output root> [--sweep table1] [--screenshot shot.png]

Starts `hacrl ui output_root=<root>` on a free port (which writes the results-table views,
`hacrl.tracking.ui_views`), opens the link it prints for the sweep, and reads the page after its scripts
ran (Chromium's --dump-dom with a virtual time budget). Needs a Chromium binary (Debian:
`apt-get install chromium`; without one it exits 2). Exits 1, its last line saying what is
missing, when a column or the run names are missing or `hacrl ui` gave no view; 0 otherwise.
"""

from __future__ import annotations

import argparse
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

BINARIES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=25000"]
COLUMNS = ("tags.`method`", "tags.`pair`", "tags.`seed`", "metrics.`avg/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_view(stderr: IO[str], sweep: str, timeout_s: float) -> str | None:
    """The link `hacrl ui` prints for `sweep`'s jobs, read from its stderr; None when its list of
    views ended without one, or nothing came for `timeout_s`. The MLflow server's own output
    follows the list on the same pipe and does not end: a thread keeps reading it (so the
    server never blocks on a full pipe) while this waits with a deadline."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    in_views = False
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:  # hacrl ui ended
            break
        found = re.search(rf"the jobs of sweep {re.escape(sweep)}: (\S+)", line)
        if found:
            return found.group(1)
        if line.startswith("views ("):
            in_views = True
        elif in_views and not line.startswith("  "):  # the list of views is over
            break
    return None


def page_problems(dom: str) -> tuple[list[str], list[str]]:
    """(what the runs page lacks, the run names it shows) from its DOM after its scripts ran."""
    problems = [f"no column {c}" for c in COLUMNS if f'col-id="{c}' not in dom]
    # job runs, or the seed groups they are nested under (`analysis.seed_groups`; collapsed)
    names = sorted(set(re.findall(r">([\w.+-]+ · [\w.+-]+ · (?:seed \d+|\d+ seeds?))<", dom)))
    if not names:
        problems.append("no run named '<method> · <pair> · seed <s>' (or '... · <n> seeds')")
    return problems, names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output_root", type=Path)
    parser.add_argument("--sweep", default="table1")
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--size", default="2600,1100", help="window size for the screenshot")
    args = parser.parse_args(argv)
    binary = next((b for b in map(shutil.which, BINARIES) if b), None)
    if binary is None:
        print("no Chromium found; install Debian's package: apt-get install chromium",
              file=sys.stderr)
        return 2
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "hacrl.cli", "ui",
                           f"output_root={args.output_root}", "--port", str(port)],
                          stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stderr is not None
        deadline = time.time() + 120
        url = find_view(ui.stderr, args.sweep, 120)
        if url is None:
            print(f"check_mlflow_ui: FAIL: hacrl ui printed no view of sweep {args.sweep}")
            return 1
        while time.time() < deadline:  # the server answers once it has started
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        # wide: the runs table renders only the columns inside the window
        dom = subprocess.run([binary, *FLAGS, "--window-size=3600,1200", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180).stdout
        problems, names = page_problems(dom)
        print(f"{url}\n  columns: {', '.join(COLUMNS)}\n  runs named on the page: "
              f"{len(names)}, e.g. {names[:3]}")
        if args.screenshot:
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([binary, *FLAGS, f"--window-size={args.size}",
                            f"--screenshot={args.screenshot.resolve()}", url],
                           capture_output=True, timeout=180)
            print(f"  screenshot: {args.screenshot} ({args.screenshot.stat().st_size} bytes)")
        if problems:
            print(f"check_mlflow_ui: FAIL: {'; '.join(problems)} (sweep {args.sweep})")
            return 1
        print(f"check_mlflow_ui: ok: every column and {len(names)} run names on the page")
        return 0
    finally:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.wait(30)
        except subprocess.TimeoutExpired:
            ui.kill()


if __name__ == "__main__":
    sys.exit(main())

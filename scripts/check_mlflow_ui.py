"""Open a sweep's jobs in the MLflow UI in headless Chromium: the named runs and the method, pair,
seed and AVG columns must be on the runs page; take a screenshot.

    python scripts/check_mlflow_ui.py <output root> [--sweep table1] [--screenshot shot.png]

Starts `hacrl ui output_root=<root>` on a free port (which writes the results-table views,
`hacrl.ui_views`), opens the link it prints for the sweep, and reads the page after its scripts
ran (Chromium's --dump-dom with a virtual time budget). Needs a Chromium binary (Debian:
`apt-get install chromium`). Exits 1 when a column or the run names are missing.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=25000"]
COLUMNS = ("tags.`method`", "tags.`pair`", "tags.`seed`", "metrics.`avg/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        url = None
        deadline = time.time() + 120
        while time.time() < deadline and url is None:
            line = ui.stderr.readline()
            if not line:
                break
            found = re.search(rf"the jobs of sweep {re.escape(args.sweep)}: (\S+)", line)
            url = found.group(1) if found else None
        if url is None:
            print(f"hacrl ui printed no view of sweep {args.sweep}", file=sys.stderr)
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
        missing = [c for c in COLUMNS if f'col-id="{c}' not in dom]
        names = sorted(set(re.findall(r">([\w.+-]+ · [\w.+-]+ · seed \d+)<", dom)))
        print(f"{url}\n  columns: {', '.join(COLUMNS)}: "
              + ("all there" if not missing else f"missing {', '.join(missing)}")
              + f"\n  runs named on the page: {len(names)}, e.g. {names[:3]}")
        if args.screenshot:
            args.screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([binary, *FLAGS, f"--window-size={args.size}",
                            f"--screenshot={args.screenshot.resolve()}", url],
                           capture_output=True, timeout=180)
            print(f"  screenshot: {args.screenshot} ({args.screenshot.stat().st_size} bytes)")
        return 0 if not missing and names else 1
    finally:
        ui.send_signal(signal.SIGTERM)
        try:
            ui.wait(30)
        except subprocess.TimeoutExpired:
            ui.kill()


if __name__ == "__main__":
    sys.exit(main())

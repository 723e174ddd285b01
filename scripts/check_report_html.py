"""Open a report's index.html in headless Chromium: every image must load; take a screenshot.

    python scripts/check_report_html.py <report folder> [--screenshot shot.png]

The page sets `data-images="<loaded>/<total>"` on <body> once loaded (see analysis/report.py);
Chromium's --dump-dom prints the DOM after the load event, so the attribute says whether every
figure rendered. Needs a Chromium binary (Debian: `apt-get install chromium`). Exits 1 when an
image did not load or the page has none.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--allow-file-access-from-files", "--virtual-time-budget=10000"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--size", default="1400,4000", help="window size for the screenshot")
    args = parser.parse_args(argv)
    page = (args.folder / "index.html").resolve()
    if not page.is_file():
        print(f"no index.html in {args.folder}; write one with `hacrl report <sweep>`",
              file=sys.stderr)
        return 2
    binary = next((b for b in map(shutil.which, BINARIES) if b), None)
    if binary is None:
        print("no Chromium found; install Debian's package: apt-get install chromium",
              file=sys.stderr)
        return 2
    dom = subprocess.run([binary, *FLAGS, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    found = re.search(r'<body[^>]*data-images="(\d+)/(\d+)"', dom)
    if not found:
        print("the page's load check did not run (no data-images on <body>)", file=sys.stderr)
        return 1
    loaded, total = map(int, found.groups())
    names = re.findall(r'<img src="([^"]+)"', dom)
    print(f"{page}: {loaded}/{total} images loaded ({', '.join(names)})")
    if args.screenshot:
        args.screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([binary, *FLAGS, f"--window-size={args.size}",
                        f"--screenshot={args.screenshot.resolve()}", page.as_uri()],
                       capture_output=True, timeout=120)
        print(f"screenshot: {args.screenshot} ({args.screenshot.stat().st_size} bytes)")
    return 0 if total > 0 and loaded == total else 1


if __name__ == "__main__":
    sys.exit(main())

"""Open a report's index.html in headless Chromium: every image must load; take a screenshot.

    python scripts/check_report_html.py <report folder> [--screenshot shot.png]

The page sets `data-images="<loaded>/<total>"` on <body> once loaded (see analysis/report.py);
Chromium's --dump-dom prints the DOM after the load event, so the attribute says whether every
figure rendered. Needs a Chromium binary (Debian: `apt-get install chromium`); without one, or
without index.html, it exits 2. Exits 1, its last line saying what failed, when an image did
not load or the page has none; 0 when every image loaded.
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


def image_problem(dom: str) -> str | None:
    """What is wrong with the page's images, from its DOM after the load event (None: every
    image loaded, and there is at least one)."""
    found = re.search(r'<body[^>]*data-images="(\d+)/(\d+)"', dom)
    if not found:
        return "the page's load check did not run (no data-images on <body>)"
    loaded, total = map(int, found.groups())
    if total == 0:
        return "the page has no image"
    if loaded != total:
        return f"{total - loaded} of {total} images did not load"
    return None


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
    names = re.findall(r'<img src="([^"]+)"', dom)
    print(f"{page}: images {', '.join(names)}")
    if args.screenshot:
        args.screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([binary, *FLAGS, f"--window-size={args.size}",
                        f"--screenshot={args.screenshot.resolve()}", page.as_uri()],
                       capture_output=True, timeout=120)
        print(f"screenshot: {args.screenshot} ({args.screenshot.stat().st_size} bytes)")
    problem = image_problem(dom)
    if problem is not None:
        print(f"check_report_html: FAIL: {problem} ({page})")
        return 1
    print(f"check_report_html: ok: all {len(names)} images loaded")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Progress lines with an ETA, for the commands that work through a list of items (the zoo
build, data preparation; the sweep's live table is `hacrl.sweep.progress`).

The ETA is the simplest one that is honest about what it knows: the time so far, scaled by
the work left over the work done, with the work of each item weighted by its expected cost
when one is known (1 each otherwise). No ETA before the first unit of work is done.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def duration(seconds: float) -> str:
    """`42 s`, `3:05`, `1:02:09`."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def log_line(text: str) -> None:
    """`[HH:MM:SS] text` on stdout, flushed: a line of a job's log (a sweep cell's log file)."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def eta_seconds(done: float, total: float, elapsed: float) -> float | None:
    """Seconds left if the remaining work goes at the pace of the work done; None before any."""
    if done <= 0 or total <= 0:
        return None
    return max(0.0, elapsed * (total - done) / done)


class ItemProgress:
    """`[name] k/N item: detail (elapsed, ETA m:ss)` lines, one per finished item, on stderr.

    `weights` (item -> expected cost) make the ETA of items of unequal cost fair."""

    def __init__(self, name: str, items: list[str], weights: dict[str, float] | None = None,
                 out: TextIO | None = None) -> None:
        self.name, self.items = name, list(items)
        self.weights = {i: float((weights or {}).get(i, 1.0)) for i in self.items}
        self.total = sum(self.weights.values())
        self.done_weight, self.done = 0.0, 0
        self.started = time.perf_counter()
        self.out = out if out is not None else sys.stderr

    def note(self, item: str, detail: str) -> None:
        """An item is underway (a line without counting it done)."""
        elapsed = time.perf_counter() - self.started
        self._print(f"[{self.name}] {item}: {detail} ({duration(elapsed)})")

    def finished(self, item: str, detail: str) -> None:
        self.done += 1
        self.done_weight += self.weights.get(item, 1.0)
        elapsed = time.perf_counter() - self.started
        left = eta_seconds(self.done_weight, self.total, elapsed)
        tail = "" if left is None or self.done == len(self.items) else f", ETA {duration(left)}"
        self._print(f"[{self.name}] {self.done}/{len(self.items)} {item}: {detail} "
                    f"({duration(elapsed)}{tail})")

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)


__all__ = ["ItemProgress", "duration", "eta_seconds", "log_line"]

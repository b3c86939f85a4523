"""Progress of a long build, for people watching it: messages, and a bar for measuring.

``progress=`` of :func:`tvm_hetero.build` takes any ``(message: str) -> None``. An object that also
has ``count(done, total, label)`` (such as :class:`Progress`) gets a bar while kernels are timed for
automatic placement: the measurer calls it as its work advances (kernels compiled, each kernel's
first timing, each timed run).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Characters of the bar.
WIDTH = 30


class Progress:
    """Messages as lines with the time since start; counts as one bar redrawn in place on a
    terminal (on anything else, at most one line per tenth of the work, so logs stay short)."""

    def __init__(self, stream: TextIO | None = None, start: float | None = None) -> None:
        self.stream = stream or sys.stdout
        self.start = time.perf_counter() if start is None else start
        self._bar_open = False
        self._last_tenth = -1

    def __call__(self, message: str) -> None:
        self._end_bar()
        print(f"  [{time.perf_counter() - self.start:6.1f}s] {message}", file=self.stream, flush=True)

    def count(self, done: int, total: int, label: str) -> None:
        """Draw ``done`` of ``total`` (clamped), ``label`` after the bar."""
        total = max(total, 1)
        done = min(max(done, 0), total)
        filled = WIDTH * done // total
        line = f"  [{time.perf_counter() - self.start:6.1f}s] [{'#' * filled}{'.' * (WIDTH - filled)}] " \
               f"{100 * done // total:3d}%  {label}"
        if self.stream.isatty():
            print("\r" + line, end="", file=self.stream, flush=True)
            self._bar_open = done < total
            if done >= total:
                print(file=self.stream, flush=True)
            return
        tenth = 10 * done // total
        if tenth != self._last_tenth:
            self._last_tenth = tenth
            print(line, file=self.stream, flush=True)
        if done >= total:
            self._last_tenth = -1

    def _end_bar(self) -> None:
        if self._bar_open:
            print(file=self.stream, flush=True)
            self._bar_open = False

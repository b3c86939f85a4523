"""Running a test's work on several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def run_at_once(work: Callable[..., Any], args: list[tuple]) -> None:
    """``work(*a)`` for each ``a`` of ``args``, each on a thread of its own, all started before any
    is joined (an error inside a thread is the caller's to record: threads do not re-raise)."""
    threads = [threading.Thread(target=work, args=a) for a in args]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

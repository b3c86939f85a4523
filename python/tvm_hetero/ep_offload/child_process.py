"""The one protocol between this package and a Python child process of its own: the vendor's
process (:mod:`.vendor_process`), the capability probe (:mod:`.capability_probe`) and the host
timing of automatic placement (:mod:`.host_timing`) all speak it.

- Spawn: a fresh interpreter (never a fork of a process with running threads; unlike
  multiprocessing's spawn it does not import the user's main script again), with this package on
  its path (:func:`child_env`).
- Request and reply are pickled; a reply is :func:`ok` ``(value)`` or :func:`error` ``(exception)``.
- Whatever goes wrong reaches the caller as :class:`ChildFailed`, its message starting with the
  *stage* (the caller's words for what the child was doing): the child's own error, its death (how
  it ended: a signal in a vendor library, an exit code), or a timeout.

:func:`run_once` is the whole exchange for a child that does one job
(``python -m MODULE WORKDIR``, the child's entry :func:`serve_once`); a long-lived child (the vendor's
process) sends its replies over a socket and reads them with :func:`unwrap`.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import last_line, with_type

#: The reply a child sends for a job done.
OK = "ok"
#: ... and for a job that raised (its value: the error's type and message).
ERROR = "error"
REQUEST_FILE, REPLY_FILE = "request.pkl", "reply.pkl"


class ChildFailed(RuntimeError):
    """A child process did not deliver: its error, its death or a timeout, named after its stage."""

    def __init__(self, stage: str, why: str, ended: str = "") -> None:
        super().__init__(f"{stage}: {why}")
        #: What the child was doing, in the caller's words.
        self.stage = stage
        #: How the child ended where it did not reply (``"signal 11, SIGSEGV"``, ``"exit code 1"``,
        #: ``"timed out after 600 s"``); empty where it replied with an error.
        self.ended = ended


def child_env() -> dict[str, str]:
    """This process's environment with this package first on ``PYTHONPATH`` (the child finds the
    package where the parent found it)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, path) if p), PYTHONUNBUFFERED="1")


def how_it_ended(code: int | None) -> str:
    """``"signal 11, SIGSEGV"`` for a process killed by a signal, else ``"exit code N"``."""
    if code is not None and code < 0:
        try:
            return f"signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def ok(value: Any) -> tuple[str, Any]:
    return (OK, value)


def error(err: BaseException) -> tuple[str, str]:
    return (ERROR, with_type(err))


def unwrap(reply: Any, stage: str) -> Any:
    """The value of a child's reply, or :class:`ChildFailed` with the child's error."""
    kind, value = reply
    if kind == ERROR:
        raise ChildFailed(stage, f"failed in the child process: {value}")
    if kind != OK:
        raise ChildFailed(stage, f"the child process replied {kind!r}, not {OK!r} or {ERROR!r}")
    return value


def run_once(module: str, request: Any, stage: str, timeout: float) -> Any:
    """Run ``python -m module WORKDIR`` (its ``__main__`` calls :func:`serve_once`) on ``request``
    and return its reply's value; :class:`ChildFailed` naming ``stage`` otherwise."""
    with tempfile.TemporaryDirectory(prefix="tvm_hetero_child_") as tmp:
        work = Path(tmp)
        (work / REQUEST_FILE).write_bytes(pickle.dumps(request))
        try:
            done = subprocess.run([sys.executable, "-m", module, str(work)], env=child_env(), capture_output=True,
                                  text=True, errors="replace", timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ChildFailed(stage, f"the child process timed out after {timeout:.0f} s",
                              f"timed out after {timeout:.0f} s") from None
        reply = work / REPLY_FILE
        if done.returncode == 0 and reply.exists():
            return unwrap(pickle.loads(reply.read_bytes()), stage)
        ended = how_it_ended(done.returncode)
        raise ChildFailed(stage, f"the child process ended ({ended}) without a reply: "
                                 f"{last_line(done.stderr, 'no output')}", ended)


def serve_once(job: Callable[[Any], Any]) -> int:
    """The child's side of :func:`run_once`: ``job(request)``, its value or its error written as
    the reply. Returns the exit code (0: a reply was written)."""
    work = Path(sys.argv[1])
    try:
        reply = ok(job(pickle.loads((work / REQUEST_FILE).read_bytes())))
    except Exception as err:  # noqa: BLE001 (any error is the reply)
        reply = error(err)
    (work / REPLY_FILE).write_bytes(pickle.dumps(reply))
    return 0

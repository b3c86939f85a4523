"""The one protocol with a child process of the package (ep_offload/child_process.py): a reply, the
child's error, its death and a timeout each reach the caller naming the stage."""

from __future__ import annotations

import pytest
from tvm_hetero.ep_offload.child_process import ChildFailed, run_once

CHILD = '''
import os, signal, time
from tvm_hetero.ep_offload.child_process import serve_once

def job(request):
    if request == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if request == "sleep":
        time.sleep(60)
    if request == "raise":
        raise ValueError("no such group")
    return {"twice": request * 2}

if __name__ == "__main__":
    raise SystemExit(serve_once(job))
'''


@pytest.fixture()
def child(tmp_path, monkeypatch) -> str:
    (tmp_path / "protocol_child.py").write_text(CHILD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "protocol_child"


def test_a_reply_comes_back(child) -> None:
    assert run_once(child, 21, "doubling", timeout=120) == {"twice": 42}


def test_the_childs_error_names_the_stage_and_the_error(child) -> None:
    with pytest.raises(ChildFailed, match=r"^doubling: failed in the child process: ValueError: no such group$") as err:
        run_once(child, "raise", "doubling", timeout=120)
    assert err.value.stage == "doubling" and err.value.ended == ""


def test_a_dead_child_says_how_it_ended(child) -> None:
    with pytest.raises(ChildFailed, match=r"^doubling: the child process ended \(signal 11, SIGSEGV\)") as err:
        run_once(child, "crash", "doubling", timeout=120)
    assert err.value.ended == "signal 11, SIGSEGV"


def test_a_child_over_its_time_is_stopped(child) -> None:
    with pytest.raises(ChildFailed, match=r"^doubling: the child process timed out after 5 s$"):
        run_once(child, "sleep", "doubling", timeout=5)


def test_a_missing_child_module_is_a_clear_error() -> None:
    with pytest.raises(ChildFailed, match=r"exit code 1\) without a reply: .*No module named"):
        run_once("tvm_hetero.no_such_child", None, "probing", timeout=60)

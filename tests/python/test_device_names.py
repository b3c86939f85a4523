"""A device is named one way everywhere (``devices.name_of``): a remote device is
``remote[<session>]:cpu:0`` in the build report, the automatic-placement explanation and the runtime's
stats alike, never TVM's own repr (``remote[0.0078125]:cpu:0``)."""

from __future__ import annotations

import re

import tvm
import tvm_hetero
from test_autoplace import PositionFake
from tvm_hetero.devices import name_of
from tvm_hetero.testing import models

MLP, PARAMS = models.mlp()


def test_a_remote_device_has_one_name_in_reports_and_stats(rpc_server):
    session = rpc_server.connect()
    remote = session.cpu(0)
    assert re.fullmatch(r"remote\[\d+\]:cpu:0", name_of(remote))
    caps = tvm_hetero.Capabilities({1: {"matmul", "add", "relu"}})
    fake = PositionFake(lambda name, d: 1e-5 if d == 1 else 1e-2)  # the remote device is far faster
    progress: list[str] = []
    art = tvm_hetero.build(MLP, [(tvm.cpu(0), "llvm"), (remote, "llvm")], placement="auto", params=PARAMS,
                           capabilities=caps, cost_cache=False, measurer=fake, progress=progress.append)
    assert any("measuring" in line for line in progress)
    shown = art.report() + "\n".join(progress)
    names = set(re.findall(r"remote\[[^\]]*\]:[a-z]+:\d+", shown))
    assert names and names <= {name_of(remote)}, names
    assert all(row.device in ("cpu:0", name_of(remote)) for row in art.build_report.autoplace.per_device)
    with art.create() as rt:
        assert rt.stats()["devices"][1] == name_of(remote)

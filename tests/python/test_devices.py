"""Device kinds have one home: the C++ records (src/support/device_kinds.cc) read through
tvm_hetero.devices, and nothing else compares a device type."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tvm
import tvm_hetero
from tvm_hetero import devices

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(tvm_hetero.__file__).resolve().parent


# (device, kind, remote, asynchronous, host memory, offsets usable, runs TVM kernels, waits for completion,
#  cost-cache key, default target)
KIND_CASES = [
    pytest.param(tvm.cpu(0), "cpu", False, False, True, True, True, False, "cpu:0", "llvm", id="host-cpu"),
    pytest.param(tvm.cpu(1), "cpu", False, False, True, True, True, False, "cpu:1", "llvm", id="cpu-cluster"),
    pytest.param(tvm.runtime.Device(1 + 128, 0), "remote", True, False, False, False, True, True, "remote:cpu:0",
                 "llvm", id="remote-rpc"),
    pytest.param(tvm.cuda(0), "cuda", False, True, False, True, True, True, "cuda:0", "cuda", id="cuda"),
    pytest.param(tvm.runtime.Device(16, 0), "qnn-htp", False, False, True, True, False, False, "qnn-htp:0", None,
                 id="qnn-htp"),
]


@pytest.mark.parametrize(
    "device,name,remote,asynchronous,host_memory,offsets,kernels,wait,key,target", KIND_CASES)
def test_each_kind_has_one_record(device, name, remote, asynchronous, host_memory, offsets, kernels, wait, key,
                                  target) -> None:
    kind = devices.kind_of(device)
    assert (kind.name, kind.remote, kind.asynchronous, kind.host_memory, kind.offsets_usable,
            kind.runs_tvm_kernels) == (name, remote, asynchronous, host_memory, offsets, kernels)
    assert devices.is_remote(device) == remote
    assert devices.needs_completion_wait(device) == wait
    assert devices.shares_memory(tvm.cpu(0), device) == (host_memory and not remote)
    assert devices.cost_key(device) == key
    assert devices.default_target(device) == target


def test_kind_names_and_specs() -> None:
    htp = devices.parse_spec("qnn-htp")
    assert devices.name_of(htp.device) == "qnn-htp:0"
    assert htp.options == {"soc_model": 60, "htp_arch": 73, "precision": "fp16"}
    assert devices.parse_spec({"kind": "qnn-htp", "soc_model": 57}).options["soc_model"] == 57
    assert devices.parse_spec("qnn-htp:1,htp_arch=75").device.index == 1
    with pytest.raises(ValueError, match="unknown option.*bogus"):
        devices.parse_spec({"kind": "qnn-htp", "bogus": 1})
    with pytest.raises(ValueError, match="unknown kind 'npu'"):
        devices.parse_spec({"kind": "npu"})
    assert devices.name_of(tvm.runtime.Device(2 + 2 * 128, 3)) == "remote[1]:cuda:3"


def test_package_is_callable_for_discovery() -> None:
    found = tvm_hetero.devices()
    assert found and devices.name_of(found[0].device) == "cpu:0"
    assert devices.kind_of(tvm.cpu(0)) is devices.kind_of(tvm.cpu(3))  # read once per type


# A comparison of a device type with anything, or TVM's RPC session mask written out.
PY_DEVICE_TYPE_COMPARISON = re.compile(r"dlpack_device_type\(\)\s*(==|!=|>=|<=|<|>|%|//)|(>=|<|%|//|\+)\s*128\b|RPC_SESS")
CPP_DEVICE_TYPE_COMPARISON = re.compile(r"device_type\s*(==|!=|>=|<=|<|>|%|/)|kRPCSessMask|(>=|<|%|/|\+)\s*128\b")


def _offending(files, pattern) -> dict[str, list[str]]:
    out = {}
    for path in files:
        hits = [line.strip() for line in path.read_text().splitlines()
                if pattern.search(line) and not line.strip().startswith(("#", "//", "*"))]
        if hits:
            out[str(path.relative_to(REPO))] = hits
    return out


def test_no_device_type_comparison_outside_devices_py() -> None:
    files = [f for f in PACKAGE.rglob("*.py") if f.name != "devices.py" and "testing" not in f.parts]
    assert len(files) > 40
    assert _offending(files, PY_DEVICE_TYPE_COMPARISON) == {}


def test_no_device_type_comparison_outside_the_cpp_support_layer() -> None:
    files = [f for f in (REPO / "src").rglob("*.cc") if "support" not in f.parts]
    files += [f for f in (REPO / "src").rglob("*.h") if "support" not in f.parts]
    files += list((REPO / "include").rglob("*.h"))
    assert len(files) > 10
    assert _offending(files, CPP_DEVICE_TYPE_COMPARISON) == {}


def test_the_scans_see_a_comparison() -> None:
    assert PY_DEVICE_TYPE_COMPARISON.search("if dev.dlpack_device_type() != 1:")
    assert PY_DEVICE_TYPE_COMPARISON.search("return kind >= 128")
    assert not PY_DEVICE_TYPE_COMPARISON.search('np.clip(q, -128, 127).astype("int8")')  # an int8 range is no mask
    assert CPP_DEVICE_TYPE_COMPARISON.search("if (dev.device_type == kDLCPU)")
    assert CPP_DEVICE_TYPE_COMPARISON.search("dev.device_type >= kRPCSessMask")

"""Adding an accelerator reached through a vendor SDK: a test-only kind (tests/python/ort_cpu_vendor)
whose "vendor" is ONNX Runtime's CPU EP goes through the generic path with capability probe,
verification, report and CLI, from its own package and one registry line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero import cli, devices
from tvm_hetero.importers import from_onnx
from tvm_hetero.testing.models import conv_relu_conv, model_inputs, onnxruntime_outputs

pytest.importorskip("onnxruntime")
HERE = Path(__file__).resolve().parent
CPU = (tvm.cpu(0), "llvm")


@pytest.fixture(scope="module", autouse=True)
def registered():
    # The vendor's modules are imported by name, also in the child processes of probes: on the path.
    sys.path.insert(0, str(HERE))
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), saved) if p)
    import ort_cpu_vendor

    devices.register_kind(ort_cpu_vendor.KIND)  # the one registry line
    yield ort_cpu_vendor.KIND
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def _run(art, inputs):
    rt = art.create()
    rt.run(**inputs)
    out = rt.get_output(0).numpy()
    stats = rt.stats()
    rt.close()
    return out, stats


def _build_and_check(device: str):
    """The model built for the host and ``device``, run, and checked against ONNX Runtime's CPU EP."""
    model = conv_relu_conv()
    inputs = model_inputs(model)
    art = tvm_hetero.build(from_onnx(model), [CPU, device], offload_min_group_flops=0)
    out, stats = _run(art, inputs)
    np.testing.assert_allclose(out, onnxruntime_outputs(model, inputs)[0], rtol=1e-4, atol=1e-4)
    return art, out, stats, inputs


def test_the_new_kind_runs_its_graph_through_the_generic_path(tmp_path, registered) -> None:
    art, out, stats, inputs = _build_and_check("ort-cpu-test")
    offload = art.build_report.offload
    assert offload.vendor == "ORT-CPU" and offload.graph_executions == stats["accelerator_graph_executions"] == 1
    assert offload.verification.regions[0].ok
    report = art.report()
    assert "accepted by ORT-CPU" in report and "placed on the TESTACC" in report and "ort-cpu-test:0" in report
    art.export(tmp_path / "a")  # its graphs travel in the artifact and open without the build
    loaded = tvm_hetero.load(tmp_path / "a")
    assert loaded.build_report.offload == offload  # the manifest's JSON form reads back to the same report
    again, _ = _run(loaded, inputs)
    np.testing.assert_array_equal(again, out)


def test_an_op_the_vendor_refuses_stays_on_the_host_with_its_reason() -> None:
    art, _out, _stats, _inputs = _build_and_check("ort-cpu-test:refuse=Relu")
    refused = {r.op: r.reason for r in art.build_report.offload.refused}
    assert "the test accelerator does not take Relu" in refused.get("relax.nn.relu", ""), refused


def test_a_vendor_that_computes_wrongly_is_caught_and_moved_back() -> None:
    art, _out, stats, _inputs = _build_and_check("ort-cpu-test:wrong=1")
    excluded = art.build_report.offload.excluded
    assert excluded and all("verification" in why for why in excluded.values()), excluded
    assert stats["accelerator_graph_executions"] == 0


def test_the_cli_reaches_the_new_kind(tmp_path, capsys) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(conv_relu_conv().SerializeToString())
    assert cli.main(["compile", str(path), "--device", "cpu:0=llvm", "--device", "npu=ort-cpu-test",
                     "-o", str(tmp_path / "out")]) == 0
    assert "accepted by ORT-CPU" in capsys.readouterr().out
    assert cli.main(["ort-cpu-test-info"]) == 0
    assert "device type 12" in capsys.readouterr().out


def test_adding_the_kind_took_one_package_and_one_registry_line() -> None:
    """The count docs/new-accelerator.md states: the package's files, and no product file touched."""
    files = sorted(p.name for p in (HERE / "ort_cpu_vendor").glob("*.py"))
    assert files == ["__init__.py", "backend.py", "sdk.py"]
    named = subprocess.run(["git", "grep", "-l", "ort-cpu-test", "--", str(HERE.parents[1] / "python"),
                            str(HERE.parents[1] / "src")], capture_output=True, text=True, cwd=HERE, check=False)
    assert named.stdout.strip() == "", named.stdout

"""libQnnHtp prints a notice on the native stdout when it is loaded ("# LIBNATIVE: ..."): the first
use of QNN keeps it off the user's terminal, and QNN still runs. In a child process: loading the
vendor library is process-wide (and its exit is not always clean)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from tvm_hetero.qnn import ep as qnn_ep

SCRIPT = textwrap.dedent("""
    import os
    import numpy as np
    from onnx import TensorProto, helper
    from tvm_hetero.qnn import ep as qnn_ep

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = qnn_ep.IR_VERSION
    print("before QNN", flush=True)
    session = qnn_ep.accelerator_session(model.SerializeToString(), {"soc_model": 60, "htp_arch": 73, "precision": "fp16"})
    print("relu", session.run(None, {"x": -np.ones((1, 8), "float32")})[0].max(), flush=True)
    os._exit(0)
""")


@pytest.mark.skipif(not qnn_ep.available(), reason="onnxruntime-qnn is not installed")
def test_the_htp_librarys_load_notice_stays_off_the_terminal():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before QNN", "relu 0.0"]
    assert "LIBNATIVE" not in done.stderr

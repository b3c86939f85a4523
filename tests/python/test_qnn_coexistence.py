"""The HTP beside the user's own ONNX Runtime + QNN sessions, in one process: whether the user
registered the QNN EP first (under any name) or after a build, both keep working. Each order runs
in a child process of its own, so pytest's process (which may have registered the EP) decides
nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from tvm_hetero.qnn import ep as qnn_ep

pytestmark = [pytest.mark.skipif(not qnn_ep.available(),
                                 reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')"),
              pytest.mark.slow]  # three builds in child processes: about a minute

_COMMON = textwrap.dedent('''
    import sys
    import numpy as np
    import onnxruntime as ort
    import onnxruntime_qnn
    from tvm_hetero.testing.models import conv_relu_conv

    MODEL = conv_relu_conv()
    X = np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype("float32")
    EXPECTED = ort.InferenceSession(MODEL.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]

    def close(got):
        error = np.abs(got - EXPECTED).max() / np.abs(EXPECTED).max()
        assert error <= 1e-2, error

    def user_registers(name):
        ort.register_execution_provider_library(name, onnxruntime_qnn.get_library_path())

    def user_session(name):
        """What an ONNX Runtime + QNN user writes: the EP's devices by the name they registered."""
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
        assert devices, [d.ep_name for d in ort.get_ep_devices()]
        options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(),
                                                   "soc_model": "60", "htp_arch": "73",
                                                   "enable_htp_fp16_precision": "1"})
        close(ort.InferenceSession(MODEL.SerializeToString(), options).run(None, {"x": X})[0])

    def build_and_run():
        import tvm
        import tvm_hetero
        from tvm_hetero.importers import from_onnx

        art = tvm_hetero.build(from_onnx(MODEL), [(tvm.cpu(0), "llvm"), "qnn-htp"])
        assert art.build_report.offload.graph_executions == 1, art.report()
        return art, run(art)

    def run(art):
        rt = art.create()
        rt.set_input("x", X)
        rt.run()
        close(rt.get_output(0).numpy())
        return rt
''')

_BUILD_FIRST = _COMMON + textwrap.dedent('''
    art, rt = build_and_run()
    art.export(sys.argv[1])
    user_registers("QNNExecutionProvider")  # refused if the build had taken the usual name
    user_session("QNNExecutionProvider")
    rt.run()  # the build's runtime still runs beside the user's registration
    close(rt.get_output(0).numpy())
    ort.unregister_execution_provider_library("QNNExecutionProvider")
    run(art)
    print("ok")
''')

_USER_FIRST = _COMMON + textwrap.dedent('''
    import tvm_hetero

    name, exported = sys.argv[1], sys.argv[2]
    user_registers(name)
    user_session(name)
    art, rt = build_and_run()
    user_session(name)
    run(tvm_hetero.load(exported))  # a context finalized under another registration opens here
    print("ok")
''')


def _child(script: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


@pytest.fixture(scope="module")
def built_first(tmp_path_factory) -> str:
    """Order 1, in a child: the build registers the EP, then the user registers it and runs their
    own session; the artifact it exported is kept for order 2."""
    exported = str(tmp_path_factory.mktemp("exported") / "art")
    _child(_BUILD_FIRST, exported)
    return exported


def test_a_build_first_leaves_the_usual_qnn_registration_to_the_user(built_first) -> None:
    assert built_first  # the fixture's child asserted each step


@pytest.mark.parametrize("name", ["QNNExecutionProvider", "MyQNN"])
def test_a_build_after_the_user_registered_qnn_uses_their_registration(built_first, name) -> None:
    _child(_USER_FIRST, name, built_first)

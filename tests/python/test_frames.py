"""Frames: several threads, each with its own frame, run one compiled model at the same time with the
weights held once and every output equal to serial; inputs and outputs bound without copies are
checked (naming the input) and really shared; the plan prints."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm_hetero.testing import models

SMALL_CNN, PARAMS = models.small_cnn()
TWO_CPUS = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
THREADS, INFERENCES = 4, 200


@pytest.fixture(scope="module")
def one_device():
    return tvm_hetero.build(SMALL_CNN, [("cpu:0", "llvm")], params=PARAMS)


@pytest.fixture(scope="module")
def two_devices():
    # The first convolution on cpu:1: each frame then runs two device executors.
    return tvm_hetero.build(SMALL_CNN, TWO_CPUS, placement={"conv2d": 1}, params=PARAMS)


@pytest.mark.parametrize("fixture", ["one_device", "two_devices"])
def test_four_threads_each_with_a_frame_match_serial_on_every_one_of_800_inferences(fixture, request):
    artifact = request.getfixturevalue(fixture)
    rt = artifact.create()
    inputs = [make_input(i) for i in range(THREADS * INFERENCES)]
    expected = []
    for x in inputs:  # serial, on the runtime's default frame
        rt.set_input("x", x)
        rt.run()
        expected.append(rt.get_output(0).numpy())
    assert len({e.tobytes() for e in expected}) > INFERENCES  # distinct inputs give distinct outputs
    mismatches: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def serve(t: int) -> None:
        try:
            frame = rt.frame()
            start.wait()
            for k in range(INFERENCES):
                i = t * INFERENCES + k
                frame.set_input("x", inputs[i])
                frame.run()
                if not np.array_equal(frame.get_output(0).numpy(), expected[i]):
                    mismatches.append((t, k))
        except BaseException as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    threads = [threading.Thread(target=serve, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert not mismatches, f"{len(mismatches)} outputs differ from serial, first {mismatches[:5]}"


def make_input(i: int) -> np.ndarray:
    return np.random.default_rng(1000 + i).standard_normal((1, 3, 32, 32)).astype("float32")


def test_frames_share_the_weights_and_allocate_only_activations(one_device):
    rt = one_device.create()
    frame = rt.frame()
    weights = sum(v.nbytes for v in PARAMS.values())
    pool = sum(rt.stats()["storage_bytes"])
    # The runtime's pool holds weights and activations; a frame allocates the activations only.
    assert frame.allocated_bytes <= pool - weights
    assert frame.allocated_bytes > 0
    w1 = rt.get_input("w1")
    assert frame.get_input("w1").data_ptr() == w1.data_ptr()


def test_set_input_on_a_frame_refuses_a_shared_parameter(one_device):
    rt = one_device.create()
    frame = rt.frame()
    with pytest.raises(ValueError, match="'w1' is a parameter shared by every frame"):
        frame.set_input("w1", PARAMS["w1"])


def test_bound_input_and_output_are_read_and_written_in_place(one_device):
    rt = one_device.create()
    x = make_input(1)
    rt.set_input("x", x)
    rt.run()
    expected = rt.get_output(0).numpy()

    frame = rt.frame()
    bound_x = tvm.runtime.empty((1, 3, 32, 32), "float32")
    bound_x.copyfrom(make_input(2))
    out = tvm.runtime.empty((1, 10), "float32")
    frame.set_input("x", bound_x, copy=False)
    frame.bind_output(0, out)
    frame.run()
    assert frame.io_bytes_copied == 0  # nothing copied in or out
    assert frame.get_output(0).data_ptr() == out.data_ptr()
    rt.set_input("x", make_input(2))
    rt.run()
    np.testing.assert_array_equal(out.numpy(), rt.get_output(0).numpy())
    # The frame reads the caller's tensor on every run: writing it changes the next result.
    bound_x.copyfrom(x)
    frame.run()
    np.testing.assert_array_equal(out.numpy(), expected)
    # copy=True again: the frame's own memory, and the bound tensor is left alone.
    frame.set_input("x", make_input(2))
    frame.run()
    np.testing.assert_array_equal(bound_x.numpy(), x)
    assert frame.io_bytes_copied == x.nbytes


def test_binding_checks_shape_dtype_and_alignment_naming_the_input(one_device):
    rt = one_device.create()
    with pytest.raises(ValueError, match="input 'x': expected shape"):
        rt.set_input("x", tvm.runtime.empty((1, 3, 16, 16), "float32"), copy=False)
    with pytest.raises(TypeError, match="input 'x': expected dtype float32"):
        rt.set_input("x", tvm.runtime.empty((1, 3, 32, 32), "float16"), copy=False)
    backing = np.zeros(3 * 32 * 32 + 64, "float32")
    start = next(k for k in range(64) if (backing[k:].ctypes.data % 64) != 0)
    misaligned = backing[start:start + 3 * 32 * 32].reshape(1, 3, 32, 32)
    with pytest.raises(ValueError, match="input 'x': bound without a copy, its data must be 64-byte aligned"):
        rt.set_input("x", misaligned, copy=False)
    with pytest.raises(ValueError, match="output 0 .*expected shape"):
        rt.bind_output(0, tvm.runtime.empty((1, 11), "float32"))


def test_the_plan_prints_one_line_per_step(two_devices):
    rt = two_devices.create()
    text = rt.plan()
    assert rt.stats()["num_ops"] == len(text.strip().splitlines())
    assert "kernel" in text and "on device 1" in text and "view of e" in text


def test_frames_share_the_onednn_weights_reordered_once():
    """oneDNN keeps weights in its own layout: the frames of one runtime share that copy (reordered
    by the first call that needs it), so weights are held once with oneDNN regions too."""
    import tvm_ffi

    if not tvm_ffi.get_global_func("tvm_hetero.dnnl.available")():
        pytest.skip("built without oneDNN: no oneDNN regions")
    reorders = tvm_ffi.get_global_func("tvm_hetero.dnnl.weight_reorders")
    art = tvm_hetero.build(SMALL_CNN, [("cpu:0", "llvm")], params=PARAMS)
    assert "dnnl" in art.report()
    rt = art.create()
    before = reorders()
    rt.set_input("x", make_input(0))
    rt.run()
    first = reorders() - before
    assert first > 0  # the convolutions' weights, reordered into oneDNN's blocked layout
    expected = rt.get_output(0).numpy()
    for _ in range(3):
        frame = rt.frame()
        frame.set_input("x", make_input(0))
        frame.run()
        np.testing.assert_array_equal(frame.get_output(0).numpy(), expected)
    assert reorders() - before == first  # no frame made a copy of its own


def test_frames_of_two_models_share_one_scratch_and_compute_as_with_their_own(one_device, two_devices):
    """Frames that never run at once hold one scratch between them: the larger need, not the sum."""
    runtimes = [one_device.create(), two_devices.create()]
    needs = [rt.scratch_bytes() for rt in runtimes]
    assert all(need > 0 for need in needs)
    scratch = tvm.runtime.empty((max(needs),), "uint8", tvm.cpu(0))
    shared = [rt.frame(scratch) for rt in runtimes]
    own = [rt.frame() for rt in runtimes]
    for frame, alone in zip(shared, own):
        # The scratch replaces the frame's memory for the values a run computes.
        assert frame.allocated_bytes < alone.allocated_bytes
    for i in range(6):  # alternate, so each run starts from the other model's leftovers
        x = make_input(i)
        for frame, alone in zip(shared, own):
            frame.set_input("x", x)
            alone.set_input("x", x)
            frame.run()
            alone.run()
            np.testing.assert_array_equal(frame.get_output(0).numpy(), alone.get_output(0).numpy())


def test_a_scratch_smaller_than_the_graph_needs_is_refused_with_both_sizes(one_device):
    rt = one_device.create()
    need = rt.scratch_bytes()
    small = tvm.runtime.empty((need - 64,), "uint8", tvm.cpu(0))
    with pytest.raises(ValueError, match=f"scratch \\({need - 64} bytes on cpu:0\\) must hold {need} bytes"):
        rt.frame(small)

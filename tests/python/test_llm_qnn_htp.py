"""Decoders over the CPU and the HTP (emulated by onnxruntime-qnn's x86 libQnnHtp.so): prefill buckets
as QNN graphs, every graph verified at build and the whole path checked teacher-forced against the
host's fp32 graphs, decode on the CPU reading the cache the HTP's rows were written into.

The configs are tiny (2 layers, hidden 64, capacity 64, one prefill bucket of 8 rows) so that the
emulator's runs stay short."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tvm
from test_llm import prompt_of, reference_tokens, tiny_model
from tvm_hetero import llm
from tvm_hetero.llm.graph_io import key_cache_shape
from tvm_hetero.llm.native import NativeGenerator
from tvm_hetero.llm.packed_outputs import packed_layout
from tvm_hetero.native import LOADED_LIBRARY
from tvm_hetero.qnn import ep as qnn_ep

pytestmark = pytest.mark.skipif(not qnn_ep.available(),
                                reason="onnxruntime-qnn is not installed (pip install 'tvm-hetero[qnn]')")

CPU = (tvm.cpu(0), "llvm")
CAPACITY = 64
CHUNKS = (8,)
CHECK_TOKENS = 8


def qnn_device_type() -> int:
    from tvm_hetero.qnn import KIND

    return int(KIND.device_type)


@pytest.fixture(scope="module")
def llama_model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def prefill_on_htp(llama_model):
    """Prefill on the CPU and the HTP, decode on the CPU."""
    return llm.build(llama_model, {"prefill": [CPU, "qnn-htp"], "decode": [CPU]}, capacity=CAPACITY,
                     prefill_chunks=CHUNKS, check_tokens=CHECK_TOKENS)


def test_the_prefill_bucket_runs_its_matmuls_as_qnn_graphs(prefill_on_htp):
    (decode,) = [g for g in prefill_on_htp.graphs if g.phase == "decode"]
    (prefill,) = [g for g in prefill_on_htp.graphs if g.phase == "prefill"]
    assert decode.offload is None and decode.accelerator_executions == 0
    offload = prefill.offload
    assert offload.device == "HTP" and offload.regions
    assert offload.flops_on_device >= 0.9 * offload.flops  # the target: >= 90% of matmul FLOPs
    assert all(check.ok for check in offload.verification.regions)
    # every op QNN refused is reported with its reason (and runs on the CPU)
    assert all(r.reason for r in offload.refused)


def test_prefill_on_the_htp_and_decode_on_the_cpu_give_the_all_cpu_tokens(prefill_on_htp, llama_model):
    for length in (5, 13):
        prompt = prompt_of(length, prefill_on_htp.config.vocab_size)
        assert prefill_on_htp.generate(prompt, 12) == reference_tokens(llama_model, prompt, 12)


def test_the_cache_is_handed_between_phases_by_its_new_rows_only(prefill_on_htp):
    cfg = prefill_on_htp.config
    session = prefill_on_htp.session()
    prompt = prompt_of(13, cfg.vocab_size)
    session.prefill(prompt)
    cache_tensors = [t for pair in session.cache.tensors for t in pair]
    row_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    assert session.cache.bytes_written == 13 * row_bytes
    for token in (1, 2, 3):
        session.decode(token)
    assert session.cache.bytes_written == 16 * row_bytes  # never the whole cache
    whole = 2 * cfg.num_layers * int(np.prod(key_cache_shape(cfg, CAPACITY))) * 4
    assert row_bytes * 16 < whole
    # both phases' frames read the very tensors the loop writes (bound once, no copy)
    assert [t for pair in session.cache.tensors for t in pair] == cache_tensors


def test_stats_count_htp_executions_per_chunk_and_none_per_cpu_token(prefill_on_htp):
    session = prefill_on_htp.session()
    session.prefill(prompt_of(13, prefill_on_htp.config.vocab_size))  # two chunks of 8
    for token in (4, 5):
        session.decode(token)
    stats = session.stats()
    per_chunk = stats["prefill"]["per_call"][8]
    assert per_chunk == 1  # the whole chunk is one QNN graph (its outputs packed into one)
    assert stats["prefill"]["calls"] == 2
    assert stats["prefill"]["accelerator_graph_executions"] == 2 * per_chunk
    assert stats["decode"] == {"calls": 2, "accelerator_graph_executions": 0, "per_call": {1: 0}}
    assert stats["accelerator_graph_executions"] == 2 * per_chunk


def test_the_whole_path_check_agrees_on_every_greedy_token_and_the_report_says_so(prefill_on_htp):
    check = prefill_on_htp.phase_check
    assert check is not None and not check["failed"]
    assert set(check["buckets"]) == set(CHUNKS)
    assert max(check["buckets"].values()) <= check["tolerance"]
    assert check["decode"]["steps"] == CHECK_TOKENS
    assert check["decode"]["agreement"] == CHECK_TOKENS
    report = prefill_on_htp.report()
    assert "graph execution(s) per call" in report and "of the matmul FLOPs" in report
    assert f"greedy agreement {CHECK_TOKENS}/{CHECK_TOKENS}" in report


@pytest.mark.slow
def test_a_bucket_failing_the_whole_path_check_moves_to_the_host_loudly(llama_model):
    with pytest.warns(RuntimeWarning, match=r"prefill graph of 8 row\(s\) runs on the host: whole-path check"):
        lm = llm.build(llama_model, {"prefill": [CPU, "qnn-htp"], "decode": [CPU]}, capacity=CAPACITY,
                       prefill_chunks=CHUNKS, check_tokens=4, phase_tolerance=0.0)
    (prefill,) = [g for g in lm.graphs if g.phase == "prefill"]
    assert prefill.moved_to_host and prefill.accelerator_executions == 0
    assert lm.phase_check["failed"] == [8]
    assert "MOVED TO THE HOST" in lm.report()
    prompt = prompt_of(13, lm.config.vocab_size)
    assert lm.generate(prompt, 8) == reference_tokens(llama_model, prompt, 8)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_both_phases_on_the_htp_match_the_cpu_tokens_with_one_htp_execution_per_token(arch, tmp_path):
    model = tiny_model(arch)
    lm = llm.build(model, [CPU, "qnn-htp"], capacity=CAPACITY, prefill_chunks=CHUNKS, check_tokens=CHECK_TOKENS)
    for graph in lm.graphs:
        offload = graph.offload
        assert offload and offload.flops_on_device >= 0.9 * offload.flops, (arch, graph.size)
    assert lm.phase_check["decode"]["agreement"] == CHECK_TOKENS
    prompt = prompt_of(13, lm.config.vocab_size)
    assert lm.generate(prompt, 8) == reference_tokens(model, prompt, 8)
    stats = lm.stats()
    per_token = stats["decode"]["per_call"][1]
    assert per_token == 1 and stats["decode"]["accelerator_graph_executions"] == 7 * per_token
    # exported and loaded (every graph with constants of its own and weights on the HTP's side), in
    # Python and in the C++ loop: the same tokens
    lm.export(tmp_path / "out")
    tokens = lm.generate(prompt, 8)
    assert llm.load(tmp_path / "out").generate(prompt, 8) == tokens
    assert NativeGenerator(tmp_path / "out").generate(prompt, 8) == tokens


def test_a_session_prefilling_on_the_htp_beside_one_decoding_on_the_cpu_matches_serial(prefill_on_htp):
    """Two sessions of one model on two threads at once: one prefills prompts (HTP graphs), the other
    decodes (CPU graph); each gets what it gets alone."""
    vocab = prefill_on_htp.config.vocab_size
    prompts = [prompt_of(length, vocab, seed=7) for length in (9, 16, 24, 31)]
    start = prompt_of(6, vocab, seed=8)

    def prefill_all(session):
        return [session.prefill(p).copy() for p in prompts]

    def decode_all(session):
        logits = session.prefill(start)
        out = []
        for _ in range(24):
            token = int(np.argmax(logits))
            out.append(token)
            logits = session.decode(token)
        return out

    serial = (prefill_all(prefill_on_htp.session()), decode_all(prefill_on_htp.session()))
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def worker(name, job):
        session = prefill_on_htp.session()
        barrier.wait()
        results[name] = job(session)

    threads = [threading.Thread(target=worker, args=("prefill", prefill_all)),
               threading.Thread(target=worker, args=("decode", decode_all))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results["decode"] == serial[1]
    for got, expected in zip(results["prefill"], serial[0]):
        np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module")
def htp_export(prefill_on_htp, tmp_path_factory):
    return prefill_on_htp.export(tmp_path_factory.mktemp("htp_export") / "out")


def test_an_export_with_htp_graphs_loads_with_the_same_tokens_report_and_stats(prefill_on_htp, htp_export):
    manifest = json.loads((htp_export / "manifest.json").read_text())
    (entry,) = [e for e in manifest["graphs"] if e["phase"] == "prefill"]
    assert [t for t, _ in entry["devices"]] == [tvm.cpu(0).dlpack_device_type(), qnn_device_type()]
    assert entry["packed_layout"] == [[o, list(s)] for o, s in packed_layout(prefill_on_htp.config, 8)]
    assert manifest["phase_check"]["decode"]["agreement"] == CHECK_TOKENS
    loaded = llm.load(htp_export)
    for length in (5, 13):
        prompt = prompt_of(length, loaded.config.vocab_size)
        assert loaded.generate(prompt, 12) == prefill_on_htp.generate(prompt, 12)
    (prefill,) = [g for g in loaded.graphs if g.phase == "prefill"]
    assert prefill.packed and prefill.accelerator_executions == 1
    assert loaded.phase_check == prefill_on_htp.phase_check
    stats = loaded.stats()
    assert stats["prefill"]["calls"] == 3 and stats["prefill"]["accelerator_graph_executions"] == 3  # 1 + 2 chunks
    assert stats["decode"]["accelerator_graph_executions"] == 0
    report = loaded.report()
    assert "HTP (fp16): 1 graph execution(s) per call" in report and f"greedy agreement {CHECK_TOKENS}/{CHECK_TOKENS}" in report


def test_loading_an_export_finalizes_no_htp_graph(prefill_on_htp, htp_export, monkeypatch):
    """The exported library holds each region's finalized QNN context: a load opens it and compiles
    nothing (QNN's finalize is never called, and every model opened is a context, never a graph)."""
    import onnx

    finalized, opened = [], []
    open_session, finalize = qnn_ep.accelerator_session, qnn_ep.finalize
    monkeypatch.setattr(qnn_ep, "finalize", lambda *a, **k: finalized.append(1) or finalize(*a, **k))
    monkeypatch.setattr(qnn_ep, "accelerator_session", lambda model, *a, **k: opened.append(model) or
                        open_session(model, *a, **k))
    loaded = llm.load(htp_export)
    prompt = prompt_of(13, loaded.config.vocab_size)
    assert loaded.generate(prompt, 4) == prefill_on_htp.generate(prompt, 4)
    assert not finalized and len(opened) == 1  # one region, opened once
    nodes = onnx.load_from_string(opened[0]).graph.node
    assert [n.op_type for n in nodes] == ["EPContext"]
    assert {a.name: a.i for a in nodes[0].attribute if a.name == "embed_mode"} == {"embed_mode": 1}
    # opening the context is faster than compiling the plain graph it came from (the build's work)
    (prefill,) = [g for g in prefill_on_htp.graphs if g.phase == "prefill"]
    (plain,) = prefill.accelerator_models.values()
    options = prefill.offload.options
    compile_s = min(_seconds(open_session, plain, options) for _ in range(3))
    open_s = min(_seconds(open_session, opened[0], options) for _ in range(3))
    assert open_s < compile_s, (open_s, compile_s)


def _seconds(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def test_the_cpp_loop_generates_from_an_export_with_packed_outputs(prefill_on_htp, htp_export):
    """The C++ loop (src/llm/) binds the HTP graph's packed output; its regions run through the vendor
    runner this Python process registers."""
    native = NativeGenerator(htp_export)
    for length in (5, 13):
        prompt = prompt_of(length, native.vocab_size)
        assert native.generate(prompt, 10) == prefill_on_htp.generate(prompt, 10)


def test_a_packed_layout_that_is_not_the_configurations_is_refused_by_both_loaders(htp_export, tmp_path):
    """A manifest re-sealed with another layout (e.g. written for another configuration) is an error
    naming the graph in Python and in C++, before any graph runs."""
    import shutil

    from tvm_hetero.artifact import MANIFEST_DIGEST_KEY, manifest_digest

    copy = tmp_path / "edited"
    shutil.copytree(htp_export, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    (entry,) = [e for e in manifest["graphs"] if e["packed_layout"]]
    entry["packed_layout"][1][0] += 1  # the first layer's keys one element later
    manifest[MANIFEST_DIGEST_KEY] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"graph of 8 row\(s\): its packed-output layout differs"):
        llm.load(copy)
    with pytest.raises(Exception, match=r"graphs\[1\]\.packed_layout.*packed-output layout differs"):
        NativeGenerator(copy)


def test_the_generate_command_runs_an_export_with_htp_graphs(prefill_on_htp, htp_export, capsys):
    from tvm_hetero.cli import main

    prompt = prompt_of(13, prefill_on_htp.config.vocab_size)
    assert main(["generate", str(htp_export), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "6"]) == 0
    expected = " ".join(map(str, prefill_on_htp.generate(prompt, 6)))
    assert f"new tokens: {expected}" in capsys.readouterr().out


def test_the_cpp_only_loader_names_what_an_htp_region_needs(htp_export):
    """Without Python's vendor runner (the C++-only deploy path), loading is an error naming the region
    and what runs it, never a crash."""
    script = ("import ctypes, sys, tvm, tvm_ffi\n"
              "ctypes.CDLL(sys.argv[1], ctypes.RTLD_GLOBAL)\n"
              "try:\n    tvm_ffi.get_global_func('tvm_hetero.llm.load')(sys.argv[2], 0, None)\n"
              "except Exception as err:\n    print(err); sys.exit(3)\n")
    ran = subprocess.run([sys.executable, "-c", script, LOADED_LIBRARY, str(htp_export)], capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 3, ran.stderr[-2000:]
    assert f"{htp_export / 'graph_8.json'}: accelerator region" in ran.stdout, ran.stdout
    assert "reaches only from Python" in ran.stdout


def test_decode_placed_by_cost_compares_labelled_figures_and_runs_on_the_cheaper_side(llama_model, tmp_path):
    lm = llm.build(llama_model, [CPU, "qnn-htp"], capacity=CAPACITY, prefill_chunks=CHUNKS, check_tokens=0,
                   decode_placement="cost")
    choice = lm.decode_choice
    assert choice["device_source"].startswith(("modeled", "measured on a device"))  # never the emulator's time
    assert choice["host_source"].startswith("measured here") and choice["host_seconds"] > 0
    assert choice["on_device"] == (choice["device_seconds"] < choice["host_seconds"])
    (decode,) = [g for g in lm.graphs if g.phase == "decode"]
    (prefill,) = [g for g in lm.graphs if g.phase == "prefill"]
    assert (decode.accelerator_executions == 1) == choice["on_device"]
    assert prefill.accelerator_executions == 1  # prefill stays on the HTP
    assert "decode placed by cost" in lm.report()
    prompt = prompt_of(13, lm.config.vocab_size)
    assert lm.generate(prompt, 8) == reference_tokens(llama_model, prompt, 8)
    loaded = llm.load(lm.export(tmp_path / "out"))  # the placement and its figures travel with the export
    assert loaded.decode_choice == choice and "decode placed by cost" in loaded.report()
    assert [g.moved_to_host for g in loaded.graphs] == [g.moved_to_host for g in lm.graphs]
    assert loaded.generate(prompt, 8) == lm.generate(prompt, 8)


def test_an_unknown_decode_placement_is_a_clear_error(llama_model):
    with pytest.raises(ValueError, match="decode_placement must be 'targets' or 'cost'"):
        llm.build(llama_model, [CPU], capacity=CAPACITY, prefill_chunks=CHUNKS, decode_placement="fastest")


def test_the_demo_prefills_a_decoder_on_the_htp_and_decodes_on_the_cpu_beside_the_peer(capsys):
    """`tvm-hetero demo-htp --part decoder` (scripts/demo.sh's last part): each phase's device, HTP
    executions per chunk and per token, errors and speed, the tokens against transformers', the peer."""
    from tvm_hetero.cli import main

    assert main(["demo-htp", "--part", "decoder"]) == 0
    out = capsys.readouterr().out
    assert "prefill on cpu:0 + qnn-htp:0: 2 call(s), 1 HTP graph execution(s) per chunk of 8 (2 in all)" in out
    assert "decode  on cpu:0: 15 call(s), 0 HTP graph execution(s) per token (0 in all)" in out
    assert "tok/s modeled on the HTP" in out and "tok/s measured here" in out
    assert "greedy agreement 16/16" in out
    assert "the same as transformers' fp32 greedy tokens" in out
    peer_line = next(line for line in out.splitlines() if "ONNX Runtime + QNN EP on the same graph" in line)
    assert "QNN partition(s)" in peer_line and "relative error" in peer_line, peer_line
# -- QDQ phases: 8-bit weights, 16-bit activations, quantized at build (precision "a16w8") --

QDQ_HTP = "qnn-htp:precision=a16w8"
#: The wide random weights of the test models (initializer_range 0.5: scores of +-50, attention
#: almost one-hot) are as hard as it gets for 8-bit weights: even with a scale per channel their A16W8
#: graphs are about 5e-2 off fp32 per call, at times 0.1-0.2 (docs/performance.md), so these tests
#: allow 0.1 where a trained model keeps the default.
QDQ_TOLERANCE = 0.1


@pytest.fixture(scope="module")
def qdq_prefill(llama_model):
    """Prefill on the HTP in A16W8 (calibrated on real calls through the host's fp32 graph), decode on the CPU."""
    return llm.build(llama_model, {"prefill": [CPU, QDQ_HTP], "decode": [CPU]}, capacity=CAPACITY,
                     prefill_chunks=CHUNKS, check_tokens=CHECK_TOKENS, offload_tolerance=QDQ_TOLERANCE,
                     phase_tolerance=QDQ_TOLERANCE)


def test_a_qdq_prefill_bucket_runs_every_matmul_on_the_htp_quantized_and_verified(qdq_prefill):
    (prefill,) = [g for g in qdq_prefill.graphs if g.phase == "prefill"]
    offload = prefill.offload
    assert offload.options["precision"] == "a16w8" and offload.quantized
    assert offload.flops_on_device == offload.flops > 0  # every matmul
    assert prefill.accelerator_executions == 1 and not prefill.moved_to_host
    verification = offload.verification
    assert verification.inputs == "calibration data"
    assert all(check.ok and 0 < check.relative_error <= QDQ_TOLERANCE for check in verification.regions)
    # what QNN compiled is the QDQ model: 16-bit activations, 8-bit weights
    import onnx

    (model,) = prefill.accelerator_models.values()
    proto = onnx.load_from_string(model)
    inits = {i.name: i for i in proto.graph.initializer}
    made_by = {out: node for node in proto.graph.node for out in node.output}
    activations = {inits[n.input[2]].data_type for n in proto.graph.node
                   if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits}
    assert activations == {onnx.TensorProto.UINT16}
    weight_dequantizes = [made_by[n.input[1]] for n in proto.graph.node
                          if n.op_type == "MatMul" and n.input[1] in made_by
                          and made_by[n.input[1]].op_type == "DequantizeLinear" and made_by[n.input[1]].input[0] in inits]
    assert weight_dequantizes and {inits[dq.input[0]].data_type for dq in weight_dequantizes} == {onnx.TensorProto.UINT8}
    # each (in, out) weight with a symmetric scale per output column (qnn/per_channel_weights.py)
    from onnx import numpy_helper

    for dq in weight_dequantizes:
        columns = inits[dq.input[0]].dims[1]
        assert [a.i for a in dq.attribute if a.name == "axis"] == [1]
        assert tuple(inits[dq.input[1]].dims) == (columns,)
        assert set(numpy_helper.to_array(inits[dq.input[2]]).tolist()) == {128}


def test_the_qdq_whole_path_check_reports_the_greedy_agreement(qdq_prefill):
    check = qdq_prefill.phase_check
    assert check["tolerance"] == QDQ_TOLERANCE and not check["failed"]
    assert 0 < check["buckets"][8] <= QDQ_TOLERANCE
    assert check["decode"]["steps"] == CHECK_TOKENS and 0 <= check["decode"]["agreement"] <= CHECK_TOKENS
    report = qdq_prefill.report()
    assert "HTP (a16w8: quantized at build, calibrated on real calls)" in report
    assert f"greedy agreement {check['decode']['agreement']}/{CHECK_TOKENS}" in report


@pytest.mark.slow
def test_a_qdq_bucket_qnn_computes_wrongly_moves_back(llama_model, monkeypatch):
    """Quantized without the mask rule (region_quantization.py), an additive mask stretches a 16-bit
    range over 1e30: QNN computes the bucket far off fp32; verification moves its ops back."""
    from tvm_hetero.ep_offload import region_quantization

    monkeypatch.setattr(region_quantization, "MASKED_BELOW", float("-inf"))
    lm = llm.build(llama_model, {"prefill": [CPU, QDQ_HTP], "decode": [CPU]}, capacity=CAPACITY,
                   prefill_chunks=CHUNKS, check_tokens=4, offload_tolerance=QDQ_TOLERANCE,
                   phase_tolerance=QDQ_TOLERANCE)
    (prefill,) = [g for g in lm.graphs if g.phase == "prefill"]
    offload = prefill.offload
    moved = [reason for reason in offload.excluded.values() if reason.startswith("verification: relative error")]
    assert moved, offload.excluded
    errors = [float(re.search(r"relative error (\S+) >", reason).group(1)) for reason in moved]
    assert max(errors) > 0.5  # off by the logits' own size: a wrong result, not rounding
    # what stays on the HTP is verified; with nothing left there, the tokens are the host's fp32 ones
    assert all(check.ok for check in (offload.verification.regions if offload.verification else []))
    if prefill.accelerator_executions == 0:
        assert lm.phase_check is None  # nothing on the accelerator left to check
        report = lm.report()  # said out loud, with the reason
        assert "NOTHING RUNS ON THE HTP" in report and "moved back to the host: verification: relative error" in report
        prompt = prompt_of(13, lm.config.vocab_size)
        assert lm.generate(prompt, 8) == reference_tokens(llama_model, prompt, 8)
    else:
        assert not lm.phase_check["failed"]


@pytest.mark.slow
def test_the_weights_once_report_compares_one_shared_context_with_one_per_graph(llama_model):
    """Two prefill buckets' HTP graphs in one shared-weights QNN context: its bytes against one
    context each, and whether this machine loads it (tried in a child process, beside the control:
    the same graphs one context each, opened the same way)."""
    from tvm_hetero.qnn.shared_context import weights_once

    lm = llm.build(llama_model, {"prefill": [CPU, "qnn-htp"], "decode": [CPU]}, capacity=CAPACITY,
                   prefill_chunks=(8, 16), check_tokens=0)
    models = {f"{g.size}:{name}": model for g in lm.graphs for name, model in g.accelerator_models.items()}
    assert len(models) == 2
    once = weights_once(models, lm.graphs[1].offload.options)
    assert once["graphs"] == 2 and all(b > 0 for b in once["per_graph_bytes"])
    # what the graphs hold alike is stored once: less than the two contexts side by side
    assert once["largest_graph_bytes"] <= once["shared_bytes"] < sum(once["per_graph_bytes"])
    assert once["per_graph_loads"], once["per_graph_why_not"]  # the control opens here
    assert once["shared_loads"] or once["why_not"]  # the x86 emulator refuses it: said, with why

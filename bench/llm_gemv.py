"""One-row (decode) f32 matmuls against a stored weight, one thread: oneDNN's ways against OpenBLAS.

The shapes are a SmolLM2-135M decode step's: the LM head (576 x 49152) and a layer's fused q/k/v
(576 x 960), o (576 x 576), gate/up (576 x 3072) and down (1536 x 576) projections, weights stored
(in, out) as ``tvm_hetero.llm`` stores them. Each way is a one-matmul graph built by
``tvm_hetero.build`` with oneDNN regions; ``TVM_HETERO_DNNL_ONE_ROW``, read when a region is set
up, picks the primitive of a one-row matmul (``inner_product``, the default: oneDNN's inner product
on the weight layout it picks, reordered once; ``matmul``: matmul on the stored layout). numpy's ``x @ w`` (OpenBLAS) is the reference. The ways run interleaved in one process
(A, B, C, ... per round); medians of thread CPU time and of wall time per call are printed with the
load average.

With ``--decode``, the whole decode step instead: one SmolLM2-135M-shaped model (random weights,
capacity 512, prefill chunk 16) is built per variant in one process, each set up with its variant,
then their generations alternate (16-token prompt, 32 new tokens): decode tokens per second of
process CPU time (the executor runs on its own thread) and of wall time, medians, and the tokens compared.

    OPENBLAS_NUM_THREADS=1 python bench/llm_gemv.py [--rows 1] [--rounds 15] [--variants matmul,inner_product]
    python bench/llm_gemv.py --decode [--rounds 7] [--variants matmul,inner_product]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

SHAPES = {"lm_head": (576, 49152), "qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072),
          "down": (1536, 576)}


def one_matmul(rows: int, k: int, n: int):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(y)
    return bb.get()


def per_call(fn, calls: int) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.thread_time() - cpu) / calls, (time.perf_counter() - wall) / calls


def resident_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def decode_speed(variants: list[str], rounds: int) -> None:
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from tvm_hetero import llm

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048,
                      rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg).eval()
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, 16).tolist()
    options = [{"cores": [0], "num_threads": 1}]
    lms = {}
    for v in variants:
        os.environ["TVM_HETERO_DNNL_ONE_ROW"] = v
        lms[v] = llm.build(model, capacity=512, prefill_chunks=(16,), device_options=options)
        before = resident_mib()
        lms[v].generate(prompt, max_new_tokens=2)  # sets every region up with this variant
        print(f"{v}: the first generation (regions set up) added {resident_mib() - before:.0f} MiB resident",
              flush=True)
    os.environ.pop("TVM_HETERO_DNNL_ONE_ROW", None)
    del model

    def one(lm) -> tuple[float, float, list[int]]:
        tokens, cpu, wall = [], 0.0, 0.0
        for t in lm.stream(prompt, max_new_tokens=33):
            if not tokens:
                cpu, wall = time.process_time(), time.perf_counter()
            tokens.append(t)
        return 32 / (time.process_time() - cpu), 32 / (time.perf_counter() - wall), tokens

    rates: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    reference = None
    for _ in range(rounds):
        for v, lm in lms.items():
            cpu, wall, tokens = one(lm)
            reference = reference or tokens
            assert tokens == reference, f"variant {v} gave other tokens"
            rates[v].append((cpu, wall))
    for v, r in rates.items():
        print(f"decode variant {v} load {os.getloadavg()[0]:.1f}: {statistics.median(c for c, _ in r):.1f} tok/s "
              f"(process CPU), {statistics.median(w for _, w in r):.1f} tok/s wall", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--variants", default="matmul,inner_product")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--decode", action="store_true")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "TVM_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if args.decode:
        decode_speed(args.variants.split(","), args.rounds)
        return 0

    import numpy as np
    import tvm
    import tvm_hetero

    rng = np.random.default_rng(0)
    for name in args.shapes.split(","):
        k, n = SHAPES[name]
        x = rng.standard_normal((args.rows, k)).astype("float32")
        w = (rng.standard_normal((k, n)) * 0.05).astype("float32")
        expected = x @ w
        calls = max(3, int(2e8 / (4 * k * n)))  # about 200 MB read per timing
        ways = {"numpy": lambda x=x, w=w: x @ w}
        for v in args.variants.split(","):
            os.environ["TVM_HETERO_DNNL_ONE_ROW"] = v
            art = tvm_hetero.build(one_matmul(args.rows, k, n), [(tvm.cpu(0), "llvm")], params={"w": w})
            rt = art.create()
            rt.set_input(x=x)
            rt.run()  # sets the region up (reads the variant) and reorders the weight once
            np.testing.assert_allclose(rt.get_output(0).numpy(), expected, rtol=1e-3, atol=1e-3)
            ways[v] = rt.run
        os.environ.pop("TVM_HETERO_DNNL_ONE_ROW", None)
        times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                times[way].append(per_call(fn, calls))
        base = statistics.median(c for c, _ in times["numpy"])
        cells = []
        for way, ts in times.items():
            cpu = statistics.median(c for c, _ in ts)
            wall = statistics.median(w_ for _, w_ in ts)
            cells.append(f"{way} {cpu * 1e3:.3f} ms cpu ({cpu / base:.2f}x numpy), {wall * 1e3:.3f} wall")
        print(f"{name} {args.rows}x{k}x{n} load {os.getloadavg()[0]:.1f}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

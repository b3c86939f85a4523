"""Do the peers compute the same model? Logits and greedy tokens against `transformers`, on one shape.

    PYTHONPATH=python python bench/llm/check_peers.py [--shape tiny] [--prompt 24] [--new 32]

For a prompt of generated text, each peer's next-token logits after the prompt are compared with
transformers' (fp32, eager): the largest difference over the largest |logit|, and whether the
argmax agrees; then each peer's greedy tokens are compared, and each peer's own tokenizer on a line
of text. llama.cpp's logits are read at every
prompt position (``logits_all``), which also checks the GGUF conversion's q/k row order for RoPE:
a wrong order leaves position 0 right and every later position wrong. The fp32 lines must agree
(relative error below ``--tol``, same argmax, same tokens); the 8-bit lines are reported only, their
error being the quantization's. tvm-hetero exposes tokens, not logits: its tokens are compared.
Exit status 1 when an fp32 line disagrees.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checkpoints
from run import agreeing, prompt_ids


def tvm_threads() -> int:
    """The thread count TVM's pool takes when nothing sets it (tvm-hetero without device_options)."""
    return int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def transformers_logits(checkpoint: Path, prompt: list[int]) -> np.ndarray:
    """[positions, vocab] fp32 logits of the prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
    with torch.inference_mode():
        return model.eval()(input_ids=torch.tensor([prompt])).logits[0].numpy()


def llamacpp_logits(checkpoint: Path, prompt: list[int], q8: bool) -> np.ndarray:
    from peer_llamacpp import gguf_file, load

    llm = load(gguf_file(checkpoint, q8), threads=1, n_ctx=128, logits_all=True)
    llm.eval(prompt)
    return np.array(llm.scores[: len(prompt)], dtype=np.float32)


def ortgenai_logits(checkpoint: Path, prompt: list[int], int8: bool) -> np.ndarray:
    """[1, vocab]: the logits after the prompt (the generator keeps only the last position's)."""
    import onnxruntime_genai as og
    from peer_ortgenai import built_model, load

    model = load(built_model(checkpoint, "int8" if int8 else "fp32"), threads=1)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    return np.asarray(generator.get_logits(), dtype=np.float32).reshape(1, -1)


def tokenizations(checkpoint: Path) -> dict[str, list[int]]:
    """One generated line through each peer's own tokenizer (all read the checkpoint's tokenizer.json;
    llama.cpp its GGUF copy): transformers' ids, then whichever peers import."""
    from transformers import AutoTokenizer

    text = checkpoints.generated_text(32, seed=2)[0]
    out = {"transformers": AutoTokenizer.from_pretrained(checkpoint)(text)["input_ids"]}
    try:
        from peer_llamacpp import gguf_file, load

        out["llama.cpp"] = load(gguf_file(checkpoint, False), 1, 64).tokenize(text.encode(), add_bos=False)
    except ImportError:
        pass
    try:
        import onnxruntime_genai as og
        from peer_ortgenai import built_model

        out["onnxruntime-genai"] = og.Tokenizer(og.Model(str(built_model(checkpoint, "fp32")))).encode(text).tolist()
    except ImportError:
        pass
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", choices=list(checkpoints.SHAPES))
    parser.add_argument("--prompt", type=int, default=24)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--tol", type=float, default=1e-3, help="fp32 logits: largest error / largest |logit|")
    args = parser.parse_args()
    checkpoint = checkpoints.make(args.shape)
    prompt = prompt_ids(checkpoint, args.prompt)
    ref = transformers_logits(checkpoint, prompt)

    failures = []
    tokenized = tokenizations(checkpoint)
    for name, ids in tokenized.items():
        same = ids == tokenized["transformers"]
        print(f"{name:<34} tokenizer: {len(ids)} ids, same as transformers: {same}")
        if not same:
            failures.append(f"{name} tokenizer")

    def report(label: str, got: np.ndarray, fp32: bool) -> None:
        err = rel_err(got, ref[-len(got):])
        same = bool((got.argmax(-1) == ref[-len(got):].argmax(-1)).all())
        ok = err < args.tol and same
        verdict = ("ok" if ok else "DIFFERS") if fp32 else "(8-bit: reported)"
        print(f"{label:<34} logits at {len(got):>2} position(s): rel. error {err:.1e}, argmax same: {same}  {verdict}")
        if fp32 and not ok:
            failures.append(label)

    def optional(label: str, fn, *fn_args) -> np.ndarray | None:
        try:
            return fn(*fn_args)
        except ImportError as err:
            print(f"{label:<34} skipped: {err}")
            return None

    for q8 in (False, True):
        got = optional("llama.cpp", llamacpp_logits, checkpoint, prompt, q8)
        if got is not None:
            report(f"llama.cpp {'Q8_0' if q8 else 'F32'}", got, not q8)
        got = optional("onnxruntime-genai", ortgenai_logits, checkpoint, prompt, q8)
        if got is not None:
            report(f"onnxruntime-genai {'int8' if q8 else 'fp32'}", got, not q8)

    # greedy tokens, through the adapters run.py times
    from run import load_entries, timed

    entries, skipped = load_entries(checkpoint, ["transformers", "onnxruntime-genai", "llama.cpp"], [1], int8=False)
    ours, ours_skipped = load_entries(checkpoint, ["tvm-hetero"], [tvm_threads()], int8=False)
    entries, skipped = entries + ours, skipped + ours_skipped
    for line in skipped:
        print("skipped", line)
    tokens = {peer.name: timed(peer, prompt, args.new)[0] for peer in entries}
    expected = tokens.get("transformers")
    for name, got in tokens.items():
        n = agreeing(got, expected)
        print(f"{name:<34} greedy tokens as transformers: {n}/{args.new}  {'ok' if n == args.new else 'DIFFERS'}")
        if n != args.new:
            failures.append(f"{name} tokens")
    print("first tokens:", expected[:12])
    print("all fp32 peers agree" if not failures else f"disagree: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

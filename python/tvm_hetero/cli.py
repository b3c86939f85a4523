"""The ``tvm-hetero`` command: demo, compile, run, inspect.

    tvm-hetero demo                                   # ResNet-50 split over cpu:0 + cpu:1 (cuda if present)
    tvm-hetero compile model.onnx --device cpu:0=llvm --device cpu:1=llvm --place conv2d=1 -o out/
    tvm-hetero run out/ --input data=x.npy
    tvm-hetero inspect out/ --dot graph.dot
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def _progress(start: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        print(f"  [{time.perf_counter() - start:6.1f}s] {message}", flush=True)

    return say


def parse_device_specs(specs: list[str]) -> list[tuple[str, str]]:
    """``["cpu:0=llvm", "cuda:0=cuda"]`` -> ``[("cpu:0", "llvm"), ("cuda:0", "cuda")]``."""
    pairs = []
    for spec in specs:
        device, sep, target = spec.partition("=")
        if not sep or not device or not target:
            raise SystemExit(f"--device {spec!r}: expected DEVICE=TARGET, e.g. cpu:1=llvm")
        pairs.append((device, target))
    return pairs


def parse_placement(place: list[str], split: float | None, num_devices: int, num_ops: int | None = None):
    """``--place OP=DEV`` (repeatable) and/or ``--split F`` (the first F of the ops on the last device)."""
    table: dict[str, int] = {}
    for item in place:
        op, sep, dev = item.partition("=")
        if not sep or not dev.isdigit():
            raise SystemExit(f"--place {item!r}: expected OP=DEVICE_INDEX, e.g. conv2d=1")
        table[op] = int(dev)
    if split is None:
        return table or None
    if not 0.0 <= split <= 1.0:
        raise SystemExit("--split must be between 0 and 1")
    last = num_devices - 1

    def by_position(info) -> int:
        short = info.op.removeprefix("relax.")
        for key in (info.op, short, short.split(".")[-1]):
            if key in table:
                return table[key]
        return last if info.index < split * num_ops else 0

    return by_position


def count_ops(mod) -> int:
    from tvm import relax

    count = 0

    @relax.expr_functor.visitor
    class _Counter(relax.PyExprVisitor):
        def visit_call_(self, call):
            nonlocal count
            if isinstance(call.op, __import__("tvm").ir.Op):
                count += 1
            super().visit_call_(call)

    _Counter().visit_expr(mod["main"])
    return count


def default_devices() -> list[tuple[str, str]]:
    """cpu:0 + cuda:0 where a GPU exists, else two CPU devices (cpu:0 + cpu:1)."""
    import tvm

    if tvm.cuda(0).exist:
        return [("cpu:0", "llvm"), ("cuda:0", "cuda")]
    return [("cpu:0", "llvm"), ("cpu:1", "llvm")]


# ---- commands ---------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    import tvm_hetero
    from tvm_hetero import models

    start = time.perf_counter()
    say = _progress(start)
    devices = parse_device_specs(args.device) if args.device else default_devices()
    print(f"tvm-hetero demo: {args.model} (ONNX light model, seeded random weights) on "
          f"{', '.join(d for d, _ in devices)}")
    say(f"loading {args.model}")
    model = models.light_model(args.model)
    mod = models.relax_module(model)
    num_ops = count_ops(mod)
    placement = parse_placement(args.place, args.split, len(devices), num_ops)
    say(f"{num_ops} Relax ops; the first {args.split:.0%} go to {devices[-1][0]}, the rest to {devices[0][0]}")
    artifact = tvm_hetero.build(mod, devices, placement=placement, progress=say)
    print(artifact.report())

    inputs = models.model_inputs(model)
    server = None
    if args.remote:
        from tvm_hetero import rpc

        if args.remote == "local":
            say("starting a local RPC server (a second process) for the offload device")
            server = rpc.start_local_server()
            session = server.connect()
        else:
            host, _, port = args.remote.rpartition(":")
            session = rpc.connect(host, int(port))
        say(f"offloading device {len(devices) - 1} to the RPC session (one call per remote group)")
        run_devices = [artifact.devices[0], *artifact.devices[1:-1], session.cpu(0)]
        runtime = artifact.create(run_devices)
    else:
        runtime = artifact.create()
    say("running")
    runtime.run(**inputs)
    ours = runtime.get_output(0).numpy()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        runtime.run()
        times.append(time.perf_counter() - t)
    reference = models.onnxruntime_outputs(model, inputs)[0]
    error = float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-12))
    stats = runtime.stats()
    profile = runtime.profile()
    print("run")
    print(f"  latency {np.median(times) * 1e3:.1f} ms (median of {args.repeat})")
    print(f"  groups {stats['num_groups']}, copies {stats['num_copies']}, device switches {stats['device_switches']}")
    for device, us in sorted(profile["device_time_us"].items()):
        print(f"  {stats['devices'][device]:<8} busy {us / 1e3:8.1f} ms ({us / profile['total_us']:.0%})")
    if args.remote:
        print(f"  remote compute calls per run {stats['remote_compute_calls']} "
              f"(remote groups {stats['offload_segments']}), remote copies {stats['remote_copies']}")
    ok = error < 1e-4
    print(f"  logits vs onnxruntime: max relative error {error:.2e} -> {'OK' if ok else 'MISMATCH'}")
    if server is not None:
        server.stop()
    return 0 if ok else 1


def cmd_compile(args: argparse.Namespace) -> int:
    import onnx

    import tvm_hetero
    from tvm_hetero import models

    start = time.perf_counter()
    say = _progress(start)
    devices = parse_device_specs(args.device) if args.device else default_devices()
    say(f"importing {args.model}")
    model = onnx.load(args.model)
    mod = models.relax_module(model)
    placement = parse_placement(args.place, args.split, len(devices), count_ops(mod) if args.split else None)
    artifact = tvm_hetero.build(mod, devices, placement=placement, progress=say)
    out = artifact.export(args.output)
    print(artifact.report())
    print(f"wrote {out}/ (graph.json, lib.so, params.bin, manifest.json)")
    return 0


def _load_input(spec: str) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep:
        raise SystemExit(f"--input {spec!r}: expected NAME=FILE.npy")
    return name, np.load(path)


def cmd_run(args: argparse.Namespace) -> int:
    import tvm_hetero

    artifact = tvm_hetero.load(args.artifact)
    runtime = artifact.create()
    inputs = dict(_load_input(s) for s in args.input)
    missing = [n for n in artifact.input_names if n not in inputs]
    if missing:
        rng = np.random.default_rng(0)
        print(f"no --input for {', '.join(missing)}: using seeded random values")
        graph = artifact.graph
        for name in missing:
            nid = next(i for i, n in enumerate(graph["nodes"]) if n["name"] == name)
            eid = graph["node_row_ptr"][nid]
            shape, dtype = graph["attrs"]["shape"][1][eid], graph["attrs"]["dltype"][1][eid]
            inputs[name] = rng.standard_normal(shape).astype(dtype)
    runtime.run(**inputs)
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        runtime.run()
        times.append(time.perf_counter() - t)
    for i in range(runtime.get_num_outputs()):
        out = runtime.get_output(i).numpy()
        print(f"output {i}: shape {out.shape} {out.dtype}, first values {np.round(out.ravel()[:5], 4).tolist()}")
        if args.save:
            np.save(Path(args.save) / f"output_{i}.npy", out)
    print(f"latency {np.median(times) * 1e3:.2f} ms (median of {args.repeat}); stats {json.dumps(runtime.stats())}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import tvm_hetero

    artifact = tvm_hetero.load(args.artifact)
    print(artifact.report())
    graph = artifact.graph
    devices = graph["attrs"]["device_index"][1]
    print("nodes:")
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] == "null":
            continue
        ins = ", ".join(f"%{i[0]}" for i in node["inputs"])
        print(f"  %{nid:<4} dev{devices[nid]} {node['attrs']['func_name']}({ins})")
    if args.dot:
        Path(args.dot).write_text(to_dot(graph))
        print(f"wrote {args.dot} (render with: dot -Tpng {args.dot} -o graph.png)")
    return 0


DEVICE_COLOURS = ["#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#d9d9d9"]


def to_dot(graph: dict) -> str:
    """Graphviz source of the graph, nodes coloured by device, copies as diamonds."""
    devices = graph["attrs"]["device_index"][1]
    lines = ["digraph tvm_hetero {", "  rankdir=TB; node [style=filled, fontsize=10];"]
    for nid, node in enumerate(graph["nodes"]):
        colour = DEVICE_COLOURS[devices[nid] % len(DEVICE_COLOURS)]
        if node["op"] == "null":
            shape, label = "ellipse", node["name"]
        elif node["attrs"]["func_name"] == "__copy":
            shape, label = "diamond", f"copy -> dev{devices[nid]}"
        else:
            shape, label = "box", node["attrs"]["func_name"]
        lines.append(f'  n{nid} [label="{label}", shape={shape}, fillcolor="{colour}"];')
        for src in node["inputs"]:
            lines.append(f"  n{src[0]} -> n{nid};")
    lines.append("}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-hetero", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def placement_flags(p):
        p.add_argument("--device", action="append", default=[], metavar="DEV=TARGET",
                       help="device and its target, primary first (default: cpu:0=llvm, then cuda:0 or cpu:1)")
        p.add_argument("--place", action="append", default=[], metavar="OP=DEV", help="put every OP on DEV")

    demo = sub.add_parser("demo", help="compile a real model for two devices, run it, check it")
    demo.add_argument("--model", default="resnet50", help="light ONNX model (resnet50, shufflenet, ...)")
    demo.add_argument("--split", type=float, default=0.5, help="fraction of ops (in order) on the last device")
    demo.add_argument("--repeat", type=int, default=3)
    demo.add_argument("--remote", metavar="local|HOST:PORT",
                      help="run the last device in an RPC server: 'local' starts one, or give a running one")
    placement_flags(demo)
    demo.set_defaults(fn=cmd_demo)

    comp = sub.add_parser("compile", help="compile an ONNX model to an artifact directory")
    comp.add_argument("model")
    comp.add_argument("-o", "--output", required=True)
    comp.add_argument("--split", type=float, default=None)
    placement_flags(comp)
    comp.set_defaults(fn=cmd_compile)

    run = sub.add_parser("run", help="run an artifact directory")
    run.add_argument("artifact")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    run.add_argument("--repeat", type=int, default=5)
    run.add_argument("--save", metavar="DIR", help="save outputs as .npy here")
    run.set_defaults(fn=cmd_run)

    insp = sub.add_parser("inspect", help="placement, groups, copies and memory of an artifact")
    insp.add_argument("artifact")
    insp.add_argument("--dot", metavar="FILE", help="write a Graphviz picture coloured by device")
    insp.set_defaults(fn=cmd_inspect)

    board = sub.add_parser("board", help="how to start the offload server on an ARM board (or the emulated one)")
    board.set_defaults(fn=cmd_board)

    args = parser.parse_args(argv)
    return args.fn(args)


def cmd_board(args) -> int:
    from .testing.board import REAL_BOARD_INSTRUCTIONS, board_address

    print(REAL_BOARD_INSTRUCTIONS)
    address = board_address()
    print(f"emulated board: {f'running on {address[0]}:{address[1]}' if address else 'not running'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Placement, reordering and memory planning on the light ONNX models, and latency vs the Relax VM.

    PYTHONPATH=python python bench/placement.py [--models squeezenet shufflenet resnet50 inception_v1]
                                                [--threads 1] [--rounds 5]

Per model, tvm_hetero.build with two CPU devices, [(cpu(0), llvm), (cpu(1), llvm)], and two placements:

- alternate:  Relax op number i on device i % 2 (the worst case for switches and copies);
- capability: Capabilities({1: {conv2d, relu, add}, 0: everything}) -- conv2d, relu and add on
  device 1, every other op on device 0.

Printed side by side, in one run:

1. Device switches between kernels in the original order, after reordering, the optimum and a
   lower bound. For two devices the reordering is exact (greedy drain from either device, proof
   in compiler/reorder.py), so the optimum is the reordered count. The lower bound is independent
   of the reordering: the most device changes along any dependency chain of kernels (a chain that
   changes device c times needs c + 1 runs in any order), and at least one run per device used.
2. Copies and bytes copied per inference.
3. Memory of the kernel outputs (inputs and params are apart), summed over the devices: planned;
   the peak-live lower bound; the slot bound (the best any storage-id plan can do, see
   compiler/memory.py); no sharing. Then for the whole model on ONE device: our plan vs the Relax
   VM's static plan (StaticPlanBlockMemory): the module is captured right after that pass inside
   tvm.compile and its R.memory.alloc_storage sizes are summed (the returned tensor is allocated
   apart by the VM and not counted; ours counts it, a few KiB).
4. End-to-end latency (median of --rounds interleaved runs, after a warm-up), all on cpu(0):
   our runtime with everything on one device, and with each placement (both device positions
   given cpu(0), so copies are memcpy on the same CPU), vs the Relax VM. The VM compiles its own
   kernels from the same Relax module: "VM fused" uses the CPU pipeline with fusion
   (relax.backend.cpu_generic: LegalizeOps, FoldConstant, FuseOps, FuseTIR, then the same TIR
   build) -- the kernels closest to ours, which fuse the same way per device; "VM default" is
   plain tvm.compile(mod, "llvm"), whose CPU pipeline does not fuse. Every output is checked
   against onnxruntime first. The ratio to read is ours / VM fused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

MODELS = ("squeezenet", "shufflenet", "resnet50", "inception_v1")
CAPABLE = {"relax.nn.conv2d", "relax.nn.relu", "relax.add"}


def chain_lower_bound(graph: dict) -> int:
    """Fewest switches any order can have: most device changes along a kernel chain (copies bypassed)."""
    nodes = graph["nodes"]
    device = graph["attrs"]["device_index"][1]
    source = list(range(len(nodes)))  # a copy stands for the node it copies from
    need: dict[int, int] = {}  # kernel node -> runs needed by the longest chain ending there
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        if node["attrs"]["func_name"] == "__copy":
            source[nid] = source[node["inputs"][0][0]]
            continue
        preds = {source[src] for src, _, _ in node["inputs"]} & need.keys()
        need[nid] = max([need[p] + (device[p] != device[nid]) for p in preds], default=1)
    return max(max(need.values(), default=0), len({device[k] for k in need})) - 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="TVM_NUM_THREADS (default 1: stabler ratios)")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per configuration")
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM starts its pool

    import numpy as np
    import tvm
    import tvm_hetero
    from tvm import relax
    from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline
    from tvm_hetero.testing.models import light_model, model_inputs, onnxruntime_outputs, relax_module

    @tvm.instrument.pass_instrument
    class CapturePlan:
        """Keeps the module as it is right after StaticPlanBlockMemory."""

        def __init__(self) -> None:
            self.mod = None

        def run_after_pass(self, mod, info) -> None:
            if info.name == "StaticPlanBlockMemory":
                self.mod = mod

    def vm_plan(mod) -> tuple[int, int, int]:
        """(bytes of R.memory.alloc_storage, distinct kernels, kernel calls) of the planned module."""
        sizes: list[int] = []
        calls = [0]
        kernels = {gv for gv, func in mod.functions.items() if isinstance(func, tvm.tirx.PrimFunc)}

        def visit(expr) -> None:
            op = getattr(expr, "op", None) if isinstance(expr, relax.Call) else None
            if isinstance(op, tvm.ir.Op) and op.name == "relax.memory.alloc_storage":
                sizes.append(int(expr.args[0].values[0]))
            elif op in kernels:
                calls[0] += 1

        for func in mod.functions.values():
            if isinstance(func, relax.Function):
                relax.analysis.post_order_visit(func, visit)
        return sum(sizes), len(kernels), calls[0]

    cpu0 = tvm.cpu(0)
    targets = [(cpu0, "llvm"), (tvm.cpu(1), "llvm")]
    llvm = tvm.target.Target("llvm")
    placements = {
        "alternate": lambda info: info.index % 2,
        "capability": tvm_hetero.Capabilities({1: CAPABLE, 0: lambda info: True}),
    }
    mib = 2**20
    rows_switch, rows_mem, rows_single, rows_lat = [], [], [], []
    start_all = time.perf_counter()
    for name in args.models:
        t0 = time.perf_counter()
        model = light_model(name)
        inputs = model_inputs(model)
        expected = onnxruntime_outputs(model, inputs)[0]
        mod = relax_module(model)
        runs = {}  # label -> (callable running once, callable returning the output)

        def check(label: str, got, expected=expected, name=name) -> None:
            err = float(np.abs(got - expected).max()) / (float(np.abs(expected).max()) or 1.0)
            if err > 1e-4:
                raise SystemExit(
                    f"{name} {label}: output differs from onnxruntime (max rel. error {err:.1e})"
                )

        single = tvm_hetero.build(mod, [(cpu0, "llvm")])
        rt = single.create()
        rt.set_input(**inputs)
        runs["ours 1 dev"] = (rt.run, lambda rt=rt: rt.get_output(0).numpy())
        ours_single = single.build_report.memory
        for label, placement in placements.items():
            art = tvm_hetero.build(mod, targets, placement=placement)
            rep = art.build_report
            graph = json.loads(art.graph_json)
            rows_switch.append(
                (
                    name,
                    label,
                    rep.ops_per_device,
                    rep.switches_original,
                    rep.switches_reordered,
                    chain_lower_bound(graph),
                    rep.num_copies,
                    rep.bytes_copied,
                )
            )
            mem = rep.memory
            rows_mem.append(
                (
                    name,
                    label,
                    *(
                        sum(mem[k])
                        for k in ("planned_bytes", "lower_bound_bytes", "slot_bound_bytes", "unshared_bytes")
                    ),
                    max(p / b for p, b in zip(mem["planned_bytes"], mem["lower_bound_bytes"]) if b),
                    max(p / b for p, b in zip(mem["planned_bytes"], mem["slot_bound_bytes"]) if b),
                )
            )
            rt = art.create([cpu0, cpu0])
            rt.set_input(**inputs)
            runs[f"ours {label}"] = (rt.run, lambda rt=rt: rt.get_output(0).numpy())

        vm_plans = {}
        for label, pipeline in (
            ("VM fused", cpu_pipeline.get_default_pipeline(llvm)),
            ("VM default", "default"),
        ):
            capture = CapturePlan()
            with tvm.transform.PassContext(instruments=[capture]):
                executable = tvm.compile(mod, llvm, relax_pipeline=pipeline)
            vm_plans[label] = vm_plan(capture.mod)
            vm = relax.VirtualMachine(executable, cpu0)
            vm.set_input("main", *[tvm.runtime.tensor(v) for v in inputs.values()])

            def vm_output(vm=vm):
                out = vm.get_outputs("main")
                return (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()

            runs[label] = (lambda vm=vm: vm.invoke_stateful("main"), vm_output)
        single_nodes = json.loads(single.graph_json)["nodes"]
        ours_kernels = (
            sum(single.build_report.kernels_per_device),
            sum(n["op"] != "null" for n in single_nodes),
        )
        rows_single.append(
            (
                name,
                sum(ours_single["planned_bytes"]),
                sum(ours_single["lower_bound_bytes"]),
                sum(ours_single["slot_bound_bytes"]),
                vm_plans["VM fused"],
                vm_plans["VM default"],
                ours_kernels,
            )
        )

        for label, (run, output) in runs.items():  # warm-up and check
            run()
            check(label, output())
        times: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(args.rounds):  # interleaved, so drift hits every configuration alike
            for label, (run, _) in runs.items():
                start = time.perf_counter()
                run()
                times[label].append((time.perf_counter() - start) * 1e3)
        rows_lat.append((name, {label: statistics.median(t) for label, t in times.items()}))
        print(f"[{name}: {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)

    print(f"threads {args.threads}, rounds {args.rounds}, two devices cpu(0) and cpu(1), target llvm\n")
    print("Device switches between kernels, copies")
    head = (
        f"{'model':<13}{'placement':<11}{'ops/dev':>10}{'original':>9}{'reordered':>10}{'optimum':>8}"
        f"{'lower bd':>9}{'copies':>7}{'MiB copied':>11}"
    )
    print(head + "\n" + "-" * len(head))
    for name, label, ops, orig, reord, lb, copies, nbytes in rows_switch:
        print(
            f"{name:<13}{label:<11}{'/'.join(map(str, ops)):>10}{orig:>9}{reord:>10}{reord:>8}{lb:>9}"
            f"{copies:>7}{nbytes / mib:>11.2f}"
        )
    print(
        "(optimum: exact for two devices, it is the reordered count; lower bound: longest chain of device changes)"
    )

    print("\nMemory of kernel outputs, MiB, summed over both devices (ratios: worst device)")
    head = (
        f"{'model':<13}{'placement':<11}{'planned':>8}{'peak bd':>8}{'slot bd':>8}{'no share':>9}"
        f"{'plan/peak':>10}{'plan/slot':>10}{'no share/plan':>14}"
    )
    print(head + "\n" + "-" * len(head))
    for name, label, planned, peak, slot, unshared, r_peak, r_slot in rows_mem:
        print(
            f"{name:<13}{label:<11}{planned / mib:>8.2f}{peak / mib:>8.2f}{slot / mib:>8.2f}{unshared / mib:>9.2f}"
            f"{r_peak:>9.3f}x{r_slot:>9.3f}x{unshared / planned:>13.2f}x"
        )

    print("\nWhole model on one device, MiB: our plan vs the Relax VM's StaticPlanBlockMemory")
    head = (
        f"{'model':<13}{'ours':>7}{'peak bd':>8}{'slot bd':>8}{'VM fused':>9}{'VM default':>11}"
        f"{'ours/VM fused':>14}{'ours/VM default':>16}"
    )
    print(head + "\n" + "-" * len(head))
    for name, ours, peak, slot, vm_fused, vm_default, _ in rows_single:
        print(
            f"{name:<13}{ours / mib:>7.2f}{peak / mib:>8.2f}{slot / mib:>8.2f}{vm_fused[0] / mib:>9.2f}"
            f"{vm_default[0] / mib:>11.2f}{ours / vm_fused[0]:>13.3f}x{ours / vm_default[0]:>15.3f}x"
        )

    print("\nKernels compared (distinct compiled kernels / kernel calls per inference)")
    head = f"{'model':<13}{'ours 1 dev':>12}{'VM fused':>12}{'VM default':>12}"
    print(head + "\n" + "-" * len(head))
    for name, *_, vm_fused, vm_default, ours in rows_single:
        cells = [f"{k}/{c}" for k, c in (ours, vm_fused[1:], vm_default[1:])]
        print(f"{name:<13}" + "".join(f"{cell:>12}" for cell in cells))

    print(
        "\nLatency, ms (median), everything on cpu(0); ratios to VM fused (same fusion, kernels compiled by each)"
    )
    labels = list(rows_lat[0][1]) if rows_lat else []
    head = f"{'model':<13}" + "".join(f"{label:>17}" for label in labels)
    print(head + "\n" + "-" * len(head))
    for name, med in rows_lat:
        ref = med["VM fused"]
        print(f"{name:<13}" + "".join(f"{med[label]:>9.1f} {med[label] / ref:>5.2f}x " for label in labels))
    print(f"\n(total {time.perf_counter() - start_all:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

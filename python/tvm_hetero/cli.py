"""The ``tvm-hetero`` command: demo, compile, run, inspect, generate.

    tvm-hetero demo                                   # Inception-v1 placed by measured cost (cpu:0 + cpu:1, or cuda)
    tvm-hetero compile model.onnx --device cpu:0=llvm --device cpu:1=llvm --place conv2d=1 -o out/
    tvm-hetero run out/ --input data=x.npy --cluster 0=0 --cluster 1=1 --trace run.json
    tvm-hetero inspect out/ --dot graph.dot --timeline timeline.png
    tvm-hetero generate llm_dir/ --prompt "Once upon a time" --max-new-tokens 32   # a checkpoint or an export
    tvm-hetero --version                              # package, TVM and oneDNN versions, backends built in
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .errors import last_line


def _progress(start: float) -> Callable[[str], None]:
    from .progress import Progress

    return Progress(start=start)


def parse_device_specs(specs: list[str]) -> list[tuple[str, str] | str]:
    """``["cpu:0=llvm", "cuda:0=cuda", "npu=KIND:option=value"]`` -> ``[("cpu:0", "llvm"),
    ("cuda:0", "cuda"), "KIND:option=value"]``: a device kind that runs no TVM kernels (an NPU
    behind a vendor SDK) is named by its kind, options after a colon, under a label of the user's
    choice."""
    from tvm_hetero.devices import KINDS

    pairs: list[tuple[str, str] | str] = []
    for spec in specs:
        device, sep, target = spec.partition("=")
        if not sep or not device or not target:
            raise ValueError(f"--device {spec!r}: expected DEVICE=TARGET, e.g. cpu:1=llvm or npu=KIND (kinds: "
                             f"{', '.join(KINDS)})")
        kind = KINDS.get(target.partition(":")[0])
        pairs.append(target if kind is not None and kind.default_target is None else (device, target))
    return pairs


def parse_backends(specs: list[str] | None) -> list | None:
    """``--backend`` values: None (the build's default), [] for 'none', else names / (name, device)."""
    if specs is None:
        return None
    out: list = []
    for spec in specs:
        if spec == "none":
            continue
        name, _, device = spec.partition("=")
        if device and not device.isdigit():
            raise ValueError(f"--backend {spec}: expected NAME or NAME=DEVICE_POSITION")
        out.append((name, int(device)) if device else name)
    return out


def parse_place_flags(place: list[str], split: float | None, num_devices: int) -> str | dict[str, int]:
    """``--place`` and ``--split`` checked without the model (so a bad flag fails before the import):
    ``"auto"``, or the ``OP -> device`` table."""
    if "auto" in place:
        if len(place) > 1:
            raise ValueError("--place auto: give it alone (automatic placement chooses every op)")
        return "auto"
    table: dict[str, int] = {}
    for item in place:
        op, sep, dev = item.partition("=")
        if not sep or not op or not dev.isdigit():
            raise ValueError(f"--place {item!r}: expected OP=DEVICE_INDEX, e.g. conv2d=1")
        if int(dev) >= num_devices:
            raise ValueError(f"--place {item!r}: device {dev} is out of range for {num_devices} devices")
        table[op] = int(dev)
    if split is not None and not 0.0 <= split <= 1.0:
        raise ValueError(f"--split {split}: must be between 0 and 1")
    return table


def parse_placement(place: list[str], split: float | None, num_devices: int, num_ops: int | None = None):
    """``--place OP=DEV`` (repeatable) and/or ``--split F`` (the first F of the ops on the last device);
    ``--place auto`` alone: automatic placement by measured cost (``--split`` is then ignored)."""
    table = parse_place_flags(place, split, num_devices)
    if table == "auto":
        return "auto"
    if split is None:
        return table or None
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
    from tvm_hetero import devices

    return devices.default_devices()


# ---- commands ---------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    import tvm_hetero
    from tvm_hetero.importers import from_onnx
    from tvm_hetero.testing import models

    start = time.perf_counter()
    say = _progress(start)
    devices = parse_device_specs(args.device) if args.device else default_devices()
    print(f"tvm-hetero demo: {args.model} (ONNX light model, seeded random weights) on "
          f"{', '.join(d for d, _ in devices)}")
    say(f"loading {args.model}")
    model = models.light_model(args.model)
    mod = from_onnx(model)
    num_ops = count_ops(mod)
    if not args.place and args.split is None:
        args.place = ["auto"]  # the demo's default: every op's device and backend by measured cost
    placement = parse_placement(args.place, args.split, len(devices), num_ops)
    # Two CPU devices become two clusters: each device's executor on its own core, one thread.
    cores = sorted(os.sched_getaffinity(0))
    cpus = all(d.startswith("cpu") for d, _ in devices)
    clusters = ([{"cores": [c], "num_threads": 1} for c in cores[: len(devices)]]
                if cpus and len(cores) >= len(devices) and not args.remote else None)
    options = auto_options(args, len(devices))
    if placement == "auto":
        options["device_options"] = options.get("device_options") or clusters
        if args.cost_cache is None:  # the demo measures afresh: an earlier run's load is not this one's
            options["cost_cache"] = False
        say(f"{num_ops} Relax ops; automatic placement: every op's device and backend by measured cost"
            + ("" if args.cost_cache else " (measured now; --cost-cache FILE keeps the measurements)"))
    elif args.split is not None:
        say(f"{num_ops} Relax ops; the first {args.split:.0%} go to {devices[-1][0]}, the rest to {devices[0][0]}")
    artifact = tvm_hetero.build(mod, devices, placement=placement, progress=say,
                                backends=parse_backends(args.backend), **options)
    print(artifact.report())
    if placement == "auto":
        clusters = options["device_options"]
        print(_placement_verdict(artifact))

    inputs = models.model_inputs(model)
    server = None
    if args.remote:
        from tvm_hetero.runtime import rpc

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
        clusters = None
    else:
        runtime = artifact.create(device_options=clusters)
    say("running")
    runtime.run(**inputs)
    ours = runtime.get_output(0).numpy()
    singles = _single_device_runtimes(mod, devices, inputs, say, clusters) if args.compare and not args.remote else {}
    times, alone = _interleaved_latencies(runtime, singles, args.repeat)
    reference = models.onnxruntime_outputs(model, inputs)[0]
    error = float(np.abs(ours - reference).max() / max(np.abs(reference).max(), 1e-12))
    stats = runtime.stats()
    summary = runtime.timeline()
    print("run")
    print(f"  latency {np.median(times) * 1e3:.1f} ms (median of {args.repeat}), {stats['execution']} execution"
          + (f", devices pinned to cores {[o['cores'] for o in clusters]}" if clusters else ""))
    print(f"  groups {stats['num_groups']}, copies {stats['num_copies']} ({stats['bytes_copied']} B), tensors read "
          f"in place {stats['shared_edges']}, cross-device waits {stats['cross_device_waits']}")
    for device in summary["devices"]:
        print(f"  {device['name']:<8} busy {device['busy_us'] / 1e3:8.1f} ms, waiting {device['wait_us'] / 1e3:8.1f} ms")
    print(f"  overlap {summary['overlap_us'] / 1e3:.1f} ms (time both devices computed at once)")
    if args.remote:
        print(f"  remote compute calls per run {stats['remote_compute_calls']} "
              f"(remote groups {stats['offload_segments']}), remote copies {stats['remote_copies']}")
    if singles:
        _print_comparison(model, inputs, float(np.median(times)), alone, args.repeat)
    if args.timeline:
        try:
            from tvm_hetero import timeline

            timeline.draw(json.loads(runtime.module["trace"](1)), args.timeline)
            print(f"  timeline picture: {args.timeline}")
        except ImportError as err:
            print(f"  timeline picture skipped: {err}")
    ok = error < 1e-4
    print(f"  logits vs onnxruntime: max relative error {error:.2e} -> {'OK' if ok else 'MISMATCH'}")
    if server is not None:
        server.stop()
    return 0 if ok else 1


def _latencies(runtime, repeat: int) -> list[float]:
    from tvm_hetero.runtime.measure import wall_times

    return wall_times(runtime.run, repeat)


def _placement_verdict(artifact) -> str:
    """One line: which devices automatic placement set to work together, or why it kept one."""
    auto = artifact.build_report.autoplace
    busy = [row.device for row in auto.per_device if row.ops] if auto is not None else []
    check = auto.one_device_check if auto is not None else None
    if check is not None and check.kept_one_device:
        return (f"choice: everything on {check.device} -- the split measured "
                f"{check.split_measured_seconds * 1e3:.1f} ms, slower than {check.device} alone "
                f"({check.measured_seconds * 1e3:.1f} ms) on this machine now")
    if len(busy) > 1:
        return f"choice: {' + '.join(busy)} working together (ops and backends per device above)"
    why = (f"the best split found was predicted {auto.split_predicted_seconds * 1e3:.1f} ms, not "
           f"{auto.min_gain:.0%} faster" if auto is not None and auto.split_predicted_seconds is not None
           else "no split was predicted faster")
    return f"choice: everything on {busy[0] if busy else 'one device'} -- {why} than that one device alone"


def _single_device_runtimes(mod, devices, inputs, say, clusters=None) -> dict:
    """The model built for the primary device alone, run with each cluster's settings in turn (or
    with every core): the runtimes our run is compared with, by label."""
    import tvm_hetero

    say(f"building the model for {devices[0][0]} alone, for comparison")
    single_art = tvm_hetero.build(mod, devices[:1])
    singles = {}
    for position, options in enumerate(clusters or [None]):
        single = single_art.create(device_options=[options] if options else None)
        single.run(**inputs)
        label = f"{devices[position][0]} alone, " + (f"core {options['cores']}, 1 thread" if options else "every core")
        singles[label] = single
    return singles


def _interleaved_latencies(runtime, singles: dict, repeat: int) -> tuple[list[float], dict[str, float]]:
    """Our runtime's latencies and each single-device runtime's median, timed in turns (one run of
    each per round), so that the machine's load falls on all of them alike."""
    ours: list[float] = []
    alone: dict[str, list[float]] = {label: [] for label in singles}
    for _ in range(repeat):
        ours.extend(_latencies(runtime, 1))
        for label, single in singles.items():
            alone[label].extend(_latencies(single, 1))
    for single in singles.values():
        single.close()
    return ours, {label: float(np.median(t)) for label, t in alone.items()}


def _print_comparison(model, inputs, ours: float, alone: dict[str, float], repeat: int) -> None:
    """Our latency against the model on one device alone (timed in turns with ours) and onnxruntime."""
    from tvm_hetero.testing import models

    ort = {}
    for threads in (1, 2):
        session = models.onnxruntime_session(model, threads)
        session.run(None, inputs)
        ort[threads] = float(np.median([_timed(lambda s=session: s.run(None, inputs)) for _ in range(repeat)]))
    print(f"compared with (timed in turns with ours, median of {repeat}; load average {os.getloadavg()[0]:.1f})")
    for label, t in alone.items():
        print(f"  {label:<30} {t * 1e3:9.1f} ms  -> it / ours {t / ours:.2f}x")
    best_label = min(alone, key=alone.__getitem__)
    best = alone[best_label]
    verdict = ("ours is faster" if best > ours else
               f"ours is slower here: {best_label.split(',')[0]} beat the placement in this run, "
               f"at load {os.getloadavg()[0]:.1f} (the build measured it otherwise; see the choice line above)")
    print(f"  best single device: {best * 1e3:.1f} ms -> best single device / ours {best / ours:.2f}x ({verdict})")
    for threads, t in ort.items():
        print(f"  onnxruntime, {threads} thread{'s' if threads > 1 else ' '}             {t * 1e3:9.1f} ms  -> ours / "
              f"onnxruntime {ours / t:.2f}x")


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cmd_compile(args: argparse.Namespace) -> int:
    import tvm_hetero
    from tvm_hetero.importers import from_onnx

    start = time.perf_counter()
    say = _progress(start)
    devices = parse_device_specs(args.device) if args.device else default_devices()
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise FileExistsError(f"-o {args.output}: exists and is not a directory")
    parse_place_flags(args.place, args.split, len(devices))  # a bad flag fails before the import
    shapes = parse_input_shapes(args.input_shape)
    say(f"importing {args.model}")
    mod = from_onnx(args.model, shapes)
    placement = parse_placement(args.place, args.split, len(devices), count_ops(mod) if args.split else None)
    artifact = tvm_hetero.build(mod, devices, placement=placement, progress=say,
                                backends=parse_backends(args.backend), **auto_options(args, len(devices)))
    out = artifact.export(args.output)
    print(artifact.report())
    print(f"wrote {out}/ (graph.json, lib.so, params.bin, manifest.json)")
    return 0


def auto_options(args: argparse.Namespace, num_devices: int) -> dict:
    """build()'s automatic-placement arguments from the flags (empty unless ``--place auto``)."""
    if args.place != ["auto"]:
        return {}
    cache = args.cost_cache
    return {
        "objective": args.objective,
        "device_options": parse_clusters(args.cluster, num_devices),
        "cost_cache": False if cache == "none" else cache,
    }


def _load_input(spec: str) -> tuple[str, np.ndarray]:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"--input {spec!r}: expected NAME=FILE.npy")
    try:
        return name, np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"--input {name}: cannot read {path} as a .npy array ({error_line(err)})") from None


def parse_input_shapes(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """``--input-shape NAME=D0,D1,...`` flags (repeatable) as ``from_onnx``'s ``input_shapes``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) <= 0:
            raise ValueError(f"--input-shape {spec!r}: expected NAME=D0,D1,... with positive dims, "
                             "e.g. data=1,3,224,224")
        if name in shapes:
            raise ValueError(f"--input-shape {name}: given twice")
        shapes[name] = shape
    return shapes


def parse_clusters(specs: list[str], num_devices: int) -> list[dict | None] | None:
    """``--cluster DEVICE=CORE[,CORE...][:THREADS]`` flags to ``device_options`` (None if no flag)."""
    if not specs:
        return None
    options: list[dict | None] = [None] * num_devices
    for spec in specs:
        try:
            device, _, rest = spec.partition("=")
            cores, _, threads = rest.partition(":")
            d = int(device)
            option = {"cores": [int(c) for c in cores.split(",") if c != ""]}
            if threads:
                option["num_threads"] = int(threads)
        except ValueError:
            raise ValueError(f"--cluster {spec!r}: expected DEVICE=CORE[,CORE...][:THREADS], e.g. 1=1 or 0=0,1:2") from None
        if not 0 <= d < num_devices:
            raise ValueError(f"--cluster {spec!r}: device {d} is out of range for {num_devices} devices")
        options[d] = option
    return options


def _inputs_from_flags(args: argparse.Namespace, input_names: list[str],
                       graphs: list[dict]) -> dict[str, np.ndarray]:
    """``--input`` values by name, and seeded random values (shape and dtype from ``graphs``) for
    the inputs not given."""
    from tvm_hetero.artifact import graph_inputs

    inputs = dict(_load_input(s) for s in args.input)
    unknown = [n for n in inputs if n not in input_names]
    if unknown:
        raise ValueError(f"--input {unknown[0]}: the model has no input of that name (inputs: {input_names})")
    missing = [n for n in input_names if n not in inputs]
    if missing:
        rng = np.random.default_rng(0)
        print(f"no --input for {', '.join(missing)}: using seeded random values")
        declared = {name: spec for graph in graphs
                    for name, spec in graph_inputs(graph, args.artifact).items()}
        for name in missing:
            shape, dtype = declared[name]
            inputs[name] = rng.standard_normal(shape).astype(dtype)
    return inputs


def _runtime_with_inputs(args: argparse.Namespace):
    """The artifact's runtime (execution options from the flags) with every input set."""
    import tvm_hetero

    artifact = tvm_hetero.load(args.artifact)
    runtime = artifact.create(execution=args.execution,
                              device_options=parse_clusters(args.cluster, len(artifact.devices)))
    runtime.set_input(**_inputs_from_flags(args, artifact.input_names, [artifact.graph]))
    return artifact, runtime


def first_values(array: np.ndarray, count: int = 5) -> str:
    """The first ``count`` values at the array's own precision (a float32 as float32, not float64)."""
    return "[" + ", ".join(str(v) for v in array.ravel()[:count]) + "]"


def _save_dir(args: argparse.Namespace) -> Path | None:
    """``--save DIR``, created (with its parents) before anything runs."""
    if not args.save:
        return None
    folder = Path(args.save)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"--save {args.save}: exists and is not a directory")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _print_and_save_outputs(outputs: list[np.ndarray], folder: Path | None) -> None:
    for i, out in enumerate(outputs):
        print(f"output {i}: shape {out.shape} {out.dtype}, first values {first_values(out)}")
    if folder is not None:
        for i, out in enumerate(outputs):
            np.save(folder / f"output_{i}.npy", out)
        print(f"wrote {len(outputs)} output(s) to {folder}/ (output_<i>.npy)")


def cmd_run(args: argparse.Namespace) -> int:
    from tvm_hetero.artifact import is_pipeline_dir

    if is_pipeline_dir(args.artifact):
        return _run_pipeline(args)
    folder = _save_dir(args)
    _artifact, runtime = _runtime_with_inputs(args)
    runtime.run()
    times = _latencies(runtime, args.repeat)
    outputs = runtime.get_outputs()
    print(f"latency {np.median(times) * 1e3:.2f} ms (median of {args.repeat}); stats {json.dumps(runtime.stats())}")
    if args.trace:  # before the outputs are saved: a failure there must not lose the trace
        runtime.trace(args.trace)
        print(f"wrote {args.trace} (a Chrome trace: open it in https://ui.perfetto.dev or chrome://tracing)")
    _print_and_save_outputs(outputs, folder)
    return 0


def _refuse_graph_only_flags(args: argparse.Namespace, flags: list[str]) -> None:
    """A pipeline's stages always run at once, each in its own worker: graph-only flags are refused."""
    for flag in flags:
        value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if value and not (flag == "--execution" and value == "concurrent"):
            raise ValueError(f"{flag}: {args.artifact} is a pipeline, whose stages always run at once in "
                             "their own workers; this flag is for single graphs (run's stats show each "
                             "stage's busy time)")


def _pipeline_options(args: argparse.Namespace, artifact) -> dict | None:
    """``--cluster STAGE=CORES[:THREADS]`` as the pipeline's per-stage options (None: the build's)."""
    clusters = parse_clusters(args.cluster, artifact.num_stages)
    if clusters is None:
        return None
    return {**artifact.options, "stages": [option or {} for option in clusters]}


def _run_pipeline(args: argparse.Namespace) -> int:
    """``run`` on a pipeline: ``--repeat`` inferences streamed through the stages, their throughput."""
    from tvm_hetero import pipeline

    _refuse_graph_only_flags(args, ["--execution", "--trace"])
    folder = _save_dir(args)
    artifact = pipeline.load(args.artifact)
    graphs = [json.loads(g) for g in artifact.stage_graph_jsons]
    inputs = _inputs_from_flags(args, artifact.input_names, graphs)
    with artifact.create(options=_pipeline_options(args, artifact)) as pipe:
        outputs = pipe.run_batch([inputs])[0]  # warm up
        count = max(args.repeat, 1)
        t = time.perf_counter()
        pipe.run_batch([inputs] * count)
        seconds = time.perf_counter() - t
        stats = pipe.stats()
    print(f"throughput {count / seconds:.1f} inferences/s ({count} streamed through {artifact.num_stages} "
          f"stages in {seconds * 1e3:.2f} ms); stats {json.dumps(stats)}")
    _print_and_save_outputs(outputs, folder)
    return 0


def _inspect_pipeline(args: argparse.Namespace) -> int:
    """``inspect`` on a pipeline: its report, each stage's kernels, and a picture with a box per stage."""
    from tvm_hetero import pipeline

    _refuse_graph_only_flags(args, ["--timeline"])
    artifact = pipeline.load(args.artifact)
    print(artifact.report())
    graphs = [json.loads(g) for g in artifact.stage_graph_jsons]
    for s, graph in enumerate(graphs):
        print(f"stage {s} nodes:")
        for nid, node in enumerate(graph["nodes"]):
            if node["op"] != "null":
                ins = ", ".join(f"%{i[0]}" for i in node["inputs"])
                print(f"  %{nid:<4} {node['attrs']['func_name']}({ins})")
    if args.dot:
        Path(args.dot).write_text(pipeline_to_dot(graphs))
        print(f"wrote {args.dot} (render with: dot -Tpng {args.dot} -o pipeline.png)")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import tvm_hetero
    from tvm_hetero.artifact import is_pipeline_dir

    if is_pipeline_dir(args.artifact):
        return _inspect_pipeline(args)
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
    if args.timeline:
        from tvm_hetero.runtime import timeline

        _artifact, runtime = _runtime_with_inputs(args)
        runtime.run()  # warm up, then record one run
        timeline.draw(json.loads(runtime.module["trace"](1)), args.timeline)
        summary = timeline.summarize(json.loads(runtime.module["trace"](1)))
        busy = ", ".join(f"{d['name']} busy {d['busy_us'] / 1e3:.2f} ms" for d in summary["devices"])
        print(f"wrote {args.timeline}: one run of {summary['total_us'] / 1e3:.2f} ms ({busy}; "
              f"overlap {summary['overlap_us'] / 1e3:.2f} ms)")
    return 0


DEVICE_COLOURS = ["#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#d9d9d9"]


def to_dot(graph: dict) -> str:
    """Graphviz source of the graph, nodes coloured by device, copies as diamonds, and tensors
    another device reads in place (shared memory) as dashed edges."""
    lines = ["digraph tvm_hetero {", "  rankdir=TB; node [style=filled, fontsize=10];"]
    lines += _dot_nodes(graph, "n")
    lines.append("}")
    return "\n".join(lines)


def pipeline_to_dot(stage_graphs: list[dict]) -> str:
    """Graphviz source of a pipeline: one box per stage holding its graph (as :func:`to_dot`)."""
    lines = ["digraph tvm_hetero_pipeline {", "  rankdir=TB; node [style=filled, fontsize=10];"]
    for s, graph in enumerate(stage_graphs):
        lines.append(f'  subgraph cluster_{s} {{ label="stage {s}";')
        lines += ["  " + line for line in _dot_nodes(graph, f"s{s}n")]
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _dot_nodes(graph: dict, prefix: str) -> list[str]:
    devices = graph["attrs"]["device_index"][1]
    lines = []
    for nid, node in enumerate(graph["nodes"]):
        colour = DEVICE_COLOURS[devices[nid] % len(DEVICE_COLOURS)]
        if node["op"] == "null":
            shape, label = "ellipse", node["name"]
        elif node["attrs"]["func_name"] == "__copy":
            shape, label = "diamond", f"copy -> dev{devices[nid]}"
        else:
            shape, label = "box", node["attrs"]["func_name"]
        lines.append(f'  {prefix}{nid} [label="{label}", shape={shape}, fillcolor="{colour}"];')
        for src in node["inputs"]:
            in_place = node["op"] != "null" and devices[src[0]] != devices[nid] and shape != "diamond"
            edge = f"  {prefix}{src[0]} -> {prefix}{nid}"
            lines.append(f'{edge} [style=dashed, label="in place"];' if in_place else f"{edge};")
    return lines


class PrintVersion(argparse.Action):
    """``--version``: what the installed library was built with. An action rather than argparse's
    static version string, so that other commands' start does not load the library for it."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="package, TVM and oneDNN versions and the backends built in, then exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from .build_info import built_with

        print(built_with().describe())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``tvm-hetero`` argument parser: every subcommand and flag, each with its help text."""
    parser = argparse.ArgumentParser(prog="tvm-hetero", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=PrintVersion)
    sub = parser.add_subparsers(dest="command", required=True)

    def debug_flag(p):
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on error, show the Python traceback")

    def execution_flags(p):
        p.add_argument("--execution", choices=["concurrent", "serial"], default="concurrent",
                       help="devices at the same time (default) or one after another")
        p.add_argument("--cluster", action="append", default=[], metavar="DEV=CORES[:THREADS]",
                       help="pin device DEV's executor (a pipeline: stage DEV's worker) to CORES "
                            "(comma-separated) with THREADS threads (default: one per core), "
                            "e.g. --cluster 0=0 --cluster 1=1")

    def artifact_flags(p, input_help: str):
        """The artifact directory and its inputs' values, then the execution and debug flags."""
        p.add_argument("artifact", help="a directory written by compile (or by PipelineArtifact.export)")
        p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help=input_help)
        execution_flags(p)
        debug_flag(p)

    def placement_flags(p):
        p.add_argument("--device", action="append", default=[], metavar="DEV=TARGET",
                       help="device and its target, primary first (default: cpu:0=llvm, then cuda:0 or cpu:1)")
        p.add_argument("--place", action="append", default=[], metavar="OP=DEV",
                       help="put every OP on DEV; '--place auto': choose every op's device by measured cost")
        p.add_argument("--objective", choices=["latency", "calls", "throughput"], default="latency",
                       help="with --place auto: lowest latency, fewest remote calls within 10%% of it, or "
                            "the smallest bottleneck device (throughput of streamed inferences)")
        p.add_argument("--cost-cache", default=None, metavar="FILE|none",
                       help="with --place auto: measurement cache (default ~/.cache/tvm-hetero/costs.sqlite)")
        p.add_argument("--cluster", action="append", default=[], metavar="DEV=CORES[:THREADS]",
                       help="with --place auto: time device DEV pinned to CORES with THREADS threads "
                            "(default: one per core)")
        p.add_argument("--backend", action="append", default=None, metavar="NAME[=DEV]|none",
                       help="external backend, e.g. dnnl or dnnl=1; 'none': TVM kernels only "
                            "(default: oneDNN on every host CPU when libtvm_hetero has it)")

    demo = sub.add_parser("demo", help="compile a real model for two devices, run it, check it")
    demo.add_argument("--model", default="inception_v1", help="light ONNX model (inception_v1, resnet50, shufflenet, ...)")
    demo.add_argument("--split", type=float, default=None,
                      help="fraction of ops (in order) on the last device (default: --place auto)")
    demo.add_argument("--repeat", type=int, default=15, metavar="N", help="timed runs of each configuration (default 15)")
    demo.add_argument("--timeline", metavar="FILE.png", default="demo-timeline.png",
                      help="where to draw the run's timeline ('' for none; needs matplotlib)")
    demo.add_argument("--no-compare", dest="compare", action="store_false",
                      help="skip the comparison with the primary device alone and onnxruntime")
    demo.add_argument("--remote", metavar="local|HOST:PORT",
                      help="run the last device in an RPC server: 'local' starts one, or give a running one")
    placement_flags(demo)
    debug_flag(demo)
    demo.set_defaults(fn=cmd_demo)
    from tvm_hetero.devices import vendor_kinds
    from tvm_hetero.kind_record import resolve

    for record in vendor_kinds():  # each accelerator's own commands (its kind record names them)
        if record.cli is not None:
            resolve(record.cli)(sub)

    comp = sub.add_parser("compile", help="compile an ONNX model to an artifact directory")
    comp.add_argument("model", help="the ONNX model file")
    comp.add_argument("-o", "--output", required=True, metavar="DIR",
                      help="the artifact directory to write (graph.json, lib.so, params.bin, manifest.json)")
    comp.add_argument("--split", type=float, default=None, metavar="F",
                      help="put the first fraction F (0..1) of the ops, in order, on the last device and "
                           "the rest on device 0 (--place entries still win)")
    comp.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,...",
                      help="fix an input's shape, e.g. data=1,3,224,224 (repeatable; needed for symbolic dims)")
    placement_flags(comp)
    debug_flag(comp)
    comp.set_defaults(fn=cmd_compile)

    run = sub.add_parser("run", help="run an artifact or pipeline directory")
    artifact_flags(run, "an input's value (repeatable); inputs not given get seeded random values")
    run.add_argument("--repeat", type=int, default=5, metavar="N",
                     help="timed runs after one warm-up (a pipeline: inferences streamed) (default 5)")
    run.add_argument("--save", metavar="DIR", help="save outputs as DIR/output_<i>.npy (DIR is created)")
    run.add_argument("--trace", metavar="FILE.json", help="write a Chrome trace (Perfetto) of one run")
    run.set_defaults(fn=cmd_run)

    insp = sub.add_parser("inspect", help="placement, groups, copies and memory of an artifact (or a "
                                          "pipeline's stages)")
    artifact_flags(insp, "with --timeline: an input's value (repeatable; others get seeded random values)")
    insp.add_argument("--dot", metavar="FILE", help="write a Graphviz picture coloured by device")
    insp.add_argument("--timeline", metavar="FILE.png", help="run once and draw a Gantt picture per device "
                      "(needs matplotlib)")
    insp.set_defaults(fn=cmd_inspect)

    board = sub.add_parser("board", help="how to start the offload server on an ARM board (or the emulated one)")
    board.set_defaults(fn=cmd_board)

    gen = sub.add_parser("generate", help="generate tokens with a language model: a checkpoint directory "
                                          "(compiled now) or one exported by LanguageModel.export (C++ loop)")
    gen.add_argument("model", metavar="DIR", help="a Hugging Face checkpoint directory (config.json + "
                                                  "safetensors) or an exported language model")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="text, encoded with DIR/tokenizer.json")
    prompt.add_argument("--prompt-ids", metavar="ID,ID,...", help="token ids, comma-separated")
    gen.add_argument("--max-new-tokens", type=int, required=True, metavar="N", help="new tokens at most")
    gen.add_argument("--device", action="append", default=[], metavar="DEV=TARGET",
                     help="a checkpoint's device and target, primary first (default: cpu:0=llvm)")
    gen.add_argument("--capacity", type=int, default=None, metavar="N",
                     help="a checkpoint's KV cache in tokens: prompt plus new tokens (default 512)")
    gen.add_argument("--prefill-chunks", default=None, metavar="N,N,...",
                     help="a checkpoint's prefill chunk sizes (default: 16,64,256, those within the capacity)")
    gen.add_argument("--weights", choices=["float32", "int8"], default=None,
                     help="a checkpoint's matmul weights: float32 (default) or int8 (docs/llm.md)")
    gen.add_argument("--temperature", type=float, default=None, help="sample at this temperature (default: greedy)")
    gen.add_argument("--top-k", type=int, default=None, metavar="K", help="with --temperature: the K likeliest only")
    gen.add_argument("--top-p", type=float, default=None, metavar="P",
                     help="with --temperature: the likeliest tokens holding probability P")
    gen.add_argument("--seed", type=int, default=None, help="with --temperature: the sampler's seed")
    gen.add_argument("--threads", type=int, default=None, metavar="N",
                     help="threads the kernels run on (default: the runtime's, one per core)")
    debug_flag(gen)
    gen.set_defaults(fn=cmd_generate)

    parser.add_argument("--debug", action="store_true", help="on error, show the Python traceback")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("tvm-hetero: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as err:  # the one top-level handler: one line, not a traceback
        if args.debug:
            raise
        print(f"tvm-hetero {args.command}: error: {error_line(err)}", file=sys.stderr)
        return 1


def error_line(err: BaseException) -> str:
    """The message of ``err`` on one line: its last non-empty line (TVM errors end with the reason)."""
    text = last_line(err, "")
    if isinstance(err, KeyError) and text.startswith(("'", '"')) and text.endswith(("'", '"')):
        text = text[1:-1]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def cmd_generate(args: argparse.Namespace) -> int:
    """Prompt in, new tokens out (ids, and text with a tokenizer.json), then prefill and decode speeds.
    An exported directory runs on the C++ loop (tvm_hetero.llm.native); a checkpoint is compiled first."""
    from .llm.export import MANIFEST_FILE, TOKENIZER_FILE

    start = time.perf_counter()
    say = _progress(start)
    directory = Path(args.model)
    if not directory.is_dir():
        raise FileNotFoundError(f"{args.model}: no such directory")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    exported = (directory / MANIFEST_FILE).is_file()
    if exported and (args.device or args.capacity is not None or args.prefill_chunks is not None or args.weights):
        raise ValueError(f"{args.model} is an exported model: its devices, capacity, chunks and weights were fixed at "
                         "export (--device, --capacity, --prefill-chunks and --weights apply to a checkpoint "
                         "directory)")
    tokenizer = None
    if (directory / TOKENIZER_FILE).is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    if args.prompt is not None:
        if tokenizer is None:
            raise ValueError(f"--prompt needs {directory / TOKENIZER_FILE}; give token ids with --prompt-ids")
        prompt_ids = tokenizer.encode(args.prompt).ids
    else:
        prompt_ids = _parse_ids(args.prompt_ids, "--prompt-ids")
    options = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed}
    if exported:
        from .llm.native import NativeGenerator

        say(f"loading {directory} (exported; the C++ generation loop)")
        model = NativeGenerator(directory, args.threads)
    else:
        from . import llm
        from .llm.builder import DEFAULT_PREFILL_CHUNKS

        targets = parse_device_specs(args.device) if args.device else None
        capacity = 512 if args.capacity is None else args.capacity
        if args.prefill_chunks is not None:
            chunks = _parse_ids(args.prefill_chunks, "--prefill-chunks")
        else:
            chunks = [c for c in DEFAULT_PREFILL_CHUNKS if c <= capacity] or [capacity]
        say(f"compiling {directory}")
        model = llm.build(str(directory), targets, capacity=capacity, prefill_chunks=chunks, progress=say,
                          weights=args.weights or "float32",
                          device_options=[{"num_threads": args.threads}] if args.threads else None)
    say(f"generating up to {args.max_new_tokens} tokens after a prompt of {len(prompt_ids)}")
    began = time.perf_counter()
    tokens, first_at = [], began
    print("new tokens:", end="", flush=True)
    for token in model.stream(prompt_ids, args.max_new_tokens, **options):
        if not tokens:
            first_at = time.perf_counter()
        tokens.append(token)
        print(f" {token}", end="", flush=True)
    ended = time.perf_counter()
    print()
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(tokens)!r}")
    if exported:  # measured inside the C++ loop
        times = model.last_times
        prefill_rate, decode_rate = times.prefill_tokens_per_second, times.decode_tokens_per_second
    else:  # the first token comes after the prefill; the rest are decode steps
        prefill_rate = len(prompt_ids) / (first_at - began)
        decode_rate = (len(tokens) - 1) / (ended - first_at) if len(tokens) > 1 else 0.0
    print(f"prefill: {len(prompt_ids)} tokens, {prefill_rate:.1f} tokens/s; "
          f"decode: {max(len(tokens) - 1, 0)} tokens, {decode_rate:.1f} tokens/s")
    return 0


def _parse_ids(text: str, flag: str) -> list[int]:
    """``"1,2,3"`` -> ``[1, 2, 3]``; anything else is an error naming the flag and the item."""
    ids = []
    for item in text.split(","):
        try:
            ids.append(int(item))
        except ValueError:
            raise ValueError(f"{flag}: {item.strip()!r} is not an integer (expected e.g. 1,2,3)") from None
    return ids


def cmd_board(args) -> int:
    from .testing.board import REAL_BOARD_INSTRUCTIONS, board_address

    print(REAL_BOARD_INSTRUCTIONS)
    address = board_address()
    print(f"emulated board: {f'running on {address[0]}:{address[1]}' if address else 'not running'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile a pipeline: stage graphs, one kernel library, params and wiring (plain data).

**Same bits as the unsplit graph.** Every stage runs the kernels of the one-device graph, in the
same order, from one library compiled once (when all stages share a target), so each inference
is bit-identical to the unsplit graph (``PipelineArtifact.unsplit``, or ``tvm_hetero.build`` of
the same module on one device).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm

from ..compile_kernels import compile_kernels
from ..memory import planned_json
from .auto_split import MeasureKernels, auto_split
from .kernel_order import PipelineSplit, split
from .stage_graphs import stage_graphs
from .stages import StageSpec, check_regions_fit, stage_backends, stage_options, stage_specs


@dataclass
class CompiledPipeline:
    """What :func:`build` makes; ``tvm_hetero.pipeline.build`` wraps it as a ``PipelineArtifact``."""

    #: The graph of each stage (docs/graph-format.md), in pipeline order.
    stage_graph_jsons: list[str]
    #: Every stage's kernels.
    lib: tvm.runtime.Module
    #: Parameter and constant values by name; each stage gets those it declares in the wiring.
    params: dict[str, np.ndarray]
    #: How stages connect (docs/pipeline.md, wiring schema).
    wiring: dict
    stage_devices: list[tvm.runtime.Device]
    stage_targets: list[str]
    input_names: list[str]
    #: Default pipeline options of ``create`` (queue capacity, per-stage cores and threads).
    options: dict = field(default_factory=dict)
    #: The whole one-device graph over the same library (None when stage targets differ).
    unsplit_graph_json: str | None = None
    #: The split: points, kernels per stage, boundary bytes, modelled stage costs.
    split: dict | None = None


def _compile_for_stages(plan: PipelineSplit, targets: list[tvm.target.Target]) -> tuple[Any, list[dict]]:
    """One library for every stage, and per stage the kernel renames it needs.

    With one target (the usual case) this is the library the unsplit graph uses, compiled once
    (or taken from auto_split's measuring). With several, each target compiles the kernels of its
    stages; a kernel already compiled for an earlier target gets a suffixed copy (``name_t1``).
    """
    lowered = plan.lowered
    names = list(dict.fromkeys(str(t) for t in targets))
    if len(names) == 1:
        lib = plan.libs.get(names[0]) or compile_kernels(lowered, [targets[0]])
        plan.libs[names[0]] = lib
        return lib, [{} for _ in targets]
    group = [names.index(str(t)) for t in targets]
    used: list[set[str]] = [set() for _ in names]
    for s, (a, b) in enumerate(plan.ranges()):
        used[group[s]].update(k.func_name for k in plan.kernels[a:b] if k.func_name in lowered.kernel_devices)
    renames: list[dict[str, str]] = [{} for _ in names]
    funcs, devices, seen = {}, {}, set()
    for g, kernel_names in enumerate(used):
        for name in sorted(kernel_names):
            new = f"{name}_t{g}" if name in seen else name
            renames[g][name] = new
            funcs[tvm.ir.GlobalVar(new)] = lowered.kernels[name].with_attr("global_symbol", new)
            devices[new] = g
        seen |= kernel_names
    by_target = dataclasses.replace(
        lowered, kernels=tvm.IRModule(funcs), kernel_devices=devices, num_devices=len(names)
    )
    lib = compile_kernels(by_target, [targets[group.index(g)] for g in range(len(names))])
    return lib, [{k: v for k, v in renames[group[s]].items() if k != v} for s in range(len(targets))]



def build(
    mod: tvm.IRModule,
    stages: StageSpec | list[StageSpec],
    split_points: Sequence[int | str] | int | PipelineSplit | None = None,
    params: Mapping[str, Any] | None = None,
    *,
    measure: MeasureKernels | None = None,
    options: Mapping[str, Any] | None = None,
    entry: str = "main",
    backends: Sequence[Any] | None = None,
    rounds: int = 5,
    tolerance: float = 0.02,
    progress: Callable[[str], None] | None = None,
) -> CompiledPipeline:
    """Compile ``mod`` as a pipeline of stages: stage graphs, one library, params and wiring.

    Parameters
    ----------
    stages : a list with one stage spec per stage (``(device, target)``, a device such as
        ``"cpu:0"``, or a target such as ``"llvm"``), or one spec for every stage.
    split_points : kernel positions or names where stages 1.. begin (``split``); an int, the
        number of stages, or None (one per entry of ``stages``) to choose them with
        ``auto_split``; or a ``PipelineSplit`` of the same module and params.
    measure : times kernels for auto_split (needed when ``split_points`` is None or an int;
        ``tvm_hetero.pipeline.build`` passes the runtime's).
    options : pipeline options kept as the default of ``PipelineArtifact.create`` and used to
        measure for auto_split: ``{"queue_capacity": 2, "stages": [{"cores": [0], "num_threads": 1}]}``.
    backends : external backends, as in ``tvm_hetero.build``; None (default) is its default:
        oneDNN when every stage is a host CPU and libtvm_hetero has it (``stages.stage_backends``).
    rounds, tolerance : for auto_split.
    """
    say = progress or (lambda _msg: None)
    if isinstance(split_points, PipelineSplit):
        plan = split_points
        specs = stage_specs(stages, plan.num_stages)
    elif split_points is None or isinstance(split_points, int):
        if measure is None:
            raise ValueError("choosing split points (split_points None or an int) needs a measure callable")
        specs = stage_specs(stages, split_points)
        plan = auto_split(
            mod,
            len(specs),
            list(specs),
            params,
            measure=measure,
            options=options,
            rounds=rounds,
            tolerance=tolerance,
            entry=entry,
            backends=backends,
            progress=say,
        )
    else:
        specs = stage_specs(stages, len(split_points) + 1)
        say("lowering")
        plan = split(mod, split_points, params, entry=entry, backends=stage_backends(backends, specs))
    stage_options(options, len(specs))  # checks the number of entries
    lowered, graph = plan.lowered, plan.graph
    if lowered is None or graph is None:
        raise ValueError("the PipelineSplit carries no lowered graph (it was loaded); split the module again")
    check_regions_fit(lowered.regions, specs)
    targets = [t for _, t in specs]
    say(f"compiling kernels for {len(set(map(str, targets)))} target(s)")
    lib, renames = _compile_for_stages(plan, targets)
    graphs, wiring = stage_graphs(
        graph, plan.kernels, plan.ranges(), lowered.input_names, set(lowered.params)
    )
    jsons = []
    for stage_graph, rename in zip(graphs, renames):
        for node in stage_graph.nodes:
            node.func_name = rename.get(node.func_name, node.func_name)
        jsons.append(planned_json(stage_graph))
    same_target = len({str(t) for t in targets}) == 1
    return CompiledPipeline(
        stage_graph_jsons=jsons,
        lib=lib,
        params=dict(lowered.params),
        wiring=wiring,
        stage_devices=[dev for dev, _ in specs],
        stage_targets=[str(t) for t in targets],
        input_names=list(lowered.input_names),
        options=json.loads(json.dumps(dict(options or {}))),
        unsplit_graph_json=planned_json(graph) if same_target else None,
        split=plan.to_dict(),
    )

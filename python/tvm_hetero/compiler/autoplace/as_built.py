"""A placement predicted as the build makes it: blocks and all.

The unit model (:mod:`.measured`) times a backend's regions one at a time, but the build joins the
consecutive regions of a device into *blocks* (docs/byoc.md: one call, layouts kept inside), which
run 1.2-1.5x faster than their regions timed apart, and a split over devices cuts them. A
placement is therefore judged on the graph the build makes of it: the prepared module is lowered
with that placement and the backends it chose, exactly as the build lowers it (reordered, copies
inserted), and every node of that graph -- TVM kernel, region or block -- gets its own measured
time (from the cache where the units' measuring or an earlier judgement timed it: equal kernels
share one key; a new block is timed here). The schedule model then runs on that graph.

Guarantee: the graph predicted is the graph built (same lowering, same backends, same order), so
the prediction charges every kernel and block that will run and nothing else; what it leaves out
is the runtime's own cost per node (a few microseconds) and the difference between a node timed
in the measuring graph and in the model's graph.

Judging (:func:`judge_candidates`): every single-device placement (each unit's fastest variant,
and every region the backend forms there), the solver's split (both ways) and a split solved on
the block-aware unit model (:func:`block_aware_model`) are predicted as built, and the best split
is judged against the best single device the one way every placement is
(:func:`tvm_hetero.placement_judgement.judge`, both figures modeled). Guarantee: the choice is
never predicted slower than the best single-device candidate, and a split is chosen only if it is
predicted more than ``min_gain`` faster than it. A better split the solver does not propose
stays unfound: the unit model sees blocks only through calibrated edge savings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...backends import Backend
from ...graph import Graph
from ...placement_judgement import MODELED, Cost
from ...placement_judgement import judge as judge_placement
from ..lower import LoweredGraph
from ..placement import OpInfo
from ..schedule_model import CostModel, simulate
from .cost_cache import node_key
from .kernel_times import KernelTimes
from .units import TVM, Part

#: ``lower(module, choose, backends) -> (lowering, graph as run)``: the build's own lowering
#: (:func:`tvm_hetero.compiler.build.lower_as_built`) of the prepared module for an op placement
#: and the backends that form the chosen regions.
LowerAsBuilt = Callable[[Any, Callable[[OpInfo], int], list[Backend]], tuple[LoweredGraph, Graph]]


@dataclass
class BuiltPrediction:
    """One placement lowered as built and predicted."""

    #: Predicted latency of one inference (seconds).
    seconds: float
    #: Nodes that compute (kernels, regions, blocks), and how many of them are blocks.
    nodes: int
    blocks: int
    #: Per device: predicted busy time.
    device_busy: list[float]


def predict_as_built(lowered: LoweredGraph, graph: Graph, times: KernelTimes, links: CostModel) -> BuiltPrediction:
    """The latency of ``graph`` (the build's graph of ``lowered``) with every node's time on its
    device (timed alone where one device computes everything, else with the devices together),
    measuring the nodes no time is known for; copies, hand-offs and remote calls cost what
    ``links`` says (the unit model's measurements)."""
    num_devices = len(times.devices)
    computing = [n for n in lowered.graph.nodes if not (n.is_input or n.is_copy)]
    kind = times.alone if len({n.device for n in computing}) <= 1 else "kernel"
    wanted: list[dict[str, Part]] = [{} for _ in range(num_devices)]
    key_of: dict[str, str] = {}
    blocks = 0
    for nid, node in enumerate(lowered.graph.nodes):
        if node.is_input or node.is_copy:
            continue
        key = node_key(lowered, nid)
        if key is None:
            raise ValueError(f"automatic placement: node {node.name} ({node.func_name}) calls no kernel or region")
        region = lowered.regions.get(node.func_name)
        blocks += region is not None and region.pattern == "block"
        part = Part(region.backend if region is not None else TVM, 0, nid, node.func_name,
                    node.func_name if region is not None else None, key)
        wanted[node.device].setdefault(key, part)
        key_of[node.name] = key
    times.measure(times.missing(wanted, [kind]), [lowered], [kind], what="kernels and blocks")

    index_of: dict[int, int] = {}  # graph node id -> model kernel index
    source_of: dict[int, int] = {}  # copy node id -> the node it copies
    costs: list[list[float]] = []
    preds: list[list[int]] = []
    out_bytes: list[int] = []
    placement: list[int] = []
    for nid, node in enumerate(graph.nodes):
        if node.is_input:
            continue
        producers = [source_of.get(e.node, e.node) for e in node.inputs]
        if node.is_copy:
            source_of[nid] = producers[0]
            continue
        row = [float("inf")] * num_devices
        row[node.device] = times.of(kind, node.device)[key_of[node.name]]
        index_of[nid] = len(costs)
        costs.append(row)
        preds.append(sorted({index_of[p] for p in producers if p in index_of}))
        out_bytes.append(sum(node.output_bytes(i) for i in range(node.num_outputs)))
        placement.append(node.device)
    model = CostModel(costs, preds, out_bytes, links.copy_latency, links.copy_seconds_per_byte, links.call_latency,
                      links.shares_memory, links.sync_latency, spin_window=links.spin_window)
    schedule = simulate(model, placement)
    return BuiltPrediction(schedule.makespan, len(costs), blocks, schedule.device_busy)


@dataclass
class Candidate:
    """A placement to judge: a device and a variant (``"tvm"`` or a backend) per unit."""

    label: str
    assignment: list[int]
    variants: list[str]


class Judge:
    """Predicts placements as built: ``placing(candidate) -> (op placement, backends)`` turns a
    candidate into what the build lowers."""

    def __init__(self, lower: LowerAsBuilt, module: Any, times: KernelTimes, links: CostModel,
                 placing: Callable[[Candidate], tuple[Callable[[OpInfo], int], list[Backend]]]) -> None:
        self.lower, self.module, self.times, self.links, self.placing = lower, module, times, links, placing

    def predict(self, choose: Callable[[OpInfo], int], backends: list[Backend], module: Any = None) -> BuiltPrediction:
        """An op placement of ``module`` (default: the prepared one) with ``backends``, lowered as
        built and predicted."""
        lowered, graph = self.lower(self.module if module is None else module, choose, backends)
        return predict_as_built(lowered, graph, self.times, self.links)

    def candidate(self, candidate: Candidate) -> BuiltPrediction:
        return self.predict(*self.placing(candidate))


def judge_candidates(judge: Judge, model: CostModel, split: Sequence[int],
                     variants_of: Callable[..., list[str]], together: Variants, apart: Variants,
                     solve: Callable[[CostModel], Any], min_gain: float,
                     say: Callable[[str], None]) -> dict[str, Any]:
    """Judge as built every single-device placement (each unit's fastest variant; every region the
    backends form there), the solver's ``split`` (both ways), and the split solved on the
    block-aware model (:func:`block_aware_model`, calibrated on the single-device builds); keep the
    best split only if it is predicted more than ``min_gain`` faster than the best single device. Returns the
    decision as JSON: its label, assignment and variants, every candidate's predicted seconds and
    details, and the best split's prediction where a single device was kept."""
    num_units, num_devices = model.num_kernels, model.num_devices
    candidates: dict[str, Candidate] = {}

    def add(label: str, assignment: Sequence[int], variants: list[str]) -> None:
        if all((c.assignment, c.variants) != (list(assignment), variants) for c in candidates.values()):
            candidates[label] = Candidate(label, list(assignment), variants)

    for d in range(num_devices):
        if model.feasible([d] * num_units):
            add(f"all on device {d}", [d] * num_units, variants_of([d] * num_units))
            add(f"all on device {d}, every region", [d] * num_units, every_region([d] * num_units, apart))
    if len(set(split)) > 1:
        add("split", split, variants_of(split))
        add("split, every region", split, every_region(split, together))
    say(f"automatic placement: predicting {len(candidates)} placements as built (blocks and all)")
    predicted = {label: judge.candidate(c) for label, c in candidates.items()}

    blocks = block_aware_model(model, together, apart, predicted, candidates)
    if blocks is not None:
        block_model, block_variants = blocks
        placement = list(solve(block_model).placement)
        if len(set(placement)) > 1:
            label = "split, blocks considered"
            add(label, placement, [block_variants[u][d] for u, d in enumerate(placement)])
            if label in candidates:
                predicted[label] = judge.candidate(candidates[label])

    singles = [c for c in candidates.values() if len(set(c.assignment)) == 1]
    splits = [c for c in candidates.values() if len(set(c.assignment)) > 1]
    best_single = min(singles, key=lambda c: predicted[c.label].seconds, default=None)
    best_split = min(splits, key=lambda c: predicted[c.label].seconds, default=None)
    verdict = None
    if best_split is not None and best_single is not None:
        how = "as built, from measured kernels and blocks"
        verdict = judge_placement(Cost(predicted[best_split.label].seconds, MODELED, how),
                                  Cost(predicted[best_single.label].seconds, MODELED, how),
                                  min_gain=min_gain, candidate_name=best_split.label, baseline_name=best_single.label)
    chosen = best_single if verdict is not None and not verdict.kept else best_split or best_single
    if chosen is None:
        raise ValueError("automatic placement: no placement to judge (no device may run every unit, no split)")
    kept_single = best_split is not None and chosen is best_single
    return {
        "label": chosen.label, "assignment": chosen.assignment, "variants": chosen.variants,
        "verdict": verdict.explain() if verdict is not None else None,
        "predicted": {label: p.seconds for label, p in predicted.items()},
        "split_predicted": predicted[best_split.label].seconds if kept_single else None,
        # "device": the one device a candidate puts everything on (None: a split).
        "details": {label: {"nodes": p.nodes, "blocks": p.blocks, "device_busy": p.device_busy,
                            "device": _one_device(candidates[label].assignment)}
                    for label, p in predicted.items()},
    }


def _one_device(assignment: Sequence[int]) -> int | None:
    return assignment[0] if assignment and len(set(assignment)) == 1 else None


#: ``variants[u][d][variant] -> seconds``: a unit's time on a device in each variant.
Variants = list[list[dict[str, float]]]


def every_region(assignment: Sequence[int], variants: Variants) -> list[str]:
    """Per unit a backend's variant wherever one runs on its device, else TVM kernels."""
    return [next((v for v in variants[u][d] if v != TVM), TVM) for u, d in enumerate(assignment)]


def block_aware_model(model: CostModel, together: Variants, apart: Variants,
                      predicted: dict[str, BuiltPrediction], candidates: dict[str, Candidate]
                      ) -> tuple[CostModel, list[list[str]]] | None:
    """The unit model with what blocks save, calibrated on each device's single-device build with
    every region (measured as built): a unit runs its backend's variant wherever one runs; the time
    that build saved against its units timed apart (``saved``) is spread over the edges between
    two such units, in proportion to the bytes crossing each (the layout conversions a block
    avoids scale with them), and an edge saves it only when both ends share the device. A unit
    whose region is slower than its TVM kernels by more than its edges can save runs as TVM kernels.
    Exact for each calibrating build (its prediction is that build's); a split keeps the savings
    of the edges it does not cut. Returns the model and each unit's variant per device, or None
    where no build showed a saving."""
    num_units, num_devices = model.num_kernels, model.num_devices
    variant = [[next((v for v in apart[u][d] if v != TVM), TVM if TVM in apart[u][d] else "") for d in
                range(num_devices)] for u in range(num_units)]
    saving: list[dict[int, list[float]]] = [{} for _ in range(num_units)]
    any_saving = False
    for d in range(num_devices):
        label = next((f"all on device {d}{tail}" for tail in (", every region", "")
                      if f"all on device {d}{tail}" in candidates
                      and candidates[f"all on device {d}{tail}"].variants == [variant[u][d] for u in range(num_units)]),
                     None)
        if label is None:
            continue
        apart_sum = sum(apart[u][d][variant[u][d]] for u in range(num_units))
        saved = apart_sum - predicted[label].device_busy[d]
        edges = [(p, k) for k in range(num_units) for p in model.preds[k]
                 if variant[p][d] not in (TVM, "") and variant[k][d] not in (TVM, "")]
        weight = sum(model.out_bytes[p] for p, _k in edges)
        if saved <= 0 or not edges or weight <= 0:
            continue
        any_saving = True
        for p, k in edges:
            saving[k].setdefault(p, [0.0] * num_devices)[d] = saved * model.out_bytes[p] / weight
        for u in range(num_units):  # a slow region its edges cannot pay for: TVM kernels instead
            if variant[u][d] in (TVM, "") or TVM not in apart[u][d]:
                continue
            could_save = (sum(s[d] for s in saving[u].values())
                          + sum(saving[k][u][d] for k in model.succs[u] if u in saving[k]))
            if apart[u][d][variant[u][d]] - could_save > apart[u][d][TVM]:
                variant[u][d] = TVM
                for s in saving[u].values():
                    s[d] = 0.0
                for k in model.succs[u]:
                    if u in saving[k]:
                        saving[k][u][d] = 0.0
    if not any_saving:
        return None

    def cost(table: Variants) -> list[list[float]]:
        return [[table[u][d].get(variant[u][d], float("inf")) for d in range(num_devices)] for u in range(num_units)]

    return (dataclasses.replace(model, kernel_cost=cost(together), alone_cost=cost(apart), edge_saving=saving),
            variant)

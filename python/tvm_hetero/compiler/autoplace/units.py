"""The units automatic placement decides on: sets of ops that run on one device, each with the ways
(variants) it can be computed there -- as TVM kernels, or as a backend's regions.

Two lowerings of the same (prepared) module with every op on one device are compared: one with TVM
kernels only, one with the backends' regions (and the TVM kernels of the ops the regions leave).
A TVM kernel and a region may hold different sets of ops (a region may take a bias add that TVM
fuses elsewhere, or several consecutive ops), so a *unit* is the smallest set of ops that both
lowerings cover exactly: ops are joined when one kernel or one region holds them both (union-find
over both lowerings' nodes). Every unit can then be computed either way with the same inputs and
outputs: as the TVM kernels of the first lowering (variant ``"tvm"``), or as the regions and
kernels of the second (variant: the backend's name). Units that would depend on each other both
ways (a cycle, possible when overlapping groups are joined) are merged into one.

Guarantee: the units partition the ops that some kernel computes (ops folded at build time belong
to none and follow a unit that reads them); the unit graph is acyclic and numbered in a
topological order; every TVM kernel and every identified region lies inside one unit. Placing all
ops of a unit on one device therefore makes the lowering produce exactly that unit's kernels (or
regions) on that device, since fusion never crosses devices.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..lower import LoweredGraph
from ..placement import OpInfo

TVM = "tvm"


@dataclass
class Part:
    """One node of a lowering inside a unit: a TVM kernel or a region, with its measurement key."""

    #: ``"tvm"`` or the backend's name.
    variant: str
    #: Which lowering (0: TVM only, 1: with regions) and its graph node id.
    lowering: int
    node_id: int
    #: The kernel's or region's name in that lowering.
    func_name: str
    #: Region only: the anchor op's name.
    anchor: str | None = None
    #: Its measurement key (filled in by automatic placement).
    key: str = ""


@dataclass
class Units:
    """The unit DAG (see the module docstring)."""

    #: Op names of each unit, in op order.
    ops: list[list[str]]
    #: ``preds[u]``: units whose outputs unit ``u`` reads (each ``< u``).
    preds: list[list[int]]
    #: Bytes leaving each unit (its outputs read by other units or returned).
    out_bytes: list[int]
    #: ``variants[u][name]``: the parts computing unit ``u`` that way (``"tvm"`` always present).
    variants: list[dict[str, list[Part]]]
    #: Unit of each op name; None for ops folded at build time.
    unit_of: dict[str, int | None]
    #: For an op with no unit: the unit of an op reading it (or None).
    follows: dict[str, int | None]
    #: Relax op names of each unit (for reports).
    relax_ops: list[list[str]] = field(default_factory=list)
    #: Ops of each unit some TVM kernel computes (not those folded at build time, such as the
    #: reshape of a bias a region takes in): what a capability table is asked about.
    computed: list[list[str]] = field(default_factory=list)

    @property
    def num_units(self) -> int:
        return len(self.ops)

    def to_json(self) -> dict:
        """A JSON document :meth:`from_json` reads back (what a rebuild takes from the cache)."""
        return {
            "ops": self.ops, "preds": self.preds, "out_bytes": self.out_bytes, "relax_ops": self.relax_ops,
            "unit_of": self.unit_of, "follows": self.follows, "computed": self.computed,
            "variants": [{v: [[p.variant, p.lowering, p.node_id, p.func_name, p.anchor, p.key] for p in parts]
                          for v, parts in unit.items()} for unit in self.variants],
        }

    @classmethod
    def from_json(cls, doc: dict) -> Units:
        variants = [{v: [Part(*p) for p in parts] for v, parts in unit.items()} for unit in doc["variants"]]
        return cls(doc["ops"], doc["preds"], doc["out_bytes"], variants, doc["unit_of"], doc["follows"],
                   doc["relax_ops"], doc["computed"])


def make_units(
    ops: Sequence[OpInfo],
    tvm_lowering: LoweredGraph,
    region_lowering: LoweredGraph | None = None,
    region_ops: Sequence[tuple[str, str, frozenset[str]] | None] = (),
) -> Units:
    """Units of ``ops`` (the prepared module's op calls) from the TVM-only lowering and, if given,
    the lowering with regions; ``region_ops[k]`` is ``(backend, anchor, op names)`` of the k-th
    region node of ``region_lowering`` in graph order, or None where it could not be identified."""
    names = [info.name for info in ops]
    if len(set(names)) != len(names):
        raise ValueError("automatic placement: the module binds two ops to one variable name")
    position = {name: i for i, name in enumerate(names)}
    parent = list(range(len(names)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(group: Sequence[str]) -> None:
        ids = [position[n] for n in group if n in position]
        for other in ids[1:]:
            a, b = find(ids[0]), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)

    node_ops: list[dict[int, list[str]]] = []  # per lowering: node id -> op names
    parts: list[Part] = []
    untied = False  # a region not tied to its ops: only units the region lowering covers exactly get its variant
    for lowering_id, lowered in enumerate([tvm_lowering, region_lowering]):
        table: dict[int, list[str]] = {}
        node_ops.append(table)
        if lowered is None:
            continue
        by_index = {info.index: info.name for info, _device in lowered.op_placement}
        region_k = 0
        for nid, node in enumerate(lowered.graph.nodes):
            if node.is_input:
                continue
            if node.func_name in lowered.regions:
                tied = region_ops[region_k] if region_k < len(region_ops) else None
                region_k += 1
                if tied is None:
                    untied = True
                    table[nid] = []
                    continue
                backend, anchor, members = tied
                table[nid] = sorted(members, key=lambda n: position.get(n, -1))
                parts.append(Part(backend, 1, nid, node.func_name, anchor))
            else:
                table[nid] = [by_index[i] for i in lowered.node_op_indices.get(node.name, [])]
                parts.append(Part(TVM if lowering_id == 0 else "", lowering_id, nid, node.func_name))
            union(table[nid])
    if region_lowering is not None and region_k != len(region_ops):
        raise ValueError(f"automatic placement: {region_k} region nodes, {len(region_ops)} regions identified")

    # the unit of every node, and the root of every unit
    root_of_part = []
    for part in parts:
        members = [position[n] for n in node_ops[part.lowering][part.node_id] if n in position]
        root_of_part.append(find(members[0]) if members else None)
    roots = sorted({r for r in root_of_part if r is not None})
    if any(root is None and part.lowering == 0 for part, root in zip(parts, root_of_part)):
        raise ValueError("automatic placement: a kernel computes no tracked op (internal error)")

    # condense cycles: edges between roots from both lowerings
    succ: dict[int, set[int]] = {r: set() for r in roots}
    node_root: list[dict[int, int]] = [{} for _ in node_ops]
    for part, root in zip(parts, root_of_part):
        if root is not None:
            node_root[part.lowering][part.node_id] = root
    for lowering_id, lowered in enumerate([tvm_lowering, region_lowering]):
        if lowered is None:
            continue
        for nid, node in enumerate(lowered.graph.nodes):
            dst = node_root[lowering_id].get(nid)
            for edge in node.inputs:
                src = node_root[lowering_id].get(edge.node)
                if src is not None and dst is not None and src != dst:
                    succ[src].add(dst)
    component = _strongly_connected(roots, succ)
    comp_ids = sorted(set(component.values()))
    # order the components topologically, earliest op first among the ready ones
    first_op = {}
    for r in roots:
        c = component[r]
        first_op[c] = min(first_op.get(c, r), r)
    comp_succ: dict[int, set[int]] = {c: set() for c in comp_ids}
    for r in roots:
        for s in succ[r]:
            if component[s] != component[r]:
                comp_succ[component[r]].add(component[s])
    indegree = {c: 0 for c in comp_ids}
    for c in comp_ids:
        for s in comp_succ[c]:
            indegree[s] += 1
    ready = [(first_op[c], c) for c in comp_ids if indegree[c] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, c = heapq.heappop(ready)
        order.append(c)
        for s in comp_succ[c]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (first_op[s], s))
    unit_of_comp = {c: u for u, c in enumerate(order)}
    num_units = len(order)
    unit_of_root = {r: unit_of_comp[component[r]] for r in roots}

    unit_ops: list[list[str]] = [[] for _ in range(num_units)]
    unit_of: dict[str, int | None] = {}
    for i, name in enumerate(names):
        u = unit_of_root.get(find(i))
        unit_of[name] = u
        if u is not None:
            unit_ops[u].append(name)
    variants: list[dict[str, list[Part]]] = [{TVM: []} for _ in range(num_units)]
    backend_of_unit: list[str | None] = [None] * num_units
    for part, root in zip(parts, root_of_part):
        if root is None:
            continue
        u = unit_of_root[root]
        if part.variant not in ("", TVM):
            backend_of_unit[u] = part.variant
    for part, root in zip(parts, root_of_part):
        if root is None:
            continue
        u = unit_of_root[root]
        if part.lowering == 0:
            variants[u][TVM].append(part)
        elif backend_of_unit[u] is not None:
            name = backend_of_unit[u]
            variants[u].setdefault(name, []).append(
                part if part.variant else Part(name, 1, part.node_id, part.func_name)
            )
    if untied:  # a region not tied to its ops took some: only units the region lowering covers exactly
        covered = [set() for _ in range(num_units)]
        for part, root in zip(parts, root_of_part):
            if root is not None and part.lowering == 1:
                covered[unit_of_root[root]].update(node_ops[1][part.node_id])
        for u in range(num_units):
            if covered[u] != set(unit_ops[u]):
                variants[u] = {TVM: variants[u][TVM]}

    # edges and sizes from the TVM lowering (same tensors cross units whichever variant runs)
    preds: list[set[int]] = [set() for _ in range(num_units)]
    out_bytes = [0] * num_units
    graph = tvm_lowering.graph
    consumers = graph.consumers()
    outputs = {e.node for e in graph.heads}
    for nid, node in enumerate(graph.nodes):
        u = node_root[0].get(nid)
        if u is None:
            continue
        u = unit_of_root[u]
        for edge in node.inputs:
            src = node_root[0].get(edge.node)
            if src is not None and unit_of_root[src] != u:
                preds[u].add(unit_of_root[src])
        leaves = nid in outputs or any(node_root[0].get(c) is not None and unit_of_root[node_root[0][c]] != u
                                       for c in consumers[nid])
        if leaves:
            out_bytes[u] += sum(node.output_bytes(i) for i in range(node.num_outputs))
    for r in roots:  # edges only the region lowering shows (e.g. a region reading a folded value)
        for s in succ[r]:
            a, b = unit_of_root[r], unit_of_root[s]
            if a != b:
                preds[b].add(a)

    follows: dict[str, int | None] = {}
    index_of = {info.name: info for info in ops}
    for info in reversed(list(ops)):
        home = unit_of.get(info.name)
        if home is None:
            home = follows.get(info.name)
        if home is None or info.call is None:
            continue
        for var in relax.analysis.free_vars(info.call):
            if var.name in index_of and unit_of.get(var.name) is None and follows.get(var.name) is None:
                follows[var.name] = home
    relax_ops = [[index_of[n].op for n in unit_ops[u]] for u in range(num_units)]
    in_kernels = {n for part in parts if part.lowering == 0 for n in node_ops[0][part.node_id]}
    computed = [[n for n in unit_ops[u] if n in in_kernels] for u in range(num_units)]
    return Units(unit_ops, [sorted(p) for p in preds], out_bytes, variants, unit_of, follows, relax_ops, computed)


@relax.expr_functor.mutator
class _UniqueNames(relax.PyExprMutator):
    """Renames a binding whose variable name was bound before (``name_1``, ``name_2``...)."""

    def __init__(self, taken: Sequence[str]) -> None:
        super().__init__()
        self.seen = set(taken)

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = self.visit_expr(binding.value)
        var = binding.var
        if var.name in self.seen:
            k = 1
            while f"{var.name}_{k}" in self.seen:
                k += 1
            kind = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
            renamed = kind(f"{var.name}_{k}", var.ty)
            self.set_var_remap(var, renamed)
            var = renamed
        self.seen.add(var.name)
        self.builder_.emit_normalized(relax.VarBinding(var, value))


def unique_binding_names(mod: tvm.IRModule, entry: str) -> tvm.IRModule:
    """``mod`` with every binding of ``entry`` bound to a variable of its own name, so that units
    can name their ops (a backend's rewrites may bind copies under one name)."""
    func = mod[entry]
    names = [b.var.name for block in func.body.blocks for b in block.bindings]
    if len(set(names)) == len(names):
        return mod
    mod = mod.clone()
    mod[entry] = _UniqueNames([p.name for p in func.params]).visit_expr(func)
    return mod


def _strongly_connected(nodes: Sequence[int], succ: dict[int, set[int]]) -> dict[int, int]:
    """Component id (its smallest node) of every node (Kosaraju, iterative)."""
    seen: set[int] = set()
    finished: list[int] = []
    for start in nodes:
        if start in seen:
            continue
        seen.add(start)
        stack = [(start, iter(sorted(succ[start])))]
        while stack:
            node, it = stack[-1]
            nxt = next((s for s in it if s not in seen), None)
            if nxt is None:
                stack.pop()
                finished.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(succ[nxt]))))
    pred: dict[int, list[int]] = {n: [] for n in nodes}
    for a in nodes:
        for b in succ[a]:
            pred[b].append(a)
    component: dict[int, int] = {}
    for start in reversed(finished):
        if start in component:
            continue
        members, stack = [start], [start]
        component[start] = start
        while stack:
            node = stack.pop()
            for p in pred[node]:
                if p not in component:
                    component[p] = start
                    members.append(p)
                    stack.append(p)
        smallest = min(members)
        for m in members:
            component[m] = smallest
    return component

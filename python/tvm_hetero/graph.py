"""The graph a build makes and a runtime runs: a list of nodes in execution order, each placed on
one device. Below the compiler and the runtime (both read it; it imports neither).

Every graph-level pass (placement, reordering, copy insertion, memory planning) takes a
:class:`Graph` and returns a new one or a plan for it, so each pass can be tested alone on a
hand-made graph. :meth:`Graph.to_json` writes the format described in ``docs/graph-format.md`` and
:meth:`Graph.from_json` is the one reader of it in Python.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

COPY_FUNC = "__copy"
NOP_FUNC = "__nop"


class Entry(NamedTuple):
    """One output of one node: ``(node_id, output_index)``."""

    node: int
    index: int = 0


@dataclass
class Node:
    """A graph node: an input/parameter (``op == "null"``) or a kernel call (``"tvm_op"``)."""

    name: str
    op: str = "tvm_op"
    inputs: list[Entry] = field(default_factory=list)
    func_name: str = ""
    device: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    # Relax op names fused into this node (for reports and placement); empty for null/copy.
    relax_ops: list[str] = field(default_factory=list)

    @property
    def is_input(self) -> bool:
        return self.op == "null"

    @property
    def is_copy(self) -> bool:
        return self.func_name == COPY_FUNC

    @property
    def num_outputs(self) -> int:
        return len(self.shapes)

    def output_bytes(self, index: int = 0) -> int:
        return (
            int(np.prod(self.shapes[index], dtype=np.int64))
            * np.dtype(_np_dtype(self.dtypes[index])).itemsize
        )


def _np_dtype(dtype: str) -> str:
    # numpy has no bfloat16; its size is what matters here.
    return "float16" if dtype == "bfloat16" else dtype


@dataclass
class Graph:
    """Nodes in execution order (a topological order) plus the graph outputs."""

    nodes: list[Node]
    heads: list[Entry]

    def copy(self) -> Graph:
        return copy.deepcopy(self)

    # ---- structure -------------------------------------------------------------------------
    def consumers(self) -> list[list[int]]:
        """For each node, the ids of nodes that read any of its outputs (each id once)."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for nid, node in enumerate(self.nodes):
            for src in dict.fromkeys(e.node for e in node.inputs):
                users[src].append(nid)
        return users

    def validate(self) -> None:
        """Raise ValueError unless every input refers to an earlier node's existing output."""
        names: set[str] = set()
        for nid, node in enumerate(self.nodes):
            if node.name in names:
                raise ValueError(f"node {nid} '{node.name}': duplicate name")
            names.add(node.name)
            if len(node.shapes) != len(node.dtypes) or not node.shapes:
                raise ValueError(f"node {nid} '{node.name}': needs one shape and dtype per output")
            for e in node.inputs:
                if not 0 <= e.node < nid:
                    raise ValueError(f"node {nid} '{node.name}': input {tuple(e)} is not an earlier node")
                if not 0 <= e.index < self.nodes[e.node].num_outputs:
                    raise ValueError(f"node {nid} '{node.name}': input {tuple(e)} has no such output")
        for e in self.heads:
            if not 0 <= e.node < len(self.nodes):
                raise ValueError(f"head {tuple(e)} refers to no node")

    def permuted(self, order: Iterable[int]) -> Graph:
        """The same graph with nodes in ``order`` (old ids); ``order`` must be topological."""
        order = list(order)
        if sorted(order) != list(range(len(self.nodes))):
            raise ValueError("order must be a permutation of the node ids")
        new_id = {old: new for new, old in enumerate(order)}
        nodes = []
        for old in order:
            node = copy.deepcopy(self.nodes[old])
            node.inputs = [Entry(new_id[e.node], e.index) for e in node.inputs]
            nodes.append(node)
        graph = Graph(nodes, [Entry(new_id[e.node], e.index) for e in self.heads])
        graph.validate()
        return graph

    def device_switches(self) -> int:
        """Number of times consecutive kernel nodes change device (inputs do not count)."""
        devices = [n.device for n in self.nodes if not n.is_input]
        return sum(1 for a, b in itertools.pairwise(devices) if a != b)

    def groups(self) -> list[tuple[int, list[int]]]:
        """Runs of consecutive kernel nodes on one device: ``[(device, [node ids])]``."""
        runs: list[tuple[int, list[int]]] = []
        for nid, node in enumerate(self.nodes):
            if node.is_input:
                continue
            if runs and runs[-1][0] == node.device:
                runs[-1][1].append(nid)
            else:
                runs.append((node.device, [nid]))
        return runs

    # ---- serialisation ---------------------------------------------------------------------
    def entry_ids(self) -> list[int]:
        """``node_row_ptr`` without its last element: the first entry id of each node."""
        ptr, total = [], 0
        for node in self.nodes:
            ptr.append(total)
            total += node.num_outputs
        return ptr

    def to_json(self, storage_ids: list[int] | None = None, storage_offsets: list[int] | None = None) -> str:
        """Graph JSON (docs/graph-format.md); ``storage_ids`` per entry, default one per entry, and
        byte offsets within them (the ``storage_offset`` column is written only if one is nonzero)."""
        self.validate()
        row_ptr = self.entry_ids()
        num_entries = row_ptr[-1] + self.nodes[-1].num_outputs if self.nodes else 0
        if storage_ids is None:
            storage_ids = list(range(num_entries))
        if len(storage_ids) != num_entries:
            raise ValueError(f"storage_ids has {len(storage_ids)} values for {num_entries} entries")
        if storage_offsets is not None and len(storage_offsets) != num_entries:
            raise ValueError(f"storage_offsets has {len(storage_offsets)} values for {num_entries} entries")
        json_nodes = []
        for node in self.nodes:
            item: dict = {
                "op": node.op,
                "name": node.name,
                "inputs": [[e.node, e.index, 0] for e in node.inputs],
            }
            if not node.is_input:
                item["attrs"] = {
                    "func_name": node.func_name,
                    "num_inputs": str(len(node.inputs)),
                    "num_outputs": str(node.num_outputs),
                    "flatten_data": "0",
                }
            json_nodes.append(item)
        shapes = [list(s) for n in self.nodes for s in n.shapes]
        dtypes = [d for n in self.nodes for d in n.dtypes]
        attrs = {
            "shape": ["list_shape", shapes],
            "dltype": ["list_str", dtypes],
            "storage_id": ["list_int", list(storage_ids)],
            "device_index": ["list_int", [n.device for n in self.nodes]],
            "device_index_kind": ["str", "position"],
        }
        if storage_offsets is not None and any(storage_offsets):
            attrs["storage_offset"] = ["list_int", list(storage_offsets)]
        return json.dumps(
            {
                "nodes": json_nodes,
                "arg_nodes": [i for i, n in enumerate(self.nodes) if n.is_input],
                "node_row_ptr": row_ptr + [num_entries],
                "heads": [[e.node, e.index, 0] for e in self.heads],
                "attrs": attrs,
            }
        )

    @classmethod
    def from_json(cls, document: str | dict, where: str = "graph") -> Graph:
        """The graph of a graph JSON document (text or parsed), as :meth:`to_json` writes it: the one
        reader of the format in Python. A malformed document is a ValueError naming ``where``."""
        try:
            doc = json.loads(document) if isinstance(document, str) else document
            row_ptr, attrs = doc["node_row_ptr"], doc["attrs"]
            shapes, dtypes = attrs["shape"][1], attrs["dltype"][1]
            devices = attrs.get("device_index", ["list_int", [0] * len(doc["nodes"])])[1]
            nodes = []
            for nid, item in enumerate(doc["nodes"]):
                entries = range(row_ptr[nid], row_ptr[nid + 1])
                nodes.append(Node(
                    name=str(item["name"]), op=str(item["op"]),
                    inputs=[Entry(int(e[0]), int(e[1])) for e in item.get("inputs", [])],
                    func_name=str(item.get("attrs", {}).get("func_name", "")), device=int(devices[nid]),
                    shapes=[tuple(int(d) for d in shapes[e]) for e in entries], dtypes=[str(dtypes[e]) for e in entries]))
            graph = cls(nodes, [Entry(int(e[0]), int(e[1])) for e in doc["heads"]])
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: not a tvm-hetero graph ({type(err).__name__}: {err})") from None
        return graph

    def inputs(self) -> dict[str, tuple[list[int], str]]:
        """``{name: (shape, dtype)}`` of the graph's inputs (data and parameters), in node order."""
        return {n.name: (list(n.shapes[0]), n.dtypes[0]) for n in self.nodes if n.is_input}

    def __str__(self) -> str:
        lines = []
        for nid, n in enumerate(self.nodes):
            ins = ", ".join(f"%{e.node}" + (f".{e.index}" if e.index else "") for e in n.inputs)
            what = "input" if n.is_input else n.func_name
            lines.append(f"%{nid} = {what}({ins}) @dev{n.device}  # {n.name} {n.shapes} {n.dtypes}")
        lines.append("outputs: " + ", ".join(f"%{e.node}" for e in self.heads))
        return "\n".join(lines)

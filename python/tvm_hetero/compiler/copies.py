"""Copy insertion: add a ``__copy`` node wherever a tensor is read on a device with other memory.

Input: a graph in its final execution order, no copies yet, every kernel node on a device, and
which devices share memory (all CPU devices of one process do): a tensor read on a device that
shares memory with its producer's is read in place -- the edge costs the consumer a wait under
concurrent execution, not a copy (the runtime hands the kernel a view carrying its own device).

Algorithm.
1. Place the inputs/params ("null" nodes): if all their consumers are on one device they live
   there; otherwise on device 0 if some consumer is on device 0, else on their first consumer's
   device. One without consumers goes to ``output_device`` (kept where it is when that is None).
2. For every tensor entry and every other device that reads it -- the devices of its consumers,
   and ``output_device`` if the entry is a graph output -- unless that device shares memory with
   the producer's, add ONE copy node (device = the
   destination), whatever the number of consumers there, and rewire those consumers (and the
   head) to it. Copies always read the producer's own entry, so a tensor is only ever copied from
   its producer's device and never back (no round trips, no copy of a copy).
3. Position: a copy goes to the start of the same-device run (:meth:`Graph.groups`) holding its
   first consumer -- or just after the producer when the producer is a null node inside that run.
   A copy that only feeds a graph output goes to the end of the last ``output_device`` run after
   its producer, or to the end of the graph when there is none.

Guarantee: the result is a valid topological order (checked with ``validate``) with the same
kernels in the same relative order; a copy of a consumed tensor always joins an existing run of
its device, so switches are unchanged, and graph outputs add at most one switch (one final run on
``output_device``, only when no such run follows their producers).
"""

from __future__ import annotations

from collections.abc import Callable

from ..graph import COPY_FUNC, Entry, Graph, Node

#: ``shares_memory(a, b)``: a tensor made on device ``a`` can be read on device ``b`` in place.
SharesMemory = Callable[[int, int], bool]


def _never(_a: int, _b: int) -> bool:
    return False


def _place_inputs(graph: Graph, output_device: int | None) -> None:
    """Rule 1 above, in place."""
    consumers = graph.consumers()
    for nid, node in enumerate(graph.nodes):
        if not node.is_input:
            continue
        devices = [graph.nodes[c].device for c in consumers[nid]]  # consumer id order
        if len(set(devices)) == 1:
            node.device = devices[0]
        elif devices:
            node.device = 0 if 0 in devices else devices[0]
        elif output_device is not None:
            node.device = output_device


def _copy_positions(
    graph: Graph, output_device: int | None, shares_memory: SharesMemory
) -> dict[tuple[int, int, int], int]:
    """``(producer, output index, destination) -> old node position the copy goes before``."""
    runs = graph.groups()
    run_start = {nid: ids[0] for _, ids in runs for nid in ids}
    head_entries = set(graph.heads) if output_device is not None else set()
    positions: dict[tuple[int, int, int], int] = {}
    for nid, node in enumerate(graph.nodes):
        for e in node.inputs:
            src = graph.nodes[e.node]
            key = (e.node, e.index, node.device)
            crosses = src.device != node.device and not shares_memory(src.device, node.device)
            if crosses and key not in positions:  # first consumer on that device
                positions[key] = max(run_start[nid], e.node + 1)
    for e in sorted(head_entries):
        key = (e.node, e.index, output_device)
        producer = graph.nodes[e.node].device
        if producer == output_device or key in positions or shares_memory(producer, output_device):
            continue
        later = [ids[-1] + 1 for dev, ids in runs if dev == output_device and ids[-1] > e.node]
        positions[key] = later[-1] if later else len(graph.nodes)
    return positions


def _copy_name(graph: Graph, taken: set[str], src: int, index: int, device: int) -> str:
    base = graph.nodes[src].name + (f".{index}" if index else "") + f".copy_to_dev{device}"
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def insert_copies(
    graph: Graph, output_device: int | None = 0, shares_memory: SharesMemory | None = None
) -> Graph:
    """A new graph with inputs placed and ``__copy`` nodes added (see the module docstring).

    ``output_device``: the device the graph outputs must end on; None leaves them where produced.
    ``shares_memory(a, b)``: tensors of device ``a`` are read on device ``b`` without a copy
    (default: no two devices share memory).
    """
    shares_memory = shares_memory or _never
    graph.validate()
    if any(n.is_copy for n in graph.nodes):
        raise ValueError("insert_copies: the graph already has copy nodes")
    graph = graph.copy()
    _place_inputs(graph, output_device)
    positions = _copy_positions(graph, output_device, shares_memory)
    before: list[list[tuple[int, int, int]]] = [[] for _ in range(len(graph.nodes) + 1)]
    for key, pos in sorted(positions.items()):
        before[pos].append(key)
    # In one slot, copies ending the previous run go before those starting the next one.
    next_device = None
    for pos in range(len(graph.nodes), -1, -1):
        if pos < len(graph.nodes) and not graph.nodes[pos].is_input:
            next_device = graph.nodes[pos].device
        before[pos].sort(key=lambda key: key[2] == next_device)  # stable: id order otherwise

    taken = {n.name for n in graph.nodes}
    new_id: dict[int, int] = {}
    copy_id: dict[tuple[int, int, int], int] = {}
    nodes: list[Node] = []

    def source(e: Entry, device: int | None) -> Entry:
        copied = copy_id.get((e.node, e.index, device))
        return Entry(new_id[e.node], e.index) if copied is None else Entry(copied, 0)

    for pos in range(len(graph.nodes) + 1):
        for src, index, device in before[pos]:
            producer = graph.nodes[src]
            copy_id[(src, index, device)] = len(nodes)
            nodes.append(
                Node(
                    name=_copy_name(graph, taken, src, index, device),
                    inputs=[Entry(new_id[src], index)],
                    func_name=COPY_FUNC,
                    device=device,
                    shapes=[producer.shapes[index]],
                    dtypes=[producer.dtypes[index]],
                )
            )
        if pos < len(graph.nodes):
            node = graph.nodes[pos]
            node.inputs = [source(e, node.device) for e in node.inputs]
            new_id[pos] = len(nodes)
            nodes.append(node)
    result = Graph(nodes, [source(e, output_device) for e in graph.heads])
    result.validate()
    return result


def shared_edges(graph: Graph) -> int:
    """Tensors read on another device without a copy: distinct (entry, reading device) pairs."""
    pairs = {
        (e.node, e.index, node.device)
        for node in graph.nodes
        for e in node.inputs
        if not node.is_copy and graph.nodes[e.node].device != node.device
    }
    return len(pairs)


def copy_stats(graph: Graph) -> tuple[int, int]:
    """``(number of copy nodes, bytes they move per inference)``."""
    copies = [n for n in graph.nodes if n.is_copy]
    return len(copies), sum(n.output_bytes(0) for n in copies)

"""Python API of the pipeline executor: successive inferences flow through stages (docs/pipeline.md).

Each stage is its own graph (its own :class:`~tvm_hetero.runtime.graph_runtime.GraphModule`, possibly on its
own device) with its own worker thread; bounded queues between the stages let every device work on a
different inference at once. Outputs come back in submission order, bit-identical to running the
stages one after another.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
import tvm_ffi

import tvm_hetero.native  # noqa: F401  (registers tvm_hetero.pipeline.create)

from ..devices import is_remote
from . import graph_runtime

if TYPE_CHECKING:
    from typing_extensions import Self

ALL_STAGES = -1
STAGE_OPTION_KEYS = ("cores", "num_threads")


def create(
    stage_graph_jsons: Sequence[str],
    lib: tvm.runtime.Module | Sequence[tvm.runtime.Module],
    stage_devices: Sequence[tvm.runtime.Device | Sequence[tvm.runtime.Device]],
    wiring: Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
) -> PipelineModule:
    """Build one graph runtime per stage, then the pipeline over them.

    Parameters
    ----------
    stage_graph_jsons : the graph of each stage (docs/graph-format.md), in pipeline order.
    lib : the kernel library, one for all stages or one per stage.
    stage_devices : the device (or device list, primary first) of each stage.
    wiring : ``{"inputs": [...], "stages": [{"name", "inputs", "params"}, ...], "outputs": [...]}``
        as in docs/pipeline.md. A stage input maps to a pipeline input name or to
        ``{"stage": k, "output": i}`` of an earlier stage.
    options : ``{"queue_capacity": int, "stages": [{"cores": [...], "num_threads": int}, ...]}``;
        per-stage entries are merged into the wiring's stages (they may also be written there).
    """
    graphs = list(stage_graph_jsons)
    libs = list(lib) if isinstance(lib, (list, tuple)) else [lib] * len(graphs)
    devices = list(stage_devices)
    if not graphs:
        raise ValueError("a pipeline needs at least one stage")
    if len(libs) != len(graphs) or len(devices) != len(graphs):
        raise ValueError(
            f"{len(graphs)} stage graphs, but {len(libs)} libraries and {len(devices)} device entries"
        )
    config = _merge_options(wiring, options or {}, len(graphs))
    stages = []
    for i, (graph, stage_lib, stage_devs) in enumerate(zip(graphs, libs, devices)):
        stage = graph_runtime.create(graph, stage_lib, stage_devs)
        if is_remote(stage.primary_device):
            raise NotImplementedError(
                f"stage {i}: the pipeline runs stages in this process; remote devices are not supported"
            )
        stages.append(stage)
    fcreate = tvm_ffi.get_global_func("tvm_hetero.pipeline.create")
    return PipelineModule(fcreate([s.module for s in stages], json.dumps(config)), stages)


def _merge_options(wiring: Mapping[str, Any], options: Mapping[str, Any], num_stages: int) -> dict:
    """The wiring JSON with ``options`` folded in."""
    config = copy.deepcopy(dict(wiring))
    stages = config.setdefault("stages", [{} for _ in range(num_stages)])
    if len(stages) != num_stages:
        raise ValueError(f"wiring describes {len(stages)} stages, but {num_stages} stage graphs were given")
    unknown = set(options) - {"queue_capacity", "stages"}
    if unknown:
        raise ValueError(f"unknown pipeline options: {sorted(unknown)}")
    if "queue_capacity" in options:
        config["queue_capacity"] = int(options["queue_capacity"])
    per_stage = list(options.get("stages", []))
    if len(per_stage) > num_stages:
        raise ValueError(f"options give {len(per_stage)} stage entries for {num_stages} stages")
    for i, extra in enumerate(per_stage):
        unknown = set(extra) - set(STAGE_OPTION_KEYS)
        if unknown:
            raise ValueError(
                f"options.stages[{i}]: unknown keys {sorted(unknown)}; known: {STAGE_OPTION_KEYS}"
            )
        stages[i] = {**stages[i], **extra}
    return config


class PipelineModule:
    """A running pipeline: submit inferences with :meth:`run`, collect them in order with :meth:`get_output`.

    Use it as a context manager, or call :meth:`close`, to stop its threads.
    """

    def __init__(self, module: tvm.runtime.Module, stages: Sequence[graph_runtime.GraphModule] = ()):
        self.module = module
        #: The stage runtimes (owned by the pipeline while it runs; do not run them directly).
        self.stages = list(stages)
        self._run = module["run"]
        self._try_run = module["try_run"]
        self._get_output = module["get_output"]
        self._set_params = module["set_params"]
        self._load_params = module["load_params"]
        self._stats = module["stats"]
        self._shutdown = module["shutdown"]
        self.input_names: list[str] = [str(n) for n in module["get_input_names"]()]
        self.stage_names: list[str] = [str(n) for n in module["get_stage_names"]()]
        self.num_outputs: int = int(module["get_num_outputs"]())

    # ---- inferences --------------------------------------------------------------------------
    def _tensors(self, inputs: Mapping[str, Any] | Sequence[Any]) -> list[Any]:
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            extra = [n for n in inputs if n not in self.input_names]
            if missing or extra:
                raise KeyError(f"pipeline inputs are {self.input_names}; missing {missing}, unknown {extra}")
            values = [inputs[n] for n in self.input_names]
        else:
            values = list(inputs)
            if len(values) != len(self.input_names):
                raise ValueError(
                    f"expected {len(self.input_names)} inputs {self.input_names}, got {len(values)}"
                )
        return [graph_runtime.as_tensor(v, f"input {n!r}") for v, n in zip(values, self.input_names)]

    def run(self, inputs: Mapping[str, Any] | Sequence[Any], block: bool = True) -> bool:
        """Submit one inference (a dict by name, or a list in :attr:`input_names` order).

        The inputs are copied, so they may change once this returns. It waits only while the
        pipeline is full (``block=False``: returns False instead). From a single thread, collect
        outputs as you go (or use :meth:`run_batch`): a full pipeline nobody drains waits forever.
        """
        tensors = self._tensors(inputs)
        if block:
            self._run(*tensors)
            return True
        return bool(self._try_run(*tensors))

    def get_output(self, block: bool = True) -> list[np.ndarray] | None:
        """The outputs of the oldest unreturned inference; ``None`` if ``block=False`` and it is not done.

        Raises the error of a failed stage (naming it) once the outputs finished before it are returned.
        """
        outputs = self._get_output(bool(block))
        if outputs is None:
            return None
        return [t.numpy() for t in outputs]

    def run_batch(self, batch: Sequence[Mapping[str, Any] | Sequence[Any]]) -> list[list[np.ndarray]]:
        """Run every inference of ``batch`` through the pipeline; their outputs, in order."""
        results: list[list[np.ndarray]] = []
        for inputs in batch:
            tensors = self._tensors(inputs)
            while not self._try_run(*tensors):
                results.append(self.get_output(block=True))
        while len(results) < len(batch):
            results.append(self.get_output(block=True))
        return results

    # ---- parameters --------------------------------------------------------------------------
    def _stage_index(self, stage: int | str | None) -> int:
        if stage is None:
            return ALL_STAGES
        if isinstance(stage, str):
            if stage not in self.stage_names:
                raise KeyError(f"no stage named {stage!r}; stages: {self.stage_names}")
            return self.stage_names.index(stage)
        return int(stage)

    def set_params(self, stage: int | str | None, params: Mapping[str, Any]) -> None:
        """Set parameters of one stage (index or name), or of every stage declaring them (``None``).

        Only while no inference is in flight.
        """
        values = {name: graph_runtime.as_tensor(v, f"parameter {name!r}") for name, v in params.items()}
        self._set_params(self._stage_index(stage), values)

    def load_params(self, stage: int | str | None, param_bytes: bytes | bytearray) -> None:
        """Set parameters from ``tvm.runtime.save_param_dict`` bytes (``stage=None``: every stage)."""
        self._load_params(self._stage_index(stage), bytes(param_bytes))

    # ---- inspection and life cycle -------------------------------------------------------------
    def stats(self) -> dict:
        """Per stage: busy_s, inferences, queue_depth, queue_max; totals, throughput (inferences/s)."""
        return json.loads(self._stats())

    def close(self) -> None:
        """Stop accepting work and join every thread (work in flight is dropped), then close the
        stage runtimes. Idempotent."""
        self._shutdown()
        for stage in self.stages:
            stage.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


"""The ``qnn`` backend: the generic offload backend (:mod:`tvm_hetero.ep_offload.backend`) with
QNN's names, SDK and graph preparation."""

from __future__ import annotations

import tvm

from ..ep_offload.backend import EpOffloadBackend
from . import KIND
from .pool_as_mean import PoolAsMean


class QnnBackend(EpOffloadBackend):
    """Offload to a Qualcomm HTP through ONNX Runtime's QNN EP."""

    name = "qnn"
    vendor = "QNN"
    device_label = "HTP"
    sdk = "tvm_hetero.qnn.ep"
    costs = "tvm_hetero.qnn.costs"
    kind = KIND
    #: A QNN graph call costs ~0.16 ms fixed on phones: about the host making a quarter of a million
    #: elements (1 MB of float32, memory-bound work of that order).
    elements_per_call = 250_000

    def vendor_passes(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        return PoolAsMean(entry)(mod)  # QNN computes a whole-map AveragePool with asymmetric pads wrongly

    def describe_options(self) -> str:
        """The device's options as the report states them."""
        return f"soc {self.options.get('soc_model')}, v{self.options.get('htp_arch')}"

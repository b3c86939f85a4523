"""Qualcomm's Hexagon HTP through QNN: everything of this vendor lives in this package.

The HTP is reached as every accelerator with a vendor SDK is (:mod:`tvm_hetero.ep_offload`): a
region of the graph becomes an ONNX model that ONNX Runtime's QNN execution provider finalizes into
a QNN context at build and runs at run time. This package adds only what is QNN's own:

- :data:`KIND`: the device kind ``qnn-htp`` (the one record the rest of the product sees);
- :mod:`.ep`: the QNN EP (registration, sessions, finalize, QNN's reasons, its cycle profile);
- :mod:`.backend`: the ``qnn`` backend, the generic one with QNN's graph preparation;
- :mod:`.pool_as_mean`: a rewrite around a pool QNN computes wrongly;
- :mod:`.costs`: HTP graph costs (device table, modeled from QNN cycles);
- :mod:`.peer`: ONNX Runtime + QNN EP run as a peer on the same model;
- :mod:`.cli`: ``tvm-hetero demo-htp``, ``qnn-fit`` and ``qnn-costs``.

Importing this package imports nothing of ONNX Runtime: the record names the rest as dotted paths.
"""

from __future__ import annotations

from ..kind_record import KindRecord

#: A Qualcomm Hexagon HTP driven through QNN graphs; the defaults are the Snapdragon X Elite NPU
#: (soc 60, HTP v73), which the x86 emulator runs too.
KIND = KindRecord(
    "qnn-htp", 16, None, {"soc_model": 60, "htp_arch": 73, "precision": "fp16"}, extra="qnn",
    label="Qualcomm HTP",
    backend="tvm_hetero.qnn.backend:QnnBackend",
    verifier="tvm_hetero.ep_offload.verified_build:build_verified",
    discover="tvm_hetero.qnn.ep:discover",
    unavailable="tvm_hetero.qnn.ep:why_unavailable",
    cli="tvm_hetero.qnn.cli:add_commands",
)

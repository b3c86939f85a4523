"""A test-only accelerator: its "vendor SDK" is ONNX Runtime's CPU execution provider, reached the
way every accelerator with a vendor SDK is (tvm_hetero.ep_offload). It shows what adding a kind
takes: this package (the record, an SDK module, a backend) and one registry line
(``tvm_hetero.devices.register_kind(KIND)``; a product kind lists its package in
``tvm_hetero.devices.VENDOR_PACKAGES`` instead). docs/new-accelerator.md walks through it."""

from __future__ import annotations

from tvm_hetero.kind_record import KindRecord

#: kDLExtDev: a device type no built-in kind uses. ``refuse``: ONNX op types this "vendor" will not
#: take (comma-separated); ``wrong``: 1 makes it compute every graph 1.5x off (verification's case).
KIND = KindRecord(
    "ort-cpu-test", 12, None, {"refuse": "", "wrong": 0}, label="test accelerator (ONNX Runtime CPU EP)",
    backend="ort_cpu_vendor.backend:OrtCpuBackend",
    verifier="tvm_hetero.ep_offload.verified_build:build_verified",
    cli="ort_cpu_vendor.backend:add_commands",
)

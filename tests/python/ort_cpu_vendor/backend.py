"""The test accelerator's backend: the generic offload backend with its names and SDK."""

from __future__ import annotations

from typing import Any

from tvm_hetero.ep_offload.backend import EpOffloadBackend

from . import KIND


class OrtCpuBackend(EpOffloadBackend):
    name = "ortcpu"
    vendor = "ORT-CPU"
    device_label = "TESTACC"
    sdk = "ort_cpu_vendor.sdk"
    kind = KIND


def add_commands(subparsers: Any) -> None:
    """Its own ``tvm-hetero`` command: say what it is."""
    info = subparsers.add_parser("ort-cpu-test-info", help="the test accelerator's facts")
    info.set_defaults(fn=lambda _args: print(f"{KIND.label}: device type {KIND.device_type}") or 0)

"""What this machine offers to run on: CPU clusters from the OS topology, and the GPUs TVM sees.

CPU cores are grouped into clusters by their maximum frequency
(``/sys/devices/system/cpu/cpu*/cpufreq/cpuinfo_max_freq``), or else by ``cpu_capacity`` (Arm
big.LITTLE / DynamIQ report both); where neither exists every allowed core is one cluster. Each
cluster becomes one ``cpu:k`` device with executor settings ``{"cores": [...], "num_threads":
len(cores)}``, fastest cluster first (it is the primary device). Only the cores this process may
run on (its affinity mask) are counted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tvm

SYS_CPU = Path("/sys/devices/system/cpu")
GPU_KINDS = (("cuda", "cuda"), ("rocm", "rocm"), ("metal", "metal"), ("vulkan", "vulkan"), ("opencl", "opencl"))


@dataclass
class DeviceInfo:
    """One device: its TVM device, the target to compile for, and its executor settings."""

    device: tvm.runtime.Device
    target: str
    options: dict | None
    description: str

    def __str__(self) -> str:
        return f"{self.device}: {self.description} (target {self.target}, options {self.options})"


def _core_rank(core: int, sys_cpu: Path) -> int | None:
    for path in (sys_cpu / f"cpu{core}" / "cpufreq" / "cpuinfo_max_freq", sys_cpu / f"cpu{core}" / "cpu_capacity"):
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def cpu_clusters(cores: list[int] | None = None, sys_cpu: Path = SYS_CPU) -> list[list[int]]:
    """Allowed cores grouped by maximum frequency (or capacity), fastest group first; one group when
    the OS says nothing (or says the same for every core)."""
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    ranks = {c: _core_rank(c, sys_cpu) for c in cores}
    if any(r is None for r in ranks.values()):
        return [cores]
    groups: dict[int, list[int]] = {}
    for core in cores:
        groups.setdefault(ranks[core], []).append(core)
    return [groups[r] for r in sorted(groups, reverse=True)]


def devices() -> list[DeviceInfo]:
    """The devices of this machine, the primary (fastest CPU cluster) first."""
    found = []
    for k, cores in enumerate(cpu_clusters()):
        found.append(DeviceInfo(tvm.cpu(k), "llvm", {"cores": cores, "num_threads": len(cores)},
                                f"CPU cluster of {len(cores)} core(s) {cores}"))
    for kind, target in GPU_KINDS:
        for index in range(8):
            try:
                dev = tvm.runtime.device(kind, index)
                if not dev.exist:
                    break
            except (RuntimeError, ValueError):  # a runtime TVM was built without
                break
            found.append(DeviceInfo(dev, target, None, f"{kind} GPU {index} ({dev.device_name})"))
    return found

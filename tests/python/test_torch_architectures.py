"""Architectures through torch.export -> Relax -> tvm_hetero.build, equal torch eager, with and
without oneDNN, on one device and split over two.

The small blocks (tvm_hetero.testing.torch_models.BLOCKS) each reproduce a way real models once
broke the build: oneDNN regions that swallowed a value read outside them (MobileNetV2's residual,
MobileNetV3's hardswish after a folded batch norm, EfficientNet's shared bias reshape, a conv
output read twice) and RoBERTa's int32 cumsum that only TVM's dispatch passes lower. The
architectures (MobileNetV3-small as torchvision writes it; transformers models from tiny configs;
random weights) are the models themselves.
"""

from __future__ import annotations

import functools

import pytest
import tvm
from tvm import relax
from tvm_hetero.backends import DnnlBackend
from tvm_hetero.backends import dnnl as dnnl_mod
from tvm_hetero.backends.partition import partition_for_backends, region_calls

torch = pytest.importorskip("torch")
from tvm_hetero.testing import torch_models

HAS_DNNL = bool(tvm.get_global_func("tvm_hetero.dnnl.available")())
ONE = [("cpu:0", "llvm")]
TWO = [("cpu:0", "llvm"), ("cpu:1", "llvm")]
TOLERANCE = 1e-5  # of max |torch output|


def alternate(info) -> int:
    """Every other op on device 1: the most device boundaries a placement can make."""
    return info.index % 2


#: (label, targets, build arguments); oneDNN on device 1 when split, the other ops alternate.
CONFIGS = [
    ("1 device", ONE, {}),
    ("1 device + dnnl", ONE, {"backends": ["dnnl"]}),
    ("2 devices", TWO, {"placement": alternate}),
    ("2 devices + dnnl on 1", TWO, {"placement": alternate, "backends": [("dnnl", 1)]}),
]
CONFIG_IDS = [c[0] for c in CONFIGS]

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


@pytest.fixture(scope="module", autouse=True)
def one_dnnl_thread():
    if HAS_DNNL:
        dnnl_mod.set_num_threads(1)  # the CPU quota here makes more threads slower


imported = functools.cache(torch_models.imported)


def check_config(name: str, config: tuple) -> None:
    label, targets, build_args = config
    if "backends" in build_args and not HAS_DNNL:
        pytest.skip("libtvm_hetero was built without oneDNN")
    mod, inputs, expected = imported(name)
    error, art = torch_models.run_and_compare(mod, inputs, expected, targets, **build_args)
    report = art.build_report
    print(f"{name} [{label}]: relative error {error:.1e}, regions {report.backend_regions}")
    if len(targets) == 2:  # split for real (oneDNN on device 1 may take every op of a CNN)
        crossings = report.num_copies + report.shared_edges  # CPUs read each other's tensors in place
        assert report.ops_per_device[1] > 0, report.ops_per_device
        assert crossings > 0 or report.ops_per_device[0] == 0, (crossings, report.ops_per_device)
    assert error < TOLERANCE, f"{name} [{label}]: error {error:.2e} relative to torch"


def dnnl_region_calls(name: str) -> list:
    """The region of each region call, in order, after partitioning ``name`` for oneDNN with one
    region per composite (no blocks: these tests look at what each pattern took)."""
    mod = relax.transform.ConvertToDataflow(min_size=1)(imported(name)[0])
    mod, regions = partition_for_backends(mod, [DnnlBackend(merge=False)], "main")
    return [region for _var, region in region_calls(mod["main"], regions)]


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("name", torch_models.BLOCKS)
def test_block_matches_torch(name: str, config: tuple) -> None:
    check_config(name, config)


needs_dnnl = pytest.mark.skipif(not HAS_DNNL, reason="libtvm_hetero was built without oneDNN")


@needs_dnnl
def test_residual_read_twice_still_fuses_the_residual_of_its_own_block():
    # The add's first operand is the block input (read by the next conv too), so only the
    # right-operand pattern can take it; both blocks' adds must land in a region.
    patterns = [r.pattern for r in dnnl_region_calls("residual_read_twice")]
    assert len(patterns) == 7 and sum("_residual" in p for p in patterns) == 2, patterns


@needs_dnnl
def test_hardswish_shift_is_not_folded_into_the_batch_normed_conv():
    convs = [r for r in dnnl_region_calls("hardswish_after_batch_norm") if r.spec["op"] == "conv2d"]
    # Stem conv + folded batch norm (one bias), and the head conv: hardswish's "+ 3" stays a TVM op.
    assert sorted(r.ops.count("relax.add") for r in convs) == [1, 1], [r.ops for r in convs]


@needs_dnnl
def test_shared_bias_reshapes_are_copied_so_every_conv_keeps_its_bias():
    patterns = [r.pattern for r in dnnl_region_calls("two_squeeze_excitations") if r.spec["op"] == "conv2d"]
    assert len(patterns) == 6 and all("_bias" in p for p in patterns), patterns


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("name", torch_models.ARCHITECTURES)
def test_architecture_matches_torch(name: str, config: tuple) -> None:
    if name in torch_models.TRANSFORMERS:
        pytest.importorskip("transformers")
    check_config(name, config)

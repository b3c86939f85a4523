"""PyTorch models through torch.export and TVM's Relax frontend, split over two devices, equal torch.

Two models: a small CNN (Conv2d, BatchNorm2d in eval mode, ReLU, MaxPool2d, Linear) and
nn.TransformerEncoderLayer (d_model=64, nhead=4, batch_first, dropout 0, eval mode). Each is
exported once, imported with its weights as function parameters (``keep_params_as_input`` then
``detach_params``, so the weights reach ``tvm_hetero.build`` as ``params``), and built for two CPU
devices with two placements: the heavy ops (conv2d, matmul) on device 1 and the rest on device 0,
and the first half of the ops on device 1 and the second half on device 0.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
import tvm_hetero
from tvm import relax

torch = pytest.importorskip("torch")
nn = torch.nn

TARGETS = [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")]
HEAVY_OPS = {"conv2d": 1, "matmul": 1}
RTOL, ATOL = 1e-4, 1e-5

# torch.export's own deprecation noise (pytree LeafSpec), not ours.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def small_cnn() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = SmallCNN()
    with torch.no_grad():  # non-trivial batch-norm statistics, so eval mode matters
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model.eval(), (torch.randn(2, 3, 32, 32),)


def transformer_layer() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dropout=0.0, batch_first=True)
    return layer.eval(), (torch.randn(2, 10, 64),)


MODELS = {"small_cnn": small_cnn, "transformer_encoder_layer": transformer_layer}


@functools.cache
def imported(name: str) -> tuple[tvm.IRModule, dict[str, np.ndarray], list[np.ndarray], np.ndarray]:
    """(Relax module, weights by parameter name, inputs, torch's output) for the model ``name``."""
    model, args = MODELS[name]()
    with torch.no_grad():
        expected = model(*args).numpy()
        exported = torch.export.export(model, args)
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(exported, keep_params_as_input=True)
    mod, detached = relax.frontend.detach_params(mod)
    weights = detached["main"]
    param_vars = mod["main"].params[len(mod["main"].params) - len(weights) :]
    params = {var.name: value.numpy() for var, value in zip(param_vars, weights)}
    return mod, params, [a.numpy() for a in args], expected


def first_half_on_1(num_ops: int):
    def place(info: tvm_hetero.OpInfo) -> int:
        return 1 if info.index < num_ops / 2 else 0

    return place


@pytest.mark.parametrize("name", sorted(MODELS))
def test_split_model_matches_torch(name: str) -> None:
    mod, params, inputs, expected = imported(name)
    heavy = tvm_hetero.build(mod, TARGETS, placement=HEAVY_OPS, params=params)
    num_ops = sum(heavy.build_report.ops_per_device)
    halves = tvm_hetero.build(mod, TARGETS, placement=first_half_on_1(num_ops), params=params)

    for label, art in (("heavy ops on 1", heavy), ("first half on 1", halves)):
        report = art.build_report
        assert report.ops_per_device[0] > 0 and report.ops_per_device[1] > 0, (label, report.ops_per_device)
        assert report.shared_edges > 0 and report.num_copies == 0, label  # two CPUs: read in place
        assert len(art.input_names) == len(inputs), art.input_names
        rt = art.create()
        rt.run(**dict(zip(art.input_names, inputs)))
        assert rt.get_num_outputs() == 1
        got = rt.get_output(0).numpy()
        print(
            f"{name} [{label}]: ops per device {report.ops_per_device}, read in place {report.shared_edges}, "
            f"max abs error {np.max(np.abs(got - expected)):.2e}"
        )
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL, err_msg=f"{name} [{label}]")

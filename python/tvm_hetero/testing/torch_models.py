"""PyTorch models for end-to-end checks: torch.export -> Relax -> ``tvm_hetero.build`` vs torch eager.

Three families, all with seeded random weights and nothing downloaded:

- :data:`BLOCKS`: the smallest models that show the shapes real architectures have and partitioning
  once got wrong: a MobileNetV2 inverted-residual stack (a conv + bias output read by the next
  block's conv and by its residual add), a hardswish after a batch-normed conv (MobileNetV3's
  stem), two squeeze-excitation blocks whose zero biases make equal bias reshapes (EfficientNet),
  ``a = conv1(x); return (a + conv2(x)) * a``, and RoBERTa's position ids (an int32 cumsum).
- :data:`ARCHITECTURES`: MobileNetV3-small (torchvision's, written out) and Hugging Face
  ``transformers`` architectures built from tiny configs (:data:`TRANSFORMERS`: MobileNetV2,
  EfficientNet, ResNet, BERT, RoBERTa, GPT-2, ViT), returning their first output.
- :data:`SPEED`: full-size ResNet-18 and MobileNetV2 (written out) and a BERT-base-sized
  ``nn.TransformerEncoderLayer``, the models bench/default_vs_torch.py times against torch.

:func:`imported` exports a model (batch-norm statistics randomized so eval mode matters) and
:func:`run_and_compare` builds, runs and returns the largest error relative to torch's output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import tvm_hetero


def _torch():
    import torch

    return torch


# ---- small blocks -----------------------------------------------------------------------------
def _blocks() -> dict[str, Callable[[], tuple[Any, tuple]]]:
    torch = _torch()
    nn = torch.nn

    def bn(c: int) -> nn.Module:
        return nn.BatchNorm2d(c)

    class InvertedResidual(nn.Module):
        """MobileNetV2's block without expansion stride: ``x + project(depthwise(expand(x)))``."""

        def __init__(self, c: int) -> None:
            super().__init__()
            e = 4 * c
            self.f = nn.Sequential(
                nn.Conv2d(c, e, 1, bias=False), bn(e), nn.ReLU6(),
                nn.Conv2d(e, e, 3, padding=1, groups=e, bias=False), bn(e), nn.ReLU6(),
                nn.Conv2d(e, c, 1, bias=False), bn(c),
            )  # fmt: skip

        def forward(self, x):
            return x + self.f(x)

    class ResidualReadTwice(nn.Module):
        """A conv + batch norm stem whose output two residual blocks read (conv and add)."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), bn(8))
            self.b1, self.b2 = InvertedResidual(8), InvertedResidual(8)

        def forward(self, x):
            return self.b2(self.b1(self.stem(x)))

    class HardswishAfterBatchNorm(nn.Module):
        """MobileNetV3's stem: hardswish(bn(conv(x))) reads the conv output twice."""

        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3, padding=1, bias=False), bn(8), nn.Hardswish()
            self.head = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return self.head(self.act(self.bn(self.conv(x))))

    class SqueezeExcitation(nn.Module):
        def __init__(self, c: int, r: int) -> None:
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
            nn.init.zeros_(self.reduce.bias)  # as transformers initialises them: equal biases
            nn.init.zeros_(self.expand.bias)

        def forward(self, x):
            s = nn.functional.silu(self.reduce(x.mean((2, 3), keepdim=True)))
            return x * torch.sigmoid(self.expand(s))

    class TwoSqueezeExcitations(nn.Module):
        """EfficientNet's pattern: conv + bn + SE twice; the SE bias reshapes become one."""

        def __init__(self) -> None:
            super().__init__()
            self.c1, self.b1, self.se1 = nn.Conv2d(3, 16, 3, padding=1, bias=False), bn(16), SqueezeExcitation(16, 4)
            self.c2, self.b2, self.se2 = nn.Conv2d(16, 16, 1, bias=False), bn(16), SqueezeExcitation(16, 4)

        def forward(self, x):
            return self.se2(self.b2(self.c2(self.se1(self.b1(self.c1(x))))))

    class ConvOutputReadTwice(nn.Module):
        """``a = conv1(x); return (a + conv2(x)) * a``."""

        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            a = self.c1(x)
            return (a + self.c2(x)) * a

    class PositionIds(nn.Module):
        """RoBERTa's position ids: ``cumsum(ids != pad) * (ids != pad) + pad``, then an embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(40, 16)

        def forward(self, ids):
            mask = ids.ne(1).int()
            pos = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
            return self.emb(pos)

    def image() -> tuple:
        return (torch.randn(1, 3, 16, 16),)

    return {
        "residual_read_twice": lambda: (ResidualReadTwice(), image()),
        "hardswish_after_batch_norm": lambda: (HardswishAfterBatchNorm(), image()),
        "two_squeeze_excitations": lambda: (TwoSqueezeExcitations(), image()),
        "conv_output_read_twice": lambda: (ConvOutputReadTwice(), image()),
        "position_ids_cumsum": lambda: (PositionIds(), (torch.tensor([[0, 5, 7, 1, 1], [3, 4, 1, 9, 1]]),)),
    }


BLOCKS = (
    "residual_read_twice",
    "hardswish_after_batch_norm",
    "two_squeeze_excitations",
    "conv_output_read_twice",
    "position_ids_cumsum",
)


# ---- the speed goal's models (docs/performance.md), full size, written out --------------------
def _speed_models() -> dict[str, Callable[[], tuple[Any, tuple]]]:
    torch = _torch()
    nn = torch.nn

    def conv_bn(i: int, o: int, k: int, stride: int = 1, groups: int = 1, act: Any = nn.ReLU) -> nn.Module:
        layers = [nn.Conv2d(i, o, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
        return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)

    class Basic(nn.Module):
        """ResNet's basic block: two 3x3 convs and the shortcut (a strided 1x1 conv when it must)."""

        def __init__(self, i: int, o: int, stride: int) -> None:
            super().__init__()
            self.f = nn.Sequential(conv_bn(i, o, 3, stride), conv_bn(o, o, 3, act=None))
            self.short = conv_bn(i, o, 1, stride, act=None) if stride != 1 or i != o else nn.Identity()

        def forward(self, x):
            return torch.relu(self.f(x) + self.short(x))

    def resnet18() -> nn.Module:
        layers, c = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
        for o, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Basic(c, o, stride), Basic(o, o, 1)]
            c = o
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))

    class Inverted(nn.Module):
        """MobileNetV2's inverted residual: expand 1x1, depthwise 3x3, project 1x1 (+ x)."""

        def __init__(self, i: int, o: int, stride: int, t: int) -> None:
            super().__init__()
            e = i * t
            expand = [conv_bn(i, e, 1, act=nn.ReLU6)] if t != 1 else []
            self.f = nn.Sequential(*expand, conv_bn(e, e, 3, stride, e, nn.ReLU6), conv_bn(e, o, 1, act=None))
            self.residual = stride == 1 and i == o

        def forward(self, x):
            return x + self.f(x) if self.residual else self.f(x)

    def mobilenet_v2() -> nn.Module:
        layers, c = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
        for t, o, n, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                                (6, 160, 3, 2), (6, 320, 1, 1)):  # fmt: skip
            for k in range(n):
                layers.append(Inverted(c, o, stride if k == 0 else 1, t))
                c = o
        layers += [conv_bn(c, 1280, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)]
        return nn.Sequential(*layers)

    def encoder() -> nn.Module:
        return nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, dropout=0.0, batch_first=True)

    image = lambda: (torch.randn(1, 3, 224, 224),)
    return {
        "resnet18_like": lambda: (resnet18(), image()),
        "mobilenet_v2_like": lambda: (mobilenet_v2(), image()),
        "transformer_encoder_layer": lambda: (encoder(), (torch.randn(1, 128, 512),)),
    }


#: The speed goal's models: ResNet-18 and MobileNetV2 (ImageNet-sized, 1x3x224x224) and a BERT-base
#: sized nn.TransformerEncoderLayer on 128 tokens.
SPEED = ("resnet18_like", "mobilenet_v2_like", "transformer_encoder_layer")


# ---- MobileNetV3-small, written out ------------------------------------------------------------
def _mobilenet_v3_small() -> tuple[Any, tuple]:
    """torchvision's MobileNetV3-small layer for layer (its wheel is not loadable here)."""
    torch = _torch()
    nn = torch.nn

    def divisible(v: float) -> int:
        return max(8, int(v + 4) // 8 * 8)

    def conv_bn(i: int, o: int, k: int, stride: int = 1, groups: int = 1, act: Any = None) -> nn.Module:
        layers = [nn.Conv2d(i, o, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(o)]
        return nn.Sequential(*layers, *([act()] if act else []))

    class SqueezeExcitation(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, divisible(c // 4), 1), nn.Conv2d(divisible(c // 4), c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))

    class InvertedResidual(nn.Module):
        def __init__(self, i: int, k: int, e: int, o: int, se: bool, hardswish: bool, stride: int) -> None:
            super().__init__()
            act = nn.Hardswish if hardswish else nn.ReLU
            layers = [conv_bn(i, e, 1, act=act)] if e != i else []
            layers.append(conv_bn(e, e, k, stride, e, act=act))
            layers += [SqueezeExcitation(e)] if se else []
            self.f = nn.Sequential(*layers, conv_bn(e, o, 1))
            self.residual = stride == 1 and i == o

        def forward(self, x):
            return x + self.f(x) if self.residual else self.f(x)

    # (in, kernel, expanded, out, squeeze-excitation, hardswish, stride), as in torchvision.
    config = [
        (16, 3, 16, 16, 1, 0, 2), (16, 3, 72, 24, 0, 0, 2), (24, 3, 88, 24, 0, 0, 1),
        (24, 5, 96, 40, 1, 1, 2), (40, 5, 240, 40, 1, 1, 1), (40, 5, 240, 40, 1, 1, 1),
        (40, 5, 120, 48, 1, 1, 1), (48, 5, 144, 48, 1, 1, 1), (48, 5, 288, 96, 1, 1, 2),
        (96, 5, 576, 96, 1, 1, 1), (96, 5, 576, 96, 1, 1, 1),
    ]  # fmt: skip

    class MobileNetV3Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                conv_bn(3, 16, 3, 2, act=nn.Hardswish),
                *[InvertedResidual(*c) for c in config],
                conv_bn(96, 576, 1, act=nn.Hardswish),
            )
            self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, 1000))

        def forward(self, x):
            pooled = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(pooled, 1))

    return MobileNetV3Small(), (torch.randn(1, 3, 64, 64),)


# ---- transformers from tiny configs -----------------------------------------------------------
def _transformers() -> dict[str, Callable[[], tuple[Any, tuple]]]:
    torch = _torch()
    import transformers as hf

    def image() -> tuple:
        return (torch.randn(1, 3, 32, 32),)

    def tokens() -> tuple:
        return (torch.randint(2, 100, (1, 8)),)

    text = {
        "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 64,
    }  # fmt: skip
    return {
        "mobilenet_v2": lambda: (
            hf.MobileNetV2Model(hf.MobileNetV2Config(image_size=32, depth_multiplier=0.35)), image()
        ),
        "efficientnet": lambda: (
            hf.EfficientNetModel(
                hf.EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.3, hidden_dim=320)
            ),
            image(),
        ),
        "resnet": lambda: (
            hf.ResNetModel(
                hf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck")
            ),
            image(),
        ),
        "bert": lambda: (hf.BertModel(hf.BertConfig(**text)), tokens()),
        "roberta": lambda: (hf.RobertaModel(hf.RobertaConfig(**text)), tokens()),
        "gpt2": lambda: (
            hf.GPT2Model(hf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False)),
            tokens(),
        ),
        "vit": lambda: (
            hf.ViTModel(
                hf.ViTConfig(
                    image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64,
                )
            ),
            image(),
        ),
    }


TRANSFORMERS = ("mobilenet_v2", "efficientnet", "resnet", "bert", "roberta", "gpt2", "vit")


# ---- export, build, compare -------------------------------------------------------------------
def _randomize_batch_norms(model: Any) -> None:
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.5, 0.5, generator=g)


#: Whole architectures: MobileNetV3-small and the transformers models.
ARCHITECTURES = ("mobilenet_v3_small", *TRANSFORMERS)


def torch_model(name: str) -> tuple[Any, tuple]:
    """``(model in eval mode, example inputs)`` of ``name``, seeded: equal weights on every call."""
    torch = _torch()
    torch.manual_seed(0)
    if name == "mobilenet_v3_small":
        factory = _mobilenet_v3_small
    else:
        factory = _blocks().get(name) or _speed_models().get(name)
        factory = factory or (_transformers().get(name) if name in TRANSFORMERS else None)
    if factory is None:
        raise KeyError(f"no model {name!r}; choose one of {', '.join(BLOCKS + SPEED + ARCHITECTURES)}")
    model, args = factory()
    _randomize_batch_norms(model)
    model = _first_output(model, name in _WITH_ATTENTION_MASK).eval() if name in TRANSFORMERS else model.eval()
    return model, args


def imported(name: str) -> tuple[Any, list[np.ndarray], np.ndarray]:
    """``(Relax module, inputs, torch's output)`` of the model ``name`` (:func:`torch_model`).

    Weights are constants of the module (``from_exported_program``'s default).
    """
    torch = _torch()
    from ..importers import from_torch

    model, args = torch_model(name)
    with torch.no_grad():
        expected = model(*args).numpy()
    return from_torch(model, args), [a.numpy() for a in args], expected


#: Models given an all-ones attention mask: without one (and without a cache) GPT-2 looks for
#: packed sequences with a cumsum over bool, which TVM's torch frontend keeps as a bool cumsum
#: (torch makes it int64) that LLVM cannot compile, in the Relax VM as here.
_WITH_ATTENTION_MASK = frozenset({"gpt2"})


def _first_output(model: Any, attention_mask: bool) -> Any:
    """A module returning the first output of a transformers model, as one tensor."""
    torch = _torch()

    class FirstOutput(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x):
            if attention_mask:
                return self.model(x, attention_mask=torch.ones_like(x), return_dict=False)[0]
            return self.model(x, return_dict=False)[0]

    return FirstOutput()


def run_and_compare(
    mod: Any,
    inputs: Sequence[np.ndarray],
    expected: np.ndarray,
    targets: Sequence[Any],
    **build_args: Any,
) -> tuple[float, tvm_hetero.Artifact]:
    """Build ``mod``, run it on ``inputs``; the largest error relative to ``max |expected|``."""
    art = tvm_hetero.build(mod, list(targets), **build_args)
    rt = art.create()
    rt.run(**dict(zip(art.input_names, inputs)))
    got = rt.get_output(0).numpy()
    if got.shape != expected.shape:
        raise AssertionError(f"output shape {got.shape}, torch's {expected.shape}")
    scale = max(float(np.max(np.abs(expected))), 1e-6)
    return float(np.max(np.abs(got.astype(np.float64) - expected))) / scale, art


# ---- ONNX exports ------------------------------------------------------------------------------
#: The ONNX opset and IR version of :func:`onnx_export` (ONNX Runtime 1.31 refuses newer IR).
ONNX_OPSET = 17
ONNX_IR_VERSION = 9


def onnx_export(name: str, example: Sequence[Any] | None = None) -> Any:
    """``torch.onnx.export`` (opset 17, TorchScript exporter, static shapes) of the model ``name``
    (:func:`torch_model`, batch norms randomized) as a checked ``onnx.ModelProto``; ``example``
    replaces its example inputs (e.g. a 1x3x96x96 image for MobileNetV3-small). Inputs are named
    ``input0``..., the output ``output``."""
    import io
    import warnings

    import onnx

    torch = _torch()
    model, args = torch_model(name)
    args = tuple(example) if example is not None else args
    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is deprecated, not gone
        torch.onnx.export(model, args, buffer, dynamo=False, opset_version=ONNX_OPSET,
                          input_names=[f"input{i}" for i in range(len(args))], output_names=["output"])
    exported = onnx.load_from_string(buffer.getvalue())
    exported.ir_version = ONNX_IR_VERSION
    onnx.checker.check_model(exported)
    return exported

"""ONNX fixtures exported from PyTorch with seeded random weights and nothing downloaded.

- :func:`mobilenet_v2_onnx`: MobileNetV2 at width 1.0 (all 17 inverted-residual blocks, 1280-wide
  head, 1000 logits) on a small 1x3x96x96 input.
- :func:`small_bert_onnx`: a two-layer BERT (``transformers.BertConfig``: hidden 64, 4 heads,
  sequence 16) fed ``input_ids`` (int64) and ``attention_mask`` (int64), ending in the last hidden
  state. Biases and layer-norm scales are randomized too (BERT starts them at zeros and ones).
- :func:`transformers_gpt2_onnx`, :func:`transformers_bert_onnx`, :func:`transformers_mobilenet_v2_onnx`:
  ``transformers``' own GPT2LMHeadModel, BertModel and MobileNetV2 (small configurations), exported as
  users export them (shape arithmetic, mask helpers and "same" pads left in the graph), for the
  importer (``importers.from_onnx`` prepares them with ONNX's tools).

All are exported with the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, so no
``onnxscript`` is needed) at opset 17 with static shapes (unless asked for symbolic ones), and
stamped ``ir_version`` 9 (ONNX Runtime refuses the newer IR that onnx 1.23 writes by default).
Batch-norm running statistics are randomized, so inference mode differs from training mode and
outputs are worth comparing. The first two import into Relax with TVM's ``from_onnx(model,
keep_params_in_input=False)`` as they are.

:func:`sample_inputs` gives seeded inputs for either model (for any ONNX model: float inputs are
standard normal, ``*ids`` are token ids, ``*mask`` is all ones with the last quarter masked out).
"""

from __future__ import annotations

import io
import warnings

import numpy as np

from ..sample_inputs import onnx_inputs, sample_value

OPSET = 17
IR_VERSION = 9
MOBILENET_INPUT = (1, 3, 96, 96)
BERT_SEQUENCE = 16
BERT_VOCAB = 512


def mobilenet_v2_onnx(seed: int = 0, input_shape: tuple[int, int, int, int] = MOBILENET_INPUT):
    """MobileNetV2 (width 1.0) on ``input_shape`` with seeded weights and batch-norm statistics:
    an ``onnx.ModelProto`` with input ``input`` (float32) and output ``logits`` (float32[1, 1000])."""
    import torch

    torch.manual_seed(seed)
    model = _mobilenet_v2(torch)
    _randomize_batch_norms(torch, model, seed)
    model.eval()
    example = torch.randn(*input_shape)
    return _export(torch, model, (example,), ["input"], ["logits"])


def small_bert_onnx(seed: int = 0, sequence: int = BERT_SEQUENCE):
    """A two-layer BERT encoder (hidden 64, 4 heads, intermediate 128, vocabulary 512) with seeded
    weights: an ``onnx.ModelProto`` with inputs ``input_ids`` and ``attention_mask`` (int64[1,
    sequence]) and output ``last_hidden_state`` (float32[1, sequence, 64])."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=BERT_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    bert = BertModel(config, add_pooling_layer=False)
    bert.config._attn_implementation = "eager"  # plain MatMul/Softmax attention, no SDPA op
    _randomize_constant_parameters(torch, bert, seed)
    bert.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            # The additive mask is built here with plain ops: transformers' own mask helpers export
            # a ConstantOfShape of a 0-d shape that TVM's ONNX importer rejects.
            hidden = self.bert.embeddings(input_ids=input_ids)
            additive = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * -10000.0
            return self.bert.encoder(hidden, attention_mask=additive).last_hidden_state

    example = _bert_inputs(np.random.default_rng(seed), sequence)
    args = (torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"]))
    return _export(torch, LastHidden().eval(), args, ["input_ids", "attention_mask"], ["last_hidden_state"])


def transformers_gpt2_onnx(seed: int = 0, sequence: int = BERT_SEQUENCE, dynamic: bool = False):
    """``transformers``' GPT2LMHeadModel (2 layers, hidden 64, 4 heads, vocabulary 512) with seeded
    weights, exported as users export it: inputs ``input_ids`` and ``attention_mask`` (int64[1,
    sequence]), output ``logits`` (float32[1, sequence, 512]). With ``dynamic`` both inputs' dims are
    symbolic (``"batch"``, ``"sequence"``), as ``dynamic_axes`` exports them."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=BERT_VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt2 = GPT2LMHeadModel(config)
    gpt2.config._attn_implementation = "eager"  # plain MatMul/Softmax attention, no SDPA op
    _randomize_constant_parameters(torch, gpt2, seed)
    gpt2.eval()

    logits = _exported_as(torch, gpt2,
                          lambda m, ids, mask: m(input_ids=ids, attention_mask=mask, use_cache=False).logits)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    return _export(torch, logits, _token_args(torch, seed, sequence), ["input_ids", "attention_mask"],
                   ["logits"], axes if dynamic else None)


def transformers_bert_onnx(seed: int = 0, sequence: int = BERT_SEQUENCE):
    """``transformers``' BertModel (2 layers, hidden 64, 4 heads, vocabulary 512, no pooler) with
    seeded weights and its own attention-mask helpers (which export a ``ConstantOfShape`` of a
    computed shape): inputs ``input_ids`` and ``attention_mask`` (int64[1, sequence]), output
    ``last_hidden_state`` (float32[1, sequence, 64])."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=BERT_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    bert = BertModel(config, add_pooling_layer=False)
    bert.config._attn_implementation = "eager"
    _randomize_constant_parameters(torch, bert, seed)
    bert.eval()

    hidden = _exported_as(torch, bert,
                          lambda m, ids, mask: m(input_ids=ids, attention_mask=mask).last_hidden_state)
    return _export(torch, hidden, _token_args(torch, seed, sequence), ["input_ids", "attention_mask"],
                   ["last_hidden_state"])


def transformers_mobilenet_v2_onnx(seed: int = 0, image_size: int = 96, dynamic_batch: bool = False):
    """``transformers``' MobileNetV2ForImageClassification (depth multiplier 0.35, 10 labels, its
    TensorFlow-style "same" padding, exported as a ``Pad`` of pads computed from the input's shape)
    with seeded weights and batch-norm statistics: input ``pixel_values`` (float32[1, 3, image_size,
    image_size]), output ``logits`` (float32[1, 10]); with ``dynamic_batch`` the batch dim of both is
    symbolic (``"batch"``)."""
    import torch
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(seed)
    config = MobileNetV2Config(image_size=image_size, depth_multiplier=0.35, num_labels=10)
    model = MobileNetV2ForImageClassification(config)
    _randomize_batch_norms(torch, model, seed)
    model.eval()

    logits = _exported_as(torch, model, lambda m, pixels: m(pixel_values=pixels).logits)
    axes = {"pixel_values": {0: "batch"}, "logits": {0: "batch"}} if dynamic_batch else None
    return _export(torch, logits, (torch.randn(1, 3, image_size, image_size),), ["pixel_values"], ["logits"],
                   axes)


def sample_inputs(model, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded inputs for each graph input of ``model``: float32 standard normal; int64 token ids
    for names ending in ``ids``; an int64 attention mask (ones, last quarter zero) for ``mask``."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape, dtype in onnx_inputs(model):
        if dtype == "float32":
            out[name] = sample_value(shape, dtype, rng)
        elif name.endswith("mask"):
            mask = np.ones(shape, dtype=np.int64)
            mask[..., shape[-1] - shape[-1] // 4:] = 0
            out[name] = mask
        elif name.endswith("ids"):
            out[name] = sample_value(shape, "int64", rng, bound=BERT_VOCAB)
        else:
            raise ValueError(f"no sample rule for input {name!r} of type {dtype}")
    return out


# ---- helpers ----------------------------------------------------------------------------------
def _bert_inputs(rng: np.random.Generator, sequence: int) -> dict[str, np.ndarray]:
    mask = np.ones((1, sequence), dtype=np.int64)
    mask[:, sequence - sequence // 4:] = 0
    return {"input_ids": rng.integers(0, BERT_VOCAB, size=(1, sequence), dtype=np.int64), "attention_mask": mask}


def _exported_as(torch, model, forward):
    """``model`` seen through ``forward(model, *inputs)`` (keyword arguments, one output picked), as a
    module in eval mode for the exporter."""

    class Exported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            return forward(self.model, *inputs)

    return Exported().eval()


def _token_args(torch, seed: int, sequence: int) -> tuple:
    example = _bert_inputs(np.random.default_rng(seed), sequence)
    return torch.from_numpy(example["input_ids"]), torch.from_numpy(example["attention_mask"])


def _export(torch, module, args: tuple, input_names: list[str], output_names: list[str],
            dynamic_axes: dict | None = None):
    """``torch.onnx.export`` (TorchScript exporter; static shapes unless ``dynamic_axes``) to an
    in-memory, checked model."""
    import onnx

    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        # The exporter is deprecated, not gone; its tracer warnings are expected.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=OPSET, input_names=input_names,
                          output_names=output_names, do_constant_folding=True, dynamic_axes=dynamic_axes)
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _randomize_batch_norms(torch, model, seed: int) -> None:
    """Running mean in [-0.2, 0.2], variance in [0.5, 1.5], affine weight in [0.5, 1.5] and bias in
    [-0.2, 0.2]: eval-mode batch norm then does real work without blowing activations up."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                module.running_mean.copy_((torch.rand(n, generator=generator) - 0.5) * 0.4)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                module.bias.copy_((torch.rand(n, generator=generator) - 0.5) * 0.4)


def _randomize_constant_parameters(torch, model, seed: int) -> None:
    """Biases and layer-norm scales start as zeros and ones; give them seeded values (biases
    N(0, 0.1), scales in [0.5, 1.5]) so they matter, and so that no two are equal (the exporter
    turns equal initializers into Identity nodes of one another)."""
    generator = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)
            elif name.endswith("bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)


def _mobilenet_v2(torch):
    """MobileNetV2 (Sandler et al. 2018, Table 2) at width 1.0, written with torch.nn."""
    nn = torch.nn

    def conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1, relu: bool = True):
        layers = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out)]
        if relu:
            layers.append(nn.ReLU6())
        return layers

    class InvertedResidual(nn.Module):
        """Expand 1x1 -> depthwise 3x3 (stride s) -> project 1x1; a residual add when shapes match."""

        def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = c_in * expand
            layers = conv_bn(c_in, hidden, 1) if expand != 1 else []
            layers += conv_bn(hidden, hidden, 3, stride, groups=hidden)
            layers += conv_bn(hidden, c_out, 1, relu=False)
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    # (expansion t, channels c, repeats n, first stride s)
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]
    layers: list = conv_bn(3, 32, 3, 2)
    c_in = 32
    for t, c, n, s in settings:
        for i in range(n):
            layers.append(InvertedResidual(c_in, c, s if i == 0 else 1, t))
            c_in = c
    layers += conv_bn(c_in, 1280, 1)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Linear(1280, 1000)

        def forward(self, x):
            x = self.features(x)
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
            return self.classifier(x)

    return MobileNetV2()

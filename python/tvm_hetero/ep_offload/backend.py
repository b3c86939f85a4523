"""The generic backend of an accelerator reached through an ONNX Runtime EP: regions of Relax ops
the vendor runs as its own graphs.

Capability is asked of the vendor itself, never guessed: after ``prepare`` (as ONNX Runtime
prepares a graph for its EPs, then the vendor's own passes), every op call of the entry function
that has an ONNX form (:mod:`.onnx_regions`) is built alone as an ONNX model, its weights included,
handed to the vendor's EP with CPU fallback disabled, run on random inputs and checked against the
CPU, in a child process where a crash is an answer (:mod:`.capability_probe`); the answer and the
vendor's reason are cached by the op's description (``~/.cache/tvm-hetero/<vendor>_capability.json``).
The patterns then take exactly the accepted ops (one region each; the ONNX LRN as one region), and
consecutive regions join into blocks (:mod:`tvm_hetero.backends.merge_regions`): one block is one
vendor graph, one graph execution per inference. Codegen exports each block as one ONNX model and
finalizes it once, at build, into the vendor's compiled form, kept in the kernel library by the
``tvm_hetero_ep_regions`` module (src/backends/onnx_ep/ep_region_module.cc).

A region the vendor refuses at finalize raises :class:`RegionRefused` naming its ops; the build
then keeps them on the CPU (``exclude``) and builds again, as it does for regions that verification
rejects (:mod:`.verified_build`).

A vendor subclasses :class:`EpOffloadBackend` and sets its names, its SDK module (:mod:`.sdk`) and
its own preparation passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, is_tuple, is_tuple_get_item, wildcard
from tvm.relax.transform import FusionPattern

from ..backends.base import Backend, Region, WeightPredicate
from ..backends.qdq import find_qdq_units
from ..backends.qdq_identity import DropIdentityRequantize
from ..cache_dir import cache_root
from ..errors import last_line
from ..ir.constant_values import is_literal, is_tensor_constant, scalar_value, tensor_value
from ..ir.patterns import LRN_ATTR, lrn_pattern
from ..ir.prepare_passes import DropNoOps, FoldChannelAffine, FoldConvAffine, SimplifyStackSum
from ..ir.relax_helpers import readers, static_shape
from ..kind_record import KindRecord
from . import sdk as vendor_sdk
from .capability_probe import probe
from .constant_chains import FoldConstantChains
from .copy_per_reader import CopyPerReader
from .onnx_regions import (
    ERF_GELU,
    ERF_GELU_ANNOTATIONS,
    EXPORTERS,
    Unexportable,
    assemble,
    describe,
    describe_lrn,
    is_erf_gelu,
    spec_text,
    step_of_node,
)
from .split_as_slices import SplitAsSlices
from .offload_report import OffloadRegion, OffloadReport, RefusedOp, UnplacedOp
from .vendor_process import VendorProcessDied, vendor_call

_FORMAT = "tvm-hetero-ep-regions/1"
#: Arity of each exported op's pattern (concat and stack take tuples, matched per size).
_ARITY = {"relax.nn.conv2d": 2, "relax.add": 2, "relax.subtract": 2, "relax.multiply": 2, "relax.divide": 2,
          "relax.power": 2, "relax.matmul": 2, "relax.nn.layer_norm": 3, "relax.take": 2,
          "relax.quantize": 3, "relax.dequantize": 3, "relax.reshape": 2, "relax.broadcast_to": 2,
          "relax.call_tir": 2, "relax.clip": 3, "relax.less": 2, "relax.greater": 2, "relax.equal": 2, "relax.where": 3,
          "relax.strided_slice": 4, "relax.nn.rms_norm": 2}
_TUPLE_OPS = ("relax.concat", "relax.stack")
_MAX_TUPLE = 64
#: Attribute of a composite: the keys of the entry's bindings it took (comma-separated).
_BINDINGS_ATTR = "tvm_hetero.bindings"
#: What a cached answer means (bumped when the probe asks more of a vendor).
PROBE_VERSION = 12
#: The answer for an op of constants only: the build folds it, it runs on no device.
FOLDED = "constant inputs only: folded at build"
#: The note on a unit the vendor refuses alone but accepts together with the unit reading it.
WITH_READER = "accepted together with the op reading it"
#: Answers given before the vendor was asked (nothing to ask again in context).
_NOT_ASKED = (FOLDED, "no ONNX form")


class RegionRefused(RuntimeError):
    """The vendor refused to finalize a region (its graph as a whole)."""

    def __init__(self, region: Region, reason: str, steps: list[int] | None = None, vendor: str = "the vendor") -> None:
        super().__init__(f"{vendor} refused region {region.name} ({len(region.ops)} ops) at finalize: {reason}")
        self.region = region
        self.reason = reason
        self.vendor = vendor
        #: The entry function's bindings to keep off the device: those of the steps named, else all.
        all_steps = region.spec["steps"] if region.spec.get("op") == "block" else [region.spec]
        named = [all_steps[s] for s in steps or [] if 0 <= s < len(all_steps)]
        self.bindings = [key for step in named for key in step.get("bindings", [])] or region_bindings(region)


def region_bindings(region: Region) -> list[str]:
    """The keys (``index:name``) of the entry function's op bindings a region covers."""
    steps = region.spec["steps"] if region.spec.get("op") == "block" else [region.spec]
    return [key for step in steps for key in step.get("bindings", [])]


class EpOffloadBackend(Backend):
    """Offload to an accelerator through its vendor's ONNX Runtime EP: regions on device ``device``
    (its position). A vendor sets the class attributes below and adds its passes in :meth:`vendor_passes`."""

    #: The backend's name (region symbols, patterns, the capability cache's file).
    name = ""
    #: The vendor's name, as the report says what it accepted.
    vendor = ""
    #: The device, as the report names where regions run.
    device_label = ""
    #: The vendor's SDK module (:mod:`.sdk` states its contract).
    sdk = ""
    #: The vendor's cost module (``graph_seconds``, ``modeled``), or "" when it has none.
    costs = ""
    #: The device kind's record (its default options, its name).
    kind: KindRecord
    #: Host work worth one graph call: the elements its ops make. A block may wait for this much
    #: host work beyond what each member needs, and a group making fewer elements, with no
    #: conv/matmul work, is not worth its call (verified_build.py).
    elements_per_call = 250_000

    def __init__(self, device: int | None = 0, options: dict | None = None, exclude: dict[str, str] | None = None,
                 devices: Any = None, min_flops: float = 0.0, cache_path: str | os.PathLike | None = None,
                 process: str = "same") -> None:
        super().__init__(device, min_flops, devices, merge=True)
        #: Where the graphs run, and the build's vendor calls: "same" (this process) or "separate"
        #: (vendor_process.py).
        self.process = process
        #: The device's options (the kind's defaults, then the user's).
        self.options = {**self.kind.default_options, **(options or {})}
        #: Bindings kept off the device, with the reason (verification, a refused finalize).
        self.exclude: dict[str, str] = dict(exclude or {})
        #: The last prepare's answers: binding key -> (op, accepted by the vendor, its reason); the
        #: vendor's own answer also for a binding kept off the device (``exclude`` says why it is off).
        self.answers: dict[str, tuple[str, bool, str]] = {}
        #: Multiply-add FLOPs of each conv2d and matmul binding (what "FLOPs on the device" counts).
        self.flops: dict[str, float] = {}
        #: Elements each op binding makes (what the element-wise work of a group is counted in).
        self.elements: dict[str, int] = {}
        self._accepted: set[relax.Var] = set()
        self._key_of: dict[relax.Var, str] = {}
        self._weights: dict[str, dict[int, np.ndarray]] = {}
        #: Per region name: the plain ONNX model (the CPU reference verification runs).
        self.reference_models: dict[str, bytes] = {}
        self._cache_path = Path(cache_path) if cache_path else _default_cache_path(self.name)

    @classmethod
    def for_device(cls, position: int, options: dict, exclude: dict[str, str] | None,
                   follow_placement: bool) -> EpOffloadBackend:
        """The backend of the device at ``position`` (its spec's ``options``): every op the vendor
        accepts, or (``follow_placement``) the ops the placement puts there."""
        options = dict(options)
        process = options.pop("process", "same")
        return cls(device=None if follow_placement else position, devices=[position] if follow_placement else None,
                   options=options, exclude=exclude, process=process)

    def vendor_sdk(self) -> Any:
        return vendor_sdk.load(self.sdk)

    def available(self) -> bool:
        return bool(self.vendor_sdk().available())

    def require_available(self) -> None:
        self.vendor_sdk().require()  # names the extra to install

    def vendor_passes(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        """The vendor's own rewrites, after ONNX Runtime's constant folding (none by default)."""
        return mod

    def build_summary(self, lowered: Any) -> OffloadReport:
        return summary(self, lowered)

    def describe_options(self) -> str:
        """The device's options as the report states them (the precision apart)."""
        return ", ".join(f"{k} {v}" for k, v in sorted(self.options.items()) if k != "precision")

    # -- capability --
    def prepare(self, mod: tvm.IRModule, entry: str) -> tvm.IRModule:
        self.require_available()  # one clear error, naming the extra, when the SDK is missing
        mod = FoldConstantChains(entry)(mod)  # as ONNX Runtime does before an EP sees a graph
        mod = self.vendor_passes(mod, entry)
        mod = SimplifyStackSum(entry)(mod)
        mod = SplitAsSlices(entry)(mod)  # a split's items as slices: single-output ops a region can hold
        mod = DropNoOps(entry)(mod)
        mod = DropIdentityRequantize(entry)(mod)  # after DropNoOps: it leaves the pairs behind
        mod = CopyPerReader(entry)(mod)  # each QDQ unit whole, a shared small mask in each graph
        mod = FoldConvAffine(entry)(mod)
        mod = FoldChannelAffine(entry)(mod)
        self._ask_vendor(mod[entry])
        return mod

    def _ask_vendor(self, func: relax.Function) -> None:
        cache = _load_cache(self._cache_path)
        pending: dict[str, bytes] = {}  # cache key -> probe model, asked of the vendor together
        keyed: dict[str, tuple[relax.Var, str, str]] = {}  # binding key -> (var, op, cache key)
        self._accepted, self._key_of, self.answers, self.flops, self.elements = set(), {}, {}, {}, {}
        binding_of = {b.var: b for block in func.body.blocks for b in block.bindings}
        order = list(binding_of)
        unit_of: dict[relax.Var, frozenset] = {}
        for unit in find_qdq_units(func):
            members = frozenset(unit.bindings)
            for var in members:
                unit_of.setdefault(var, members)  # a shared dequantize is asked with its first unit
        index = 0
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                key = f"{index}:{binding.var.name}"
                index += 1
                if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
                    continue
                self._key_of[binding.var] = key
                op = value.op.name
                if op in ("relax.nn.conv2d", "relax.matmul"):
                    self.flops[key] = _flops(value, binding.var)
                shape = static_shape(binding.var.ty) if isinstance(binding.var.ty, relax.TensorType) else None
                self.elements[key] = int(np.prod(shape, dtype=np.int64)) if shape is not None else 0
                try:
                    unit = unit_of.get(binding.var)
                    if unit is not None:  # a QDQ unit is asked about whole: an EP takes DQ -> op -> Q together
                        spec, weights = _subgraph_spec([binding_of[v] for v in order if v in unit])
                    else:
                        spec, weights = _subgraph_spec([binding])
                except Unexportable as err:
                    constant_only = all(is_literal(a) or not isinstance(a, relax.Var | relax.Tuple)
                                        for a in value.args)
                    self.answers[key] = (op, False, FOLDED if constant_only else f"no ONNX form: {err}")
                    continue
                cache_key = self._cache_key(spec, weights)
                if cache_key not in cache and cache_key not in pending:
                    pending[cache_key] = assemble(spec, weights, "probe")[0]
                keyed[key] = (binding.var, op, cache_key)
        if pending:
            _remember(cache, pending, probe(list(pending.values()), self.options, self.sdk, self.vendor), self._cache_path)
        for key, (var, op, cache_key) in keyed.items():
            ok, reason = cache[cache_key]
            self.answers[key] = (op, bool(ok), reason)
            if ok and key not in self.exclude:  # the vendor's answer stays on record; the exclusion decides
                self._accepted.add(var)
        self._ask_with_readers(func, binding_of, order, unit_of, cache)

    def _ask_with_readers(self, func: relax.Function, binding_of: dict, order: list, unit_of: dict,
                          cache: dict) -> None:
        """A QDQ unit the vendor refuses alone is asked again together with the one accepted unit that
        reads it: a vendor may validate some ops only in context (one takes a quantized Transpose
        feeding a MatMul as the MatMul's transposed operand, and refuses it as a graph of its own). Accepted
        together, both are accepted; a block that later separates them is refused at finalize and
        its ops stay on the CPU (:class:`RegionRefused`)."""
        read_by = readers(func)
        pending: dict[str, bytes] = {}
        asked: list[tuple[frozenset, str]] = []
        for unit in set(unit_of.values()):
            keys = [self._key_of.get(v) for v in unit]
            answers = [self.answers.get(k) for k in keys if k is not None]
            refused_by_vendor = bool(answers) and all(not a[1] and _asked_vendor(a[2]) for a in answers)
            if not refused_by_vendor or any(k in self.exclude for k in keys):
                continue  # accepted, partly accepted, refused before the vendor saw it, or kept off
            outside = {r for v in unit for r in read_by.get(v, ()) if r not in unit}
            reader_units = {unit_of.get(r) for r in outside}
            if len(reader_units) != 1 or None in reader_units:
                continue
            (reader,) = reader_units
            if not all(v in self._accepted for v in reader):
                continue
            together = unit | reader
            try:
                spec, weights = _subgraph_spec([binding_of[v] for v in order if v in together])
            except Unexportable:
                continue
            cache_key = self._cache_key(spec, weights)
            if cache_key not in cache and cache_key not in pending:
                pending[cache_key] = assemble(spec, weights, "probe")[0]
            asked.append((unit, cache_key))
        if pending:
            _remember(cache, pending, probe(list(pending.values()), self.options, self.sdk, self.vendor), self._cache_path)
        for unit, cache_key in asked:
            if not cache[cache_key][0]:
                continue
            for var in unit:
                key = self._key_of.get(var)
                if key is not None and key not in self.exclude:
                    self.answers[key] = (self.answers[key][0], True, WITH_READER)
                    self._accepted.add(var)

    def _cache_key(self, spec: dict, weights: dict[int, np.ndarray]) -> str:
        text = spec_text({"spec": spec, "weights": sorted(weights), "options": self.options,
                          self.name: self.vendor_sdk().version(), "probe": PROBE_VERSION})
        return hashlib.sha256(text.encode()).hexdigest()

    def _accepts_lrn(self, ctx: Any) -> bool:
        ann = ctx.annotated_expr
        scalars = {n: scalar_value(ann[n]) for n in ("alpha", "beta", "k")}
        if any(v is None for v in scalars.values()):
            return False
        attrs = {"size": int(ann["pool"].attrs.pool_size[0]), "alpha": scalars["alpha"], "beta": scalars["beta"],
                 "bias": scalars["k"]}
        return self._accepts_single(ctx, "LRN", "", attrs)

    def _accepts_single(self, ctx: Any, onnx_op: str, domain: str, attrs: dict | None = None) -> bool:
        """Whether the vendor takes one ONNX node ``onnx_op`` over the matched ``data`` (probed, cached):
        a pattern of several Relax ops that ONNX writes as one op (LRN, Gelu)."""
        if any(self._key_of.get(v) in self.exclude for v in getattr(ctx, "matched_bindings", [])):
            return False
        data_ty = ctx.annotated_expr["data"].ty
        if not isinstance(data_ty, relax.TensorType) or not isinstance(data_ty.shape, relax.ShapeExpr):
            return False
        shape = [int(d) for d in data_ty.shape.values]
        spec = {"nodes": [{"op": onnx_op, "inputs": [["p", 0]], "attrs": attrs or {}, "domain": domain}],
                "consts": [], "out": ["v", 0], "params": [{"shape": shape, "dtype": str(data_ty.dtype)}],
                "shape": shape, "dtype": str(data_ty.dtype)}
        cache = _load_cache(self._cache_path)
        key = self._cache_key(spec, {})
        if key not in cache:
            _remember(cache, {key: b""}, probe([assemble(spec, {}, "probe")[0]], self.options, self.sdk, self.vendor),
                      self._cache_path)
        return bool(cache[key][0])

    # -- patterns --
    def patterns(self, is_weight: WeightPredicate) -> list[FusionPattern]:
        # Each match records the entry's bindings it takes (keys), stamped on its composite function
        # (matching hands the check and the attributes the same anchor expression).
        sites: dict[Any, str] = {}

        def remember(ctx: Any) -> None:
            keys = [self._key_of[v] for v in ctx.matched_bindings if v in self._key_of]
            sites[ctx.annotated_expr["anchor"]] = ",".join(keys)

        def accepted(ctx: Any) -> bool:
            var = ctx.value_to_bound_var.get(ctx.annotated_expr["anchor"])
            if var is None or var not in self._accepted:
                return False
            remember(ctx)
            return True

        def bindings(annotated: dict) -> dict[str, str]:
            return {_BINDINGS_ATTR: sites.get(annotated["anchor"], "")}

        def lrn_accepted(ctx: Any) -> bool:
            if not self._accepts_lrn(ctx):
                return False
            remember(ctx)
            return True

        def gelu_accepted(ctx: Any) -> bool:
            if not is_erf_gelu(ctx.annotated_expr) or not self._accepts_single(ctx, "Gelu", "com.microsoft"):
                return False
            remember(ctx)
            return True

        lrn = lrn_pattern(f"{self.name}.lrn", lambda _ctx: True)
        out = [FusionPattern(f"{self.name}.lrn", lrn.pattern, lrn.annotation_patterns, lrn_accepted,
                             lambda annotated: {**lrn.attrs_getter(annotated), **bindings(annotated)}),
               FusionPattern(f"{self.name}.gelu", ERF_GELU, ERF_GELU_ANNOTATIONS, gelu_accepted, bindings)]
        # A QDQ model's batch norm, unfolded (a quantize sits between it and its conv), with the
        # quantize of its output: the composite must end at a call, not at the tuple item.
        norm = is_op("relax.nn.batch_norm")(*[wildcard() for _ in range(5)])
        requantized = is_op("relax.quantize")(is_tuple_get_item(norm, 0), wildcard(), wildcard())

        def norm_accepted(ctx: Any) -> bool:
            quantize = ctx.value_to_bound_var.get(ctx.annotated_expr["quantize"])
            return quantize in self._accepted and accepted(ctx)

        out.append(FusionPattern(f"{self.name}.batch_norm_quantize", requantized, {"anchor": norm, "quantize": requantized},
                                 norm_accepted, bindings))
        for op in EXPORTERS:
            if op == "relax.nn.batch_norm":
                continue
            if op in _TUPLE_OPS:
                for n in range(2, _MAX_TUPLE + 1):
                    call = is_op(op)(is_tuple([wildcard() for _ in range(n)]))
                    out.append(FusionPattern(f"{self.name}.{op.removeprefix('relax.')}{n}", call, {"anchor": call}, accepted,
                                             bindings))
                continue
            call = is_op(op)(*[wildcard() for _ in range(_ARITY.get(op, 1))])
            out.append(FusionPattern(f"{self.name}.{op.removeprefix('relax.')}", call, {"anchor": call}, accepted, bindings))
        return out

    def describe(self, composite: relax.Function, pattern: str) -> dict:
        keys = str(composite.attrs[_BINDINGS_ATTR]) if _BINDINGS_ATTR in composite.attrs else ""
        if pattern == f"{self.name}.gelu":
            info = {"shape": [int(d) for d in composite.ret_ty.shape.values], "dtype": str(composite.ret_ty.dtype)}
            data = next(i for i, p in enumerate(composite.params) if isinstance(p.ty, relax.TensorType)
                        and [int(d) for d in p.ty.shape.values] == info["shape"])
            return {"op": "onnx", "bindings": keys.split(",") if keys else [],
                    "nodes": [{"op": "Gelu", "inputs": [["p", data]], "attrs": {}, "domain": "com.microsoft"}],
                    "consts": [], "out": ["v", 0], "params": [_param_info(p) for p in composite.params], **info}
        if pattern == f"{self.name}.lrn":
            scalars = json.loads(str(composite.attrs[LRN_ATTR]))
            return {"op": "onnx", "bindings": keys.split(",") if keys else [], **describe_lrn(composite, scalars)}
        return {"op": "onnx", "bindings": keys.split(",") if keys else [], **describe(composite)}

    def block_wait_budget(self) -> int:
        # One more graph execution costs more than the host making this much before it.
        return self.elements_per_call

    def unique_regions(self) -> bool:
        return True  # each site's weights are compiled into its vendor graph

    def bind_call_sites(self, func: relax.Function, regions: dict[str, Region], weight_values: dict[str, Any]) -> None:
        """Record, per call site, the bindings it covers and its weights' values (compiled into
        the vendor's graph as constants)."""
        seen: set[str] = set()
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
                    continue
                region = regions.get(value.op.name_hint)
                if region is None:
                    continue
                if region.name in seen:
                    raise RuntimeError(f"{self.name}: region {region.name} is called twice; its weights would be shared")
                seen.add(region.name)
                site = f"{region.name}@{binding.var.name}"
                weights = {}
                for i, arg in enumerate(value.args):
                    if is_tensor_constant(arg):
                        weights[i] = tensor_value(arg)
                    elif isinstance(arg, relax.Var) and arg.name in weight_values:
                        weights[i] = np.asarray(weight_values[arg.name])
                self._weights[site] = weights
                region.spec["site"] = site
                region.spec["weights"] = sorted(weights)

    # -- codegen --
    def codegen(self, regions: list[Region]) -> tvm.runtime.Module:
        entries, blobs, offset = [], [], 0
        for region in regions:
            model, bound, output = assemble(region.spec, self._region_weights(region), region.name)
            self.reference_models[region.name] = model
            call = self._vendor_call
            try:
                context = call("finalize", region.name, model)
            except vendor_sdk.VendorUnavailable:
                raise
            except VendorProcessDied as died:  # nothing more is asked of a library that crashed on this graph
                raise RegionRefused(region, f"{self.vendor} crashed finalizing its graph in the "
                                            f"{self.device_label} process ({died.ended})", vendor=self.vendor) from None
            except Exception as err:  # noqa: BLE001 (ONNX Runtime's own error types)
                try:
                    nodes = call("unsupported_nodes", region.name, model)
                except VendorProcessDied:
                    nodes = []
                reason = (f"{self.vendor} does not take {', '.join(sorted({t for _n, t in nodes}))} there" if nodes
                          else last_line(err, repr(err)))
                steps = sorted({step_of_node(n) for n, _t in nodes if step_of_node(n) is not None})
                raise RegionRefused(region, reason, steps, vendor=self.vendor) from None
            num_inputs = int(region.spec["num_inputs"]) if region.spec.get("op") == "block" else len(region.spec["params"])
            last = region.spec["steps"][-1] if region.spec.get("op") == "block" else region.spec
            meta = {"inputs": bound, "num_args": num_inputs + 1, "output": output, "shape": last["shape"],
                    "dtype": last["dtype"], "options": self.options, "ops": len(region.ops), "device": region.device,
                    "process": self.process, "sdk": self.sdk, "label": self.device_label}
            entries.append({"name": region.name, "offset": offset, "size": len(context), "meta": json.dumps(meta)})
            blobs.append(context)
            offset += len(context)
        header = json.dumps({"format": _FORMAT, "regions": entries}).encode()
        document = struct.pack("<Q", len(header)) + header + b"".join(blobs)
        return tvm.get_global_func("tvm_hetero.ep_regions.create_module")(document)

    def _vendor_call(self, function: str, what: str, model: bytes, *args: Any) -> Any:
        return vendor_call(self.sdk, self.process, self.options, function, f"{self.device_label} region {what}", model,
                           *args)

    def _region_weights(self, region: Region) -> dict[int, np.ndarray]:
        """The region's inputs that are weights, by input position."""
        spec = region.spec
        if spec.get("op") != "block":
            return self._weights.get(spec.get("site", ""), {})
        out: dict[int, np.ndarray] = {}
        num_inputs = int(spec["num_inputs"])
        for step in spec["steps"]:
            values = self._weights.get(step.get("site", ""), {})
            for k, arg in enumerate(step["args"]):
                if arg < num_inputs and k in values:
                    out[arg] = values[k]
        return out


def _asked_vendor(reason: str) -> bool:
    """Whether a refusal is the vendor's own answer (not an op the build folds or cannot export)."""
    return not reason.startswith(_NOT_ASKED)


def _param_info(p: relax.Var) -> dict:
    return {"shape": [int(d) for d in p.ty.shape.values], "dtype": str(p.ty.dtype)}


def _subgraph_spec(bindings: list[relax.VarBinding]) -> tuple[dict, dict[int, np.ndarray]]:
    """Op bindings (in order) as one region: operands made outside become parameters (constants
    among them weights, with their values); the last binding's value is the output."""
    defined = {b.var for b in bindings}
    params: list[relax.Var] = []
    weights: dict[int, np.ndarray] = {}
    remap: dict[Any, Any] = {}

    def operand(expr: Any) -> Any:
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([operand(f) for f in expr.fields])
        if expr in remap:
            return remap[expr]
        if is_tensor_constant(expr) and tensor_value(expr).ndim == 0:
            return expr  # a scalar (a scale, an LRN's alpha) stays part of its op
        if is_tensor_constant(expr) or (isinstance(expr, relax.Var) and expr not in defined):
            if not isinstance(getattr(expr, "ty", None), relax.TensorType):
                raise Unexportable(f"an operand of type {getattr(expr, 'ty', None)}")
            p = relax.Var(f"p{len(params)}", expr.ty)
            if is_tensor_constant(expr):
                weights[len(params)] = tensor_value(expr)
            params.append(p)
            remap[expr] = p
            return p
        return expr  # a prim value, a shape, a string or a data type: part of the op, not an operand

    body = []
    for binding in bindings:
        call = binding.value
        if isinstance(call, relax.TupleGetItem) and call.tuple_value in remap:  # a batch norm's output
            var = relax.Var(binding.var.name, binding.var.ty)
            body.append(relax.VarBinding(var, relax.TupleGetItem(remap[call.tuple_value], call.index)))
            remap[binding.var] = var
            continue
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            raise Unexportable(f"a binding that is not an op call ({type(call).__name__})")
        var = relax.Var(binding.var.name, binding.var.ty)
        body.append(relax.VarBinding(var, relax.Call(call.op, [operand(a) for a in call.args], call.attrs,
                                                     call.ty_args, ret_ty=binding.var.ty)))
        remap[binding.var] = var
    out = body[-1].var
    if isinstance(out.ty, relax.TupleType):  # a batch norm asked alone: its output 0, the normalized data
        item = relax.Var(f"{out.name}_0", out.ty.fields[0])
        body.append(relax.VarBinding(item, relax.TupleGetItem(out, 0)))
        out = item
    return describe(relax.Function(params, relax.SeqExpr([relax.BindingBlock(body)], out), out.ty, True)), weights


def _flops(call: relax.Call, var: relax.Var) -> float:
    """2 x multiply-adds of a conv2d (per output element: input channels / groups x kernel area) or
    a matmul (per output element: the reduced length)."""
    out = [int(d) for d in var.ty.shape.values] if isinstance(var.ty.shape, relax.ShapeExpr) else []
    size = float(np.prod(out)) if out else 0.0
    if call.op.name == "relax.nn.conv2d":
        weight = [int(d) for d in call.args[1].ty.shape.values]
        return 2.0 * size * weight[1] * weight[2] * weight[3]
    lhs = [int(d) for d in call.args[0].ty.shape.values]
    return 2.0 * size * lhs[-1]


def _default_cache_path(vendor: str) -> Path:
    return cache_root() / f"{vendor}_capability.json"


#: Answers that say the SDK could not be reached, not what the vendor takes: used, never kept.
_NOT_AN_ANSWER = re.compile(r"^\w*(ModuleNotFoundError|ImportError|Unavailable):")


def _remember(cache: dict, asked: dict[str, bytes], answers: list[tuple[bool, str]], path: Path) -> None:
    """Put the probe's answers in ``cache`` under the keys asked; keep on disk those that are answers."""
    kept = False
    for cache_key, (ok, reason) in zip(asked, answers):
        cache[cache_key] = [ok, reason]
        kept = kept or not _NOT_AN_ANSWER.match(reason)
    if kept:
        _save_cache(path, {k: v for k, v in cache.items() if not _NOT_AN_ANSWER.match(str(v[1]))})


def _load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(path: Path, cache: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(path)
    except OSError:
        pass  # a cache that cannot be written only costs a probe next time


def summary(backend: Any, lowered: Any) -> OffloadReport:
    """What the report keeps of one offload backend's build: each op the vendor refused and why,
    each graph (region) it runs, the FLOPs it took."""
    mine = [r for r in lowered.regions.values() if r.backend == backend.name]
    regions = []
    for r in mine:
        bindings = region_bindings(r)
        regions.append(OffloadRegion(r.name, len(r.ops), r.device, bindings,
                                     sum(backend.flops.get(key, 0.0) for key in bindings),
                                     sum(backend.elements.get(key, 0) for key in bindings)))
    covered = {key for r in regions for key in r.bindings}  # e.g. an LRN's ops, refused one by one
    names = {r.name for r in regions}
    return OffloadReport(
        backend=backend.name, vendor=backend.vendor, device=backend.device_label, sdk=backend.sdk,
        costs=backend.costs, elements_per_call=backend.elements_per_call, options=dict(backend.options),
        options_text=backend.describe_options(), process=backend.process, asked=len(backend.answers),
        accepted=sum(1 for _op, ok, _r in backend.answers.values() if ok),
        refused=[RefusedOp(key, op, reason) for key, (op, ok, reason) in backend.answers.items()
                 if not ok and key not in covered],
        in_context=sum(1 for _op, ok, reason in backend.answers.values() if ok and reason == WITH_READER),
        regions=regions, graph_executions=sum(1 for node in lowered.graph.nodes if node.func_name in names),
        excluded=dict(backend.exclude),
        # Accepted and kept, yet in no region: a gap in the backend's patterns, said out loud.
        unplaced=[UnplacedOp(key, op) for key, (op, ok, _r) in backend.answers.items()
                  if ok and key not in covered and key not in backend.exclude],
        flops=sum(backend.flops.values()),
        flops_on_device=sum(f for key, f in backend.flops.items() if key in covered),
        steps={r.name: [step.get("bindings", []) for step in r.spec["steps"]] for r in mine if r.spec.get("op") == "block"})

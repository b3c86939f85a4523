"""What a Relax constant holds, whatever its kind: the one place that reads a literal's value.

apache-tvm 0.27 writes every literal as a ``tvm.ir.Constant``, of several kinds:

- a tensor (``GenericConst`` holding a runtime tensor; any dtype, any rank, 0-d included);
- a prim value (``IntImm`` / ``FloatImm``: a Python int or float with a prim type; bools are IntImm);
- a string (``StringImm``) and a data type (``GenericConst`` holding a dtype);

and a ``ShapeExpr`` of static dimensions or a ``Tuple`` of literals (a strided slice's begin and
end) is as constant as they are. Code that called ``expr.value.numpy()`` on "a constant" broke on
every kind but the first (a clip's bounds, a slice's ends are prim values); read values here.

Guarantee: each function answers for every kind above and for anything else (a variable, a
symbolic shape) says "not a constant" (``None`` / ``False`` / :class:`NotConstant`); none raises
on a kind it does not expect.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax


class NotConstant(ValueError):
    """An expression that is not a literal (or holds a variable, e.g. a symbolic shape)."""


def is_tensor_constant(expr: Any) -> bool:
    """A constant tensor (a weight, a scale, a 0-d scalar tensor): an operand with data of its own."""
    return isinstance(expr, tvm.ir.Constant) and isinstance(getattr(expr, "ty", None), relax.TensorType) and hasattr(
        getattr(expr, "value", None), "numpy")


def is_literal(expr: Any) -> bool:
    """Any constant kind (module list), a static shape or a tuple of literals."""
    try:
        literal_value(expr)
    except NotConstant:
        return False
    return True


def literal_value(expr: Any) -> Any:
    """The Python value of a literal: an array for a tensor, an int/float/bool for a prim value, a
    str for a string, a ``tvm_ffi`` dtype for a data type, a tuple of ints for a static shape and a
    tuple of values for a tuple. Raises :class:`NotConstant` naming the expression's kind otherwise."""
    if isinstance(expr, relax.Tuple):
        return tuple(literal_value(field) for field in expr.fields)
    if isinstance(expr, relax.ShapeExpr):
        if not all(isinstance(d, tvm.tirx.IntImm) for d in expr.values):
            raise NotConstant(f"a shape with symbolic dimensions ({expr})")
        return tuple(int(d) for d in expr.values)
    if not isinstance(expr, tvm.ir.Constant):
        raise NotConstant(f"a {type(expr).__name__}, not a constant")
    value = expr.value
    if hasattr(value, "numpy"):
        return value.numpy()
    if isinstance(expr.ty, tvm.ir.PrimType) and str(expr.ty.dtype) == "bool":
        return bool(value)
    return value


def tensor_value(expr: Any) -> np.ndarray | None:
    """A literal's value as an array: a tensor's data, a prim value as a 0-d array of its own dtype,
    a static shape as an int64 vector, a tuple of numbers as a vector; None for strings, data types,
    nested tuples and anything that is not a literal."""
    try:
        value = literal_value(expr)
    except NotConstant:
        return None
    if isinstance(value, np.ndarray):
        return value
    if isinstance(expr, relax.ShapeExpr):
        return np.asarray(value, dtype="int64")
    if isinstance(expr, tvm.ir.Constant) and isinstance(value, bool | int | float):
        return np.asarray(value, dtype=str(expr.ty.dtype))
    if isinstance(value, tuple) and all(isinstance(v, bool | int | float | np.ndarray) and np.ndim(v) == 0
                                        for v in value):
        fields = [tensor_value(f) for f in expr.fields]
        return np.asarray(fields, dtype=np.result_type(*fields)) if fields else np.zeros((0,), "int64")
    return None


def scalar_value(expr: Any) -> float | None:
    """The one number a literal holds (a one-element tensor of any rank, or a prim value); None when
    it holds none or several."""
    value = tensor_value(expr)
    if value is None or value.size != 1 or not (np.issubdtype(value.dtype, np.number) or value.dtype == bool):
        return None
    return float(value.reshape(-1)[0])


def constant_bytes(expr: Any) -> int:
    """Bytes of a constant tensor's data; 0 for the other literals (they are part of their op)."""
    return int(expr.value.numpy().nbytes) if is_tensor_constant(expr) else 0

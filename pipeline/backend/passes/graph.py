"""Read-only queries on a Relax ``main``: bindings and use counts, constants,
static shapes and dtypes, unpacked quantize / dequantize calls and the float
activation fused before a quantize.

Everything the offload planners need to *match* a pattern; nothing here
changes a module.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import GenericConst

from .. import fold


class Graph:
    """Bindings of a Relax function in order, with definitions and use counts
    (``uses[v]``: how many bindings, plus the function result, refer to ``v``)."""

    def __init__(self, func: relax.Function):
        self.bindings: list = [b for block in func.body.blocks for b in block.bindings]
        self.value: dict = {b.var: b.value for b in self.bindings}
        self.uses: Counter = Counter()
        for b in self.bindings:
            for v in relax.analysis.free_vars(b.value):
                self.uses[v] += 1
        for v in relax.analysis.free_vars(func.body.body):
            self.uses[v] += 1
        self.params: set = set(func.params)
        # what the function returns: its result, or the fields of its (nested) tuple
        self.returned: set = set()
        self._collect_returned(func.body.body)
        # Bindings computed from the function's inputs; the others are constant
        # subgraphs (e.g. Swin-V2's position-bias MLP on a constant table).
        self.from_inputs: set = set(func.params)
        for b in self.bindings:
            if any(v in self.from_inputs for v in relax.analysis.free_vars(b.value)):
                self.from_inputs.add(b.var)

    def _collect_returned(self, expr) -> None:
        value = self.value.get(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Tuple):
            for f in value.fields:
                self._collect_returned(f)
        elif isinstance(expr, relax.Var):
            self.returned.add(expr)

    def call(self, expr, *ops: str):
        """The ``Call`` bound to ``expr`` if its op is one of ``ops`` (``"relax.nn.conv2d"``...)."""
        value = self.value.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in ops:
            return value
        return None

    def single_use(self, var) -> bool:
        """True if ``var`` is used exactly once (so a fused chain may swallow it)."""
        return self.uses[var] == 1


def const_array(expr) -> np.ndarray | None:
    """numpy value of a Relax constant, else ``None``."""
    return expr.value.numpy() if isinstance(expr, GenericConst) else None


def const(a: np.ndarray):
    """Relax constant of exactly ``a``'s dtype (``relax.const`` alone narrows int64 to int32)."""
    return relax.const(a, str(a.dtype))


def const_scalar(expr) -> float | None:
    """Python number of a one-element Relax constant, else ``None``."""
    a = const_array(expr)
    return a.reshape(-1)[0].item() if a is not None and a.size == 1 else None


def prim_number(expr) -> float | None:
    """Value of a ``R.prim_value`` / constant scalar (the bounds of ``R.clip``)."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm)):  # R.prim_value is a bare Imm in TVM 0.27
        return float(expr.value)
    v = const_scalar(expr)
    return None if v is None else float(v)


def static_shape(expr) -> tuple[int, ...] | None:
    """Static tensor shape of ``expr`` or ``None`` (unknown rank or a symbolic dim)."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = getattr(ty.shape, "values", None)
    if dims is None or not all(isinstance(d, tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def var_name(var) -> str:
    """Name of a binding variable (the anchor key of :class:`~.log.Decision`)."""
    return var.name


@dataclass
class QDQ:
    """A per-tensor or per-channel ``R.quantize`` / ``R.dequantize`` call, unpacked.

    ``scale`` / ``zp`` are numpy arrays (0-d for per-tensor) or ``None`` when
    not constant; ``data`` is the first argument.
    """

    data: object
    scale: np.ndarray | None
    zp: np.ndarray | None
    axis: int
    out_dtype: str

    @property
    def scalar(self) -> bool:
        """Constant single-element scale and zero point."""
        return (self.scale is not None and self.zp is not None
                and self.scale.size == 1 and self.zp.size == 1)

    @property
    def s(self) -> float:
        """The scalar scale (first element)."""
        return float(self.scale.reshape(-1)[0])

    @property
    def z(self) -> int:
        """The scalar zero point (first element)."""
        return int(self.zp.reshape(-1)[0])

    def same_params(self, other: "QDQ", rtol: float = 0.0) -> bool:
        """Same constant scalar scale (within ``rtol``) and zero point."""
        if not (self.scalar and other.scalar) or self.z != other.z:
            return False
        return self.s == other.s if rtol == 0.0 else bool(np.isclose(self.s, other.s, rtol=rtol, atol=0))


def as_qdq(call) -> QDQ | None:
    """Unpack a quantize/dequantize ``Call`` (``None`` passes through)."""
    if call is None:
        return None
    return QDQ(call.args[0], const_array(call.args[1]), const_array(call.args[2]),
               int(call.attrs.axis), str(call.attrs.out_dtype))


def dequantize_of(graph: Graph, expr) -> QDQ | None:
    """``expr`` as ``R.dequantize(...)`` (``None`` if it is something else)."""
    return as_qdq(graph.call(expr, "relax.dequantize"))


def quantize_of(graph: Graph, expr) -> QDQ | None:
    """``expr`` as ``R.quantize(...)`` (``None`` if it is something else)."""
    return as_qdq(graph.call(expr, "relax.quantize"))


# ----------------------------------------------------------------------------- fused activations


@dataclass(frozen=True)
class Activation:
    """A float activation fused between an op and its output quantize.

    ``kind`` is ``"relu"`` or ``"clip"`` (ReLU6 and hardtanh import as
    ``R.clip(x, a, b)``)."""

    kind: str
    lo: float = 0.0
    hi: float = float("inf")

    def int_bounds(self, o_s: float, o_zp: int, dtype: str) -> tuple[int, int]:
        """Integer clip bounds on the quantized output: ``[q(lo), q(hi)]`` with
        torch's quantize semantics (exact because quantize is monotone);
        ReLU gives ``[o_zp, max]``."""
        qmin, qmax = fold.dtype_range(dtype)
        lo = fold.quantize_value(self.lo, o_s, o_zp, dtype)
        hi = qmax if np.isinf(self.hi) else fold.quantize_value(self.hi, o_s, o_zp, dtype)
        return max(lo, qmin), min(hi, qmax)


def activation_of(graph: Graph, expr) -> tuple[Activation | None, object]:
    """Peel a fused ``relu`` / ``clip`` off ``expr``: ``(activation or None, its input)``."""
    relu = graph.call(expr, "relax.nn.relu")
    if relu is not None:
        return Activation("relu"), relu.args[0]
    clip = graph.call(expr, "relax.clip")
    if clip is not None:
        lo, hi = prim_number(clip.args[1]), prim_number(clip.args[2])
        if lo is not None and hi is not None:
            return Activation("clip", lo, hi), clip.args[0]
    return None, expr

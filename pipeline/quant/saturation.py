"""Saturating activations: the input beyond which the quantized output stops changing.

tanh, a squeeze-excitation sigmoid and hardsigmoid flatten out to their asymptotes.
Past a bound ``t`` on |x|, the output is within a quarter of the finest output
step its range allows, so every input beyond ``t`` gives the same output code,
give or take one at a rounding boundary. The observer of such an activation's
input therefore need not cover more than ``[-t, t]``: the codes it saved go to
the values that still change the output. ResNet-50 embeddings end in
``tanh(linear(x))`` whose input spans +-706 (docs/zoo.md): an int8 grid over that
range has a step of 5.5, and every |x| < 2.7 rounded to 0.

The bound, for an output of ``n = 2**bits - 1`` steps (the finest step when the
observed output reaches its asymptotes: ``2 / n`` over tanh's [-1, 1], ``1 / n``
over sigmoid's [0, 1]) and ``e`` a quarter of that step:

* tanh: ``1 - tanh(t) = e`` -> ``t = atanh(1 - 2 / (4 n))``: 3.46 (int8), 5.90 (int16);
* sigmoid: ``1 - sigmoid(t) = e`` -> ``t = ln((1 - e) / e)``, ``e = 1 / (4 n)``: 6.93, 12.48;
* hardsigmoid (``relu6(x + 3) / 6``): exactly 3.

An observer of :data:`BOUNDED` clips its range to ``[-t, t]`` after its own method
(min/max, percentile, entropy, histogram search) and changes nothing when the range
lies inside. The quantizer gives it to the tensors that only saturating activations
read (:mod:`pipeline.quant.quantizer`).
"""

from __future__ import annotations

import math

import torch
from torchao.quantization.pt2e import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver

from .observers import EntropyObserver, PercentileObserver

aten = torch.ops.aten

#: aten op -> saturating kind (a sigmoid counts only as a squeeze-excitation gate: other
#: sigmoids stay float, pipeline.quant.rules.SE_GATE)
SATURATING = {aten.tanh.default: "tanh", aten.tanh_.default: "tanh",
              aten.sigmoid.default: "sigmoid", aten.sigmoid_.default: "sigmoid",
              aten.hardsigmoid.default: "hardsigmoid", aten.hardsigmoid_.default: "hardsigmoid"}

_BITS = {"int8": 8, "int16": 16}


def input_bound(kind: str, dtype: str) -> float:
    """The bound ``t`` (input units) of a saturating ``kind`` with a ``dtype`` output
    (module doc). Raises KeyError for another kind or dtype."""
    e = 1.0 / (4 * (2 ** _BITS[dtype] - 1))
    if kind == "tanh":
        return math.atanh(1.0 - 2.0 * e)
    if kind == "sigmoid":
        return math.log((1.0 - e) / e)
    if kind == "hardsigmoid":
        return 3.0
    raise KeyError(kind)


class _Bounded:
    """Mixin: clip the observer's range to ``[-bound, bound]`` (keyword ``bound``, input units).

    ``calculate_qparams`` takes the base observer's range (the one its qparams cover,
    narrowed to the observed min/max) and, only when it reaches past the bound,
    recomputes scale and zero point on the clipped range with torchao's
    ``_calculate_qparams``; otherwise the base qparams are returned as they are."""

    def __init__(self, bound: float = math.inf, **kwargs):
        super().__init__(**kwargs)
        self.bound = float(bound)

    def calculate_qparams(self):
        scale, zp = super().calculate_qparams()
        if not bool(self.min_val <= self.max_val):
            return scale, zp
        s, z = float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0])
        lo = max((self.quant_min - z) * s, float(self.min_val))
        hi = min((self.quant_max - z) * s, float(self.max_val))
        if lo >= -self.bound and hi <= self.bound:
            return scale, zp
        return self._calculate_qparams(torch.tensor(max(lo, -self.bound)), torch.tensor(min(hi, self.bound)))

    def extra_repr(self) -> str:
        return f"bound={self.bound:.6g}, " + super().extra_repr()


class SaturatingMinMaxObserver(_Bounded, MinMaxObserver):
    """``MinMaxObserver`` with the input bound of a saturating activation (:class:`_Bounded`)."""


class SaturatingHistogramObserver(_Bounded, HistogramObserver):
    """``HistogramObserver`` with the input bound of a saturating activation (:class:`_Bounded`)."""


class SaturatingMovingAverageMinMaxObserver(_Bounded, MovingAverageMinMaxObserver):
    """``MovingAverageMinMaxObserver`` with the input bound of a saturating activation."""


class SaturatingPercentileObserver(_Bounded, PercentileObserver):
    """:class:`PercentileObserver` with the input bound of a saturating activation."""


class SaturatingEntropyObserver(_Bounded, EntropyObserver):
    """:class:`EntropyObserver` with the input bound of a saturating activation."""


#: activation observer class -> its bounded form
BOUNDED = {MinMaxObserver: SaturatingMinMaxObserver, HistogramObserver: SaturatingHistogramObserver,
           MovingAverageMinMaxObserver: SaturatingMovingAverageMinMaxObserver,
           PercentileObserver: SaturatingPercentileObserver, EntropyObserver: SaturatingEntropyObserver}

"""Activation observers that clip the range: percentile and entropy (KL) calibration.

Both are torchao observers (subclasses of ``UniformQuantizationObserverBase``,
itself an ``ObserverBase``), so ``prepare_pt2e`` inserts them and
``convert_pt2e`` turns them into quantize/dequantize pairs like any other;
scale and zero point come from torchao's own ``_calculate_qparams`` on the
clipped [min, max] (per-tensor symmetric or affine, int8 or int16).

They share one statistic: a histogram of |x| with a fixed number of bins over
[0, ``hist_max``]. The first non-zero batch sets ``hist_max`` to its max |x|;
a later batch with a larger max doubles ``hist_max`` as often as needed,
merging bin pairs each time (exact: no re-binning error, except that the
first batch's max, counted in the last bin of the old range, stays just
below its edge; memory bounded by ``bins``; the growth scheme NVIDIA
describes for its TensorRT calibration in MLPerf Inference v0.5). At least
half the bins then cover [0, max |x|].

* :class:`PercentileObserver`: threshold t = the ``percentile``-th percentile
  of |x| (linear interpolation inside the bin).
* :class:`EntropyObserver`: threshold t minimising KL(P || Q) between the
  clipped reference distribution P and its quantized version Q (Migacz,
  "8-bit Inference with TensorRT", GTC 2017).

The range is then [max(min x, -t), min(max x, t)]: symmetric schemes use
max(|lo|, |hi|) of it, affine ones all of it, so an all-positive tensor
(after ReLU) keeps 0 as its lower end. The third range-setting method,
minimising the mean-squared (L2) quantization error, is torchao's
``HistogramObserver`` (observer "histogram"): no code here.
"""

from __future__ import annotations

import math
import warnings

import torch
from torchao.quantization.pt2e import UniformQuantizationObserverBase


class AbsHistogramObserver(UniformQuantizationObserverBase):
    """Base: running histogram of |x| plus the running min/max of x (see module doc).

    Buffers (all in the state dict): ``histogram`` [bins] float64 counts of |x|
    (exact zeros included, in bin 0; float64 keeps counts exact past 2^24),
    ``zeros`` (count of exact zeros),
    ``hist_max`` (upper edge of the last bin; 0 until a non-zero value is seen),
    ``min_val`` / ``max_val`` (running min/max of x, +inf/-inf until observed).

    Args: ``bins`` (even, default 2048, TensorRT's), then torchao's
    ``UniformQuantizationObserverBase`` arguments (dtype, qscheme, quant_min,
    quant_max, eps...). Only per-tensor schemes: NotImplementedError otherwise.
    """

    def __init__(self, bins: int = 2048, dtype=torch.quint8, qscheme=torch.per_tensor_affine,
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=torch.finfo(torch.float32).eps, is_dynamic=False, **kwargs):
        if qscheme not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            raise NotImplementedError(f"{type(self).__name__} supports per-tensor schemes only, got {qscheme}")
        if bins < 2 or bins % 2:
            raise ValueError(f"bins must be an even number >= 2, got {bins}")
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range, quant_min=quant_min,
                         quant_max=quant_max, factory_kwargs=factory_kwargs, eps=eps,
                         is_dynamic=is_dynamic, **kwargs)
        self.bins = bins
        self.register_buffer("histogram", torch.zeros(bins, dtype=torch.float64))
        self.register_buffer("zeros", torch.tensor(0.0, dtype=torch.float64))
        self.register_buffer("hist_max", torch.tensor(0.0))
        self.register_buffer("min_val", torch.tensor(float("inf")))
        self.register_buffer("max_val", torch.tensor(float("-inf")))

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        """Add ``x_orig`` (any shape, float) to the statistics; return it unchanged.
        Non-finite values are dropped with a UserWarning (as torchao's HistogramObserver)."""
        x = x_orig.detach().float().flatten()
        if not bool(torch.isfinite(x).all()):
            warnings.warn("non-finite values in the observed tensor are ignored", UserWarning)
            x = x[torch.isfinite(x)]
        if x.numel() == 0:
            return x_orig
        lo, hi = torch.aminmax(x)
        self.min_val.copy_(torch.minimum(self.min_val, lo))
        self.max_val.copy_(torch.maximum(self.max_val, hi))
        a = x.abs()
        amax = float(a.max())
        self.zeros += float((a == 0).sum())
        if amax == 0.0:                       # all zeros: bin 0 whatever the range becomes
            self.histogram[0] += a.numel()
            return x_orig
        if float(self.hist_max) == 0.0:
            self.hist_max.fill_(amax)
        while amax > float(self.hist_max):
            self._double_range()
        self.histogram += torch.histc(a, self.bins, 0.0, float(self.hist_max)).double()
        return x_orig

    def _double_range(self) -> None:
        merged = self.histogram.view(-1, 2).sum(1)
        self.histogram.copy_(torch.cat([merged, torch.zeros_like(merged)]))
        self.hist_max.mul_(2.0)

    def _observed(self) -> bool:
        return bool(self.min_val <= self.max_val)

    def _bin_width(self) -> float:
        return float(self.hist_max) / self.bins

    def threshold(self) -> float:
        """The clipping threshold t on |x| (subclasses)."""
        raise NotImplementedError

    def calculate_qparams(self):
        """(scale [1] float32, zero_point [1] int64) of the clipped range (module doc).
        Before any observation: torchao's default (1.0, 0) with a UserWarning."""
        if not self._observed():
            warnings.warn("must run observer before calling calculate_qparams; returning default "
                          "scale and zero point", UserWarning)
            return torch.tensor([1.0]), torch.tensor([0])
        lo, hi = self.clipped_range()
        return self._calculate_qparams(lo, hi)

    def clipped_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lo, hi) scalar tensors: the observed [min, max] clipped to [-t, t]."""
        if float(self.hist_max) == 0.0:       # only zeros seen
            return self.min_val.clone(), self.max_val.clone()
        t = torch.tensor(min(self.threshold(), float(self.hist_max)))
        # clamp both ends into [-t, t]: a tensor whose values all lie beyond t (a
        # constant 2.0 when interpolation puts t a hair below it) keeps lo <= hi
        return self.min_val.clamp(-t, t), self.max_val.clamp(-t, t)

    def extra_repr(self) -> str:
        return f"bins={self.bins}, min_val={float(self.min_val)}, max_val={float(self.max_val)}"


class PercentileObserver(AbsHistogramObserver):
    """Clip at the ``percentile``-th percentile of |x| (percent, in (0, 100]).

    The percentile is also a buffer (float64 scalar), so the calibrated state
    says which one it was computed with and a changed percentile changes the
    state file. ``percentile=100`` gives the observed min/max exactly
    (MinMaxObserver's range). The threshold is exact up to the linear
    interpolation inside one bin (width ``hist_max / bins``, at most
    2 max|x| / bins). Raises ValueError for a percentile outside (0, 100].

    int16 (more levels than histogram bins, as in :class:`EntropyObserver`):
    t = max |x|. With 32768 levels per side the rounding error is negligible
    and clipping is the only error left: clipping int16 raised MobileNetV2's error
    (docs/measuring.md, "Figures behind the code").
    """

    def __init__(self, percentile: float = 99.99, bins: int = 2048, **kwargs):
        if not 0.0 < float(percentile) <= 100.0:
            raise ValueError(f"percentile must be in (0, 100] (percent of |x| kept), got {percentile!r}")
        super().__init__(bins=bins, **kwargs)
        self.register_buffer("percentile", torch.tensor(float(percentile), dtype=torch.float64))

    def threshold(self) -> float:
        """t with P(|x| <= t) = percentile / 100, read off the cumulative histogram
        (int16: the observed max |x|, see the class doc)."""
        if self.quant_max - self.quant_min + 1 > self.bins:
            return float(self.max_val.abs().maximum(self.min_val.abs()))
        h = self.histogram.double()
        cdf = torch.cumsum(h, 0)
        target = float(self.percentile) / 100.0 * float(cdf[-1])
        k = int(torch.searchsorted(cdf, torch.tensor([target], dtype=torch.float64))[0])
        k = min(k, self.bins - 1)
        below = float(cdf[k - 1]) if k > 0 else 0.0
        inside = float(h[k])
        frac = (target - below) / inside if inside > 0 else 1.0
        return (k + min(max(frac, 0.0), 1.0)) * self._bin_width()

    def extra_repr(self) -> str:
        return f"percentile={float(self.percentile)}, " + super().extra_repr()


class EntropyObserver(AbsHistogramObserver):
    """TensorRT's entropy calibration (Migacz, "8-bit Inference with TensorRT",
    GTC 2017): over candidate thresholds of ``i`` bins (``i`` from ``levels``
    to ``bins``), P = the first ``i`` bins with the mass beyond added to bin
    ``i - 1``; Q = those ``i`` bins merged into ``levels`` equal groups, each
    group's count spread evenly over its non-empty bins; the threshold is
    ``(m + 0.5) * bin width`` for the ``i = m`` with the smallest KL(P || Q)
    (the largest such ``m`` on ties). A candidate whose Q is 0 where P is
    not has KL = inf (not chosen).

    ``levels`` is the number of codes on [0, t]: half the quantized range for
    symmetric schemes (128 for int8, the slides' value) and for affine ones
    on signed data, the whole range (256) for affine on data >= 0.

    One deviation from the slides: exact zeros are left out of P and Q. They
    quantize to 0 at every threshold, so they say nothing about it, but after
    a ReLU they are about half of all values and their spike in bin 0, spread
    over a whole group in Q, would dominate the KL and pull the threshold down.

    int16 (32768 levels per side): the search is skipped and t = max |x| (the
    observed range). With more levels than histogram bins every group is at
    most one bin, so Q equals the clipped histogram and KL(P || Q) is zero
    only without clipping: the KL-optimal threshold at int16 resolution is
    the max. A histogram fine enough to resolve int16 levels (2^15 groups x
    several bins) would cost O(bins^2) per observer in the search; at int16,
    clipping error dominates rounding error anyway.
    """

    def levels(self) -> int:
        """Quantization levels covering [0, t] (see class doc)."""
        n = self.quant_max - self.quant_min + 1
        if self.qscheme == torch.per_tensor_affine and float(self.min_val) >= 0.0:
            return n
        return n // 2

    def threshold(self) -> float:
        levels = self.levels()
        hist = self.histogram.double().clone()
        hist[0] = max(float(hist[0]) - float(self.zeros), 0.0)
        if levels >= self.bins or float(hist.sum()) == 0.0:
            return float(self.max_val.abs().maximum(self.min_val.abs()))
        cands = torch.arange(levels, self.bins + 1)
        kl = kl_divergences(hist, cands, levels)
        best_i = int(cands[kl.numel() - 1 - int(torch.argmin(kl.flip(0)))])  # the last minimum
        return (best_i + 0.5) * self._bin_width()


def kl_divergences(hist: torch.Tensor, cands: torch.Tensor, levels: int) -> torch.Tensor:
    """KL(P || Q) [len(cands)] float64 of :class:`EntropyObserver` for each candidate
    bin count ``i`` in ``cands`` (every ``i >= levels``); ``hist`` [bins] counts.

    Closed form, O(levels) per candidate instead of O(bins): bin j < i is in group
    k = floor(j * levels / i), i.e. groups are the bin ranges [b_k, b_{k+1}) with
    b_k = ceil(k * i / levels). With h' = h plus the outlier mass o on bin i - 1,
    T = sum h, S_k / N_k = count / non-empty bins of group k and sum Q = C(i):

        T * KL = sum_j h'_j log h'_j - T log T - sum_k S_k log(S_k / N_k)
                 - o log(S_last / N_last) + T log C(i)

    (sums over non-empty terms; C, the cumulative counts). Infinite when bin
    i - 1 is empty but o > 0 (Q = 0 where P > 0).
    """
    h = hist.double()
    zero = torch.zeros(1, dtype=h.dtype)
    cum = torch.cat([zero, torch.cumsum(h, 0)])
    cnt = torch.cat([zero, torch.cumsum((h > 0).double(), 0)])
    hlogh = torch.where(h > 0, h * torch.log(h.clamp(min=1e-300)), torch.zeros((), dtype=h.dtype))
    glog = torch.cat([zero, torch.cumsum(hlogh, 0)])
    total = float(cum[-1])
    i = cands.long()
    k = torch.arange(levels + 1)
    b = torch.div(k[None, :] * i[:, None] + levels - 1, levels, rounding_mode="floor")   # [C, levels+1]
    s_k = cum[b[:, 1:]] - cum[b[:, :-1]]
    n_k = cnt[b[:, 1:]] - cnt[b[:, :-1]]
    avg = torch.where(s_k > 0, s_k / n_k.clamp(min=1.0), torch.ones((), dtype=h.dtype))
    group_term = (s_k * torch.log(avg)).sum(1)
    outliers = total - cum[i]
    last = h[i - 1] + outliers
    last_log = torch.where(last > 0, last * torch.log(last.clamp(min=1e-300)), torch.zeros((), dtype=h.dtype))
    a = glog[i - 1] + last_log - total * math.log(total)
    kl = (a - group_term - outliers * torch.log(avg[:, -1]) + total * torch.log(cum[i])) / total
    kl = torch.where((h[i - 1] == 0) & (outliers > 0), torch.full((), math.inf, dtype=h.dtype), kl)
    return kl.clamp(min=0.0)

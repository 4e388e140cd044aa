"""One SQNR for the whole project, and the running statistics of a tensor against its reference.

``sqnr_db(signal, noise)`` = ``10 log10(signal / noise)`` in dB, ``noise`` the error's
power (``sum (x - ref)^2``) and ``signal`` the power the caller measures against: the
compared value's (``sum x^2``, torchao's ``compute_sqnr(x, ref)`` convention, which
PT2E's numeric debugger reports) for per-layer numbers, the float outputs' for the
mixed-precision choice's output SQNR. None when the error is zero (x equals ref: no
finite SQNR), in every file that records one. The layers stage, the
calibrate stage's per-layer SQNR (:mod:`.layer_sqnr`) and the mixed-precision
stage's output SQNR all use it.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def sqnr_db(signal: float, noise: float) -> float | None:
    """``10 log10(signal / noise)`` (dB; unrounded) for ``signal`` = sum x^2 and ``noise`` =
    sum (x - ref)^2; None when ``noise`` is 0 (identical). A zero ``signal`` against a
    non-zero error gives a very low finite value (about -3000 dB), never an error."""
    if noise <= 0.0:
        return None
    return 10.0 * math.log10(max(signal, 1e-300) / noise)


class Stats:
    """Running SQNR / cosine / max |error| of ``x`` against ``ref``, and the
    largest integer-step difference when integers are given; per-image sums
    in float32 (BLAS), accumulated over images in float64."""

    def __init__(self):
        self.ref2 = self.x2 = self.err2 = self.dot = 0.0
        self.max_abs = 0.0
        self.max_lsb: int | None = None
        self.n = 0

    def add(self, ref, x, ref_int=None, x_int=None) -> None:
        r = torch.as_tensor(ref, dtype=torch.float32).reshape(-1)
        a = torch.as_tensor(x, dtype=torch.float32).reshape(-1)
        if r.shape != a.shape:
            raise ValueError(f"sizes differ: {tuple(np.shape(ref))} vs {tuple(np.shape(x))}")
        e = r - a
        self.ref2 += float(torch.dot(r, r))
        self.x2 += float(torch.dot(a, a))
        self.err2 += float(torch.dot(e, e))
        self.dot += float(torch.dot(r, a))
        self.max_abs = max(self.max_abs, float(e.abs().max()) if e.numel() else 0.0)
        if ref_int is not None:
            d = np.abs(np.asarray(ref_int, np.int32).ravel() - np.asarray(x_int, np.int32).ravel())
            self.max_lsb = max(self.max_lsb or 0, int(d.max(initial=0)))
        self.n += 1

    def sqnr_db(self) -> float | None:
        """``10 log10(sum x^2 / sum (x - ref)^2)``: torchao's ``compute_sqnr(x, ref)``
        (what the debugger's ``QuantizationComparisonResult.sqnr`` reports for one
        image: the compared value's power over the error's) on all images
        together. None when ``x`` equals ``ref`` exactly."""
        return sqnr_db(self.x2, self.err2)

    def result(self) -> dict:
        sqnr = self.sqnr_db()
        den = math.sqrt(self.ref2 * self.x2)
        cos = self.dot / den if den > 0 else (1.0 if self.ref2 == self.x2 else 0.0)
        out = {"sqnr_db": None if sqnr is None else round(sqnr, 3), "cosine": round(min(cos, 1.0), 6),
               "max_abs": float(f"{self.max_abs:.6g}")}
        if self.max_lsb is not None:
            out["max_lsb"] = self.max_lsb
        return out

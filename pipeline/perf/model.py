"""The C7x performance model: estimated cycles of one kernel call.

Built like Arm Vela's ``npu_performance`` (an op costs the maximum of its
compute cycles and the cycles of each memory area it touches), with the
C7x's engines and memory levels, and a fixed cost per call:

    cycles = max(compute, l2, msmc, ddr, dma_overlapped) + dma_serial + call

- ``compute``: work over the engine's rate. MMA (an MMALIB conv / matmul):
  MACs / (peak(dtype) x ``mma_efficiency``); a depthwise conv uses one
  diagonal of the MMA's lanes x lanes product, so its rate is that over the
  lane count (``Target.lanes``: 32 int8 lanes at 256 bits; assumed, not
  measured). C7x vector kernel (residual add, pools, requantize, LUT...):
  elements / lanes, one element per lane per cycle (assumed), times the
  kernel's ``vector_factor`` (softmax, LayerNorm: several passes, 64-bit lanes). TVM scalar
  function: loop iterations (buffer stores) / ``scalar_macs_per_cycle``.
- memory, per level: L2 and MSMC bytes over their rates; DDR read in place by
  the kernel (no staging) at ``ddr_read_efficiency`` of the DDR bandwidth,
  DDR writes at the full bandwidth (posted writes); bytes staged into L2 by
  DMA at min(DMA, DDR) rate, added (``dma_serial``: a synchronous copy,
  docs/estimate.md) or overlapped with compute (double-buffered).
- ``call``: the target's fixed cost per call of the engine.

The three free constants (:class:`Constants`) are fitted on one measured
conv only (:data:`DOCUMENT_CONV`, :func:`fit`); docs/estimate.md ("The fitted
constants") records the measurements, each fitted value and how. The call records are
``manifest.json``'s (:mod:`pipeline.backend.call_work`). Pure Python: no
torch, no tvm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from ..backend.kernels import catalog
from ..target import DEFAULT_TARGET, Target, load_target

ENGINES = (*catalog.ENGINES, "scalar")
BOUNDS = ("compute", "memory", "overhead")


@dataclass(frozen=True)
class Constants:
    """The model's fitted constants (:func:`fit`).

    ``mma_efficiency``: share of the MMA peak an MMALIB conv reaches with its
    operands in L2 SRAM; ``ddr_read_efficiency``: share of the DDR bandwidth a
    kernel gets reading DDR in place (latency-bound: no staging, no prefetch);
    ``scalar_macs_per_cycle``: loop iterations per cycle of TVM's scalar C."""

    mma_efficiency: float
    ddr_read_efficiency: float
    scalar_macs_per_cycle: float


# ----------------------------------------------------------------------------- the measured conv

#: One int8 conv, 64 -> 64 channels, 3x3, pad 1, 56x56, measured three ways on AM67A at 1 GHz
#: (docs/estimate.md, "The fitted constants"). The only figures the constants are fitted on.
DOCUMENT_CONV = {"c_in": 64, "c_out": 64, "k": 3, "h": 56, "w": 56,
                 "cycles": {"scalar": 45_200_000, "mmalib_ddr": 1_670_000, "mmalib_l2_dma": 477_000}}


def _rw(name: str, nbytes: int, level: str, kind: str = "activation", dtype: str = "int8", **more) -> dict:
    return {"tensor": name, "bytes": nbytes, "dtype": dtype, "level": level, "kind": kind, **more}


def conv_call(case: str, c_in: int = 64, c_out: int = 64, k: int = 3, h: int = 56, w: int = 56) -> dict:
    """A call record (as in ``manifest.json``) of an int8 ``k x k`` same-size conv,
    ``case``: "scalar" (TVM's C, data in DDR), "mmalib_ddr" (MMALIB reading DDR
    in place) or "mmalib_l2_dma" (input and weights copied DDR -> L2 by DMA before
    the call; bias, scales and output stay in DDR: docs/estimate.md)."""
    macs = h * w * c_out * c_in * k * k
    staged = case == "mmalib_l2_dma"
    lvl = "l2" if staged else "ddr"
    dma = {"staged_from": "ddr", "dma": "serial"} if staged else {}
    reads = [_rw("input", c_in * h * w, lvl, **dma), _rw("weight", c_out * c_in * k * k, lvl, "weight", **dma),
             _rw("bias", 4 * c_out, "ddr", "weight", "int32"), _rw("scale", 4 * c_out, "ddr", "weight", "int32"),
             _rw("shift", 4 * c_out, "ddr", "weight", "int32")]
    writes = [_rw("output", c_out * h * w, "ddr")]
    if case == "scalar":
        return {"backend": "tvm", "kernel": "conv2d", "func": "conv2d", "dtype": "int8",
                "work": {"iterations": macs, "macs": macs}, "reads": reads, "writes": writes}
    kernel = catalog.find("conv2d", "int8")
    return {"backend": "mmalib", "kernel": kernel, "func": kernel, "dtype": "int8",
            "work": {"macs": macs}, "reads": reads, "writes": writes}


# ----------------------------------------------------------------------------- one call

def engine(call: dict) -> str:
    """The engine that runs a call: one of :data:`ENGINES`."""
    if call["backend"] == "tvm":
        return "scalar"
    return catalog.kernel(call["kernel"]).engine


def _operand_dtype(call: dict) -> str:
    acts = [r["dtype"] for r in call["reads"] if r["kind"] == "activation"]
    return acts[0] if acts else call.get("dtype", "int8")


def compute_cycles(call: dict, target: Target, k: Constants) -> float:
    """Compute cycles of a call (module docstring)."""
    kind, work = engine(call), call["work"]
    dtype = _operand_dtype(call)
    if kind == "scalar":
        return work["iterations"] / k.scalar_macs_per_cycle
    if kind == "vector":
        return work["elements"] * catalog.kernel(call["kernel"]).vector_factor / target.lanes(dtype)
    rate = target.mma_macs_per_cycle(dtype) * k.mma_efficiency
    if kind == "mma_depthwise":
        rate /= target.lanes(dtype)
    return work["macs"] / rate


def memory_cycles(call: dict, target: Target, k: Constants) -> dict:
    """Cycles per memory level (``l2``, ``msmc``, ``ddr``) and of DMA staging
    (``dma_serial``, ``dma_overlapped``), and the bytes behind them."""
    bytes_at = {"l2": 0, "msmc": 0, "ddr_read": 0, "ddr_write": 0, "dma_serial": 0, "dma_overlapped": 0}
    for rw, key in ((call["reads"], "ddr_read"), (call["writes"], "ddr_write")):
        for r in rw:
            if r["level"] == "ddr":
                bytes_at[key] += r["bytes"]
            else:
                bytes_at[r["level"]] += r["bytes"]
                if r.get("staged_from") == "ddr":
                    bytes_at["dma_serial" if r.get("dma") == "serial" else "dma_overlapped"] += r["bytes"]
    ddr = target.ddr_bytes_per_cycle
    dma = min(target.dma_bytes_per_cycle, ddr)
    cycles = {"l2": bytes_at["l2"] / target.l2_bytes_per_cycle,
              "msmc": bytes_at["msmc"] / target.msmc_bytes_per_cycle,
              "ddr": bytes_at["ddr_read"] / (ddr * k.ddr_read_efficiency) + bytes_at["ddr_write"] / ddr,
              "dma_serial": bytes_at["dma_serial"] / dma, "dma_overlapped": bytes_at["dma_overlapped"] / dma}
    return {"cycles": cycles, "bytes": bytes_at}


def call_overhead(call: dict, target: Target) -> int:
    """The target's fixed cost of one call of this engine."""
    return {"mmalib": target.mmalib_call_cycles, "c7x": target.c7x_call_cycles}.get(
        call["backend"], target.tvm_call_cycles)


def estimate_call(call: dict, target: Target, k: Constants | None = None) -> dict:
    """Estimated cycles of one call record (``manifest.json`` call or :func:`conv_call`).

    Returns ``{"engine", "cycles", "compute", "memory": {level: cycles},
    "dma_serial", "overhead", "bound", "bound_level", "bytes": {...}}``:
    ``bound`` is "compute", "memory" or "overhead", whichever term is largest,
    ``bound_level`` the memory level behind a memory bound. ``k``: the fitted
    constants (default :func:`fitted`). Raises KeyError for a record without
    ``work`` / ``reads`` / ``writes`` (a manifest older than the estimate:
    re-run codegen)."""
    k = k or fitted()
    compute = compute_cycles(call, target, k)
    mem = memory_cycles(call, target, k)
    c = mem["cycles"]
    levels = {lvl: c[lvl] for lvl in ("l2", "msmc", "ddr")}
    overlapped = c["dma_overlapped"]
    body = max(compute, *levels.values(), overlapped)
    overhead = call_overhead(call, target)
    cycles = body + c["dma_serial"] + overhead
    mem_level, mem_cycles = max(levels.items(), key=lambda kv: kv[1])
    if overlapped > mem_cycles:
        mem_level, mem_cycles = "dma", overlapped
    terms = {"compute": compute, "memory": mem_cycles + c["dma_serial"], "overhead": overhead}
    bound = max(BOUNDS, key=lambda b: terms[b])
    return {"engine": engine(call), "cycles": cycles, "compute": compute,
            "memory": {**levels, "dma_overlapped": overlapped}, "dma_serial": c["dma_serial"],
            "overhead": overhead, "bound": bound, "bound_level": mem_level if bound == "memory" else None,
            "bytes": mem["bytes"]}


# ----------------------------------------------------------------------------- the fit

def fit(target: Target) -> Constants:
    """Fit :class:`Constants` on :data:`DOCUMENT_CONV`, measured on ``target`` (AM67A).

    Closed form, one case per constant:
    1. scalar: compute-bound, so ``scalar_macs_per_cycle = MACs / (45.2M - call)``;
    2. MMALIB + L2 DMA: compute-bound after the synchronous DMA, so
       ``mma_efficiency = MACs / (peak * (477K - dma - call))``;
    3. MMALIB reading DDR: memory-bound, so ``ddr_read_efficiency`` makes the
       DDR term equal ``1.67M - call``.
    Each assumption is then checked: the model must give back all three
    figures (within 0.1%), else ValueError names the case that broke it."""
    d, measured = DOCUMENT_CONV, DOCUMENT_CONV["cycles"]
    dims = {key: d[key] for key in ("c_in", "c_out", "k", "h", "w")}
    calls = {case: conv_call(case, **dims) for case in measured}
    macs = calls["scalar"]["work"]["macs"]
    scalar = macs / (measured["scalar"] - target.tvm_call_cycles)
    probe = Constants(1.0, 1.0, scalar)
    dma = memory_cycles(calls["mmalib_l2_dma"], target, probe)["cycles"]["dma_serial"]
    mma = macs / (target.mma_int8_macs_per_cycle * (measured["mmalib_l2_dma"] - dma - target.mmalib_call_cycles))
    b = memory_cycles(calls["mmalib_ddr"], target, probe)["bytes"]
    ddr = target.ddr_bytes_per_cycle
    read_time = measured["mmalib_ddr"] - target.mmalib_call_cycles - b["ddr_write"] / ddr
    k = Constants(mma_efficiency=mma, ddr_read_efficiency=b["ddr_read"] / (ddr * read_time),
                  scalar_macs_per_cycle=scalar)
    for case, call in calls.items():
        got = estimate_call(call, target, k)["cycles"]
        if not math.isclose(got, measured[case], rel_tol=1e-3):
            raise ValueError(f"the fit's assumption for case {case} does not hold: model {got:,.0f} "
                             f"cycles, measured {measured[case]:,}")
    return k


@cache
def fitted() -> Constants:
    """:func:`fit` on the default target's file (AM67A, where the conv was measured)."""
    return fit(load_target(DEFAULT_TARGET))


# ----------------------------------------------------------------------------- a layer before codegen

def layer_call(op: str, dtype: str, *, macs: int, in_elems: int, out_elems: int, w_elems: int = 0,
               c_out: int = 1, depthwise: bool = False) -> dict:
    """A call record for one layer of a float program, before any codegen: what the
    mixed-precision budget in cycles (``[quantizer] int16_cycles``) estimates.

    ``op``: "conv2d" / "linear" (an MMALIB kernel) or "add" (the C7x residual add);
    ``dtype``: "int8" / "int16" activations (an int16 MMALIB kernel reads its int8
    weights widened to int16, as codegen stores them); bias, scale and shift as
    three int32 per output channel. Every tensor in DDR, as the flat plan puts it."""
    size = 2 if dtype == "int16" else 1
    if op == "add":
        return {"backend": "c7x", "kernel": catalog.find("residual_add", dtype), "dtype": dtype,
                "work": {"elements": 2 * in_elems + out_elems},
                "reads": [_rw("x", in_elems * size, "ddr", dtype=dtype), _rw("skip", in_elems * size, "ddr", dtype=dtype)],
                "writes": [_rw("out", out_elems * size, "ddr", dtype=dtype)]}
    kernel = catalog.find("depthwise_conv2d" if depthwise else "conv2d" if op == "conv2d" else "matmul_bias", dtype)
    reads = [_rw("input", in_elems * size, "ddr", dtype=dtype),
             _rw("weight", w_elems * size, "ddr", "weight", dtype),
             _rw("requant", 12 * c_out, "ddr", "weight", "int32")]
    return {"backend": "mmalib", "kernel": kernel, "dtype": dtype, "work": {"macs": macs},
            "reads": reads, "writes": [_rw("output", out_elems * size, "ddr", dtype=dtype)]}

"""Quantization specs of the C7x quantizer: option checking and the two specs it hands out.

Two specs exist, both built from torchao observer classes (torch.ao observers
are not converted by torchao's ``convert_pt2e``; docs/reference.md, "Quantizer rules"):

* **activation spec**: per-tensor, dtype int8 [-128, 127] or int16
  [-32768, 32767]; ``per_tensor_symmetric`` (zero point 0), or
  ``per_tensor_affine`` for int8 with ``symmetric_activations=False``.
  Observer (:data:`OBSERVERS`): ``MinMaxObserver`` (the reference's),
  ``HistogramObserver`` (torchao's L2 search: the range minimising the
  mean-squared quantization error, i.e. the MSE-optimal method),
  ``MovingAverageMinMaxObserver``, or the clipping observers of
  :mod:`pipeline.quant.observers`: ``PercentileObserver`` (takes the option
  ``percentile``) and ``EntropyObserver`` (TensorRT's KL calibration).
* **weight spec**: ``PerChannelMinMaxObserver``, ``per_channel_symmetric``,
  ``ch_axis=0`` (output channels of OIHW conv / [out, in] linear weights),
  zero point 0. dtype int8 [-128, 127] by default for both activation dtypes
  (the user's examples, int8 vs int16: int16 mode keeps int8 weights;
  docs/reference.md, "The user's examples"); int16 [-32768, 32767] with
  ``weight_dtype="int16"`` (what the reference *code* does in int16 mode,
  docs/reference.md, "Quantizer rules", and what its i16 MMALIB passes
  require, "Eligibility").
"""

from __future__ import annotations

import warnings

import torch
from torchao.quantization.pt2e import (HistogramObserver, MinMaxObserver,
                                       MovingAverageMinMaxObserver, PerChannelMinMaxObserver)
from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec, QuantizationSpec

from .observers import EntropyObserver, PercentileObserver

#: dtype name -> (torch dtype, quant_min, quant_max); the full range of the type
#: (docs/reference.md, "Quantizer rules").
DTYPES: dict[str, tuple[torch.dtype, int, int]] = {
    "int8": (torch.int8, -128, 127),
    "int16": (torch.int16, -32768, 32767),
}

#: observer option -> torchao activation observer class ("minmax" is the reference's;
#: "histogram" is the MSE-optimal range, see the module docstring).
OBSERVERS = {
    "minmax": MinMaxObserver,
    "histogram": HistogramObserver,
    "moving_average": MovingAverageMinMaxObserver,
    "percentile": PercentileObserver,
    "entropy": EntropyObserver,
}

#: observer option -> the keyword arguments it accepts (its calibration options).
OBSERVER_OPTIONS: dict[str, tuple[str, ...]] = {"percentile": ("percentile",)}

#: accepted ``weight_dtype`` values; None means "int8" (the user's examples, docs/reference.md).
WEIGHT_DTYPES = (None, "int8", "int16")


def check_dtype(dtype: str) -> str:
    """Return ``dtype`` if it is "int8" or "int16"; raise ValueError naming both otherwise
    (docs/reference.md, "Quantizer rules": constructor)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dtype


def check_observer(observer: str) -> type:
    """The torchao observer class for ``observer``; ValueError naming the allowed values."""
    if observer not in OBSERVERS:
        raise ValueError(f"observer must be one of {sorted(OBSERVERS)}, got {observer!r}")
    return OBSERVERS[observer]


def check_observer_kwargs(observer: str, kwargs: dict | None) -> dict:
    """``kwargs`` (None -> {}) if every key is an option of ``observer``
    (:data:`OBSERVER_OPTIONS`, e.g. ``{"percentile": 99.9}`` for "percentile");
    ValueError naming the accepted ones otherwise."""
    kwargs = dict(kwargs or {})
    allowed = OBSERVER_OPTIONS.get(observer, ())
    extra = sorted(set(kwargs) - set(allowed))
    if extra:
        raise ValueError(f"observer {observer!r} takes the options {list(allowed)}, got {extra}")
    return kwargs


def resolve_symmetric(dtype: str, symmetric_activations: bool) -> bool:
    """Whether activations are symmetric. int16 is always symmetric: asking for
    asymmetric int16 emits a UserWarning and is ignored (docs/reference.md, "Quantizer
    rules" and "The user's examples": asymmetric int16 has no lowering path)."""
    if dtype == "int16" and not symmetric_activations:
        warnings.warn("int16 activations are always symmetric (asymmetric int16 has no lowering "
                      "path); symmetric_activations=False is ignored", UserWarning, stacklevel=3)
        return True
    return bool(symmetric_activations)


def resolve_weight_dtype(weight_dtype: str | None) -> str:
    """The weight dtype name of int16-activation layers: None -> "int8" (the user's
    examples, docs/reference.md) or "int16". Layers with int8 activations always get
    int8 weights (int16 weights under int8 activations have no kernel, docs/reference.md,
    "Eligibility"), so in an int8 model an "int16" only reaches mixed precision's
    int16 layers. Raises ValueError for any other value."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {list(WEIGHT_DTYPES)}, got {weight_dtype!r}")
    return weight_dtype or "int8"


def activation_spec(dtype: str, symmetric: bool, observer_cls: type,
                    observer_kwargs: dict | None = None) -> QuantizationSpec:
    """Per-tensor activation spec (see module docstring); zero point 0 when ``symmetric``.
    ``observer_kwargs``: extra constructor arguments of ``observer_cls`` (its options)."""
    qdtype, qmin, qmax = DTYPES[dtype]
    return QuantizationSpec(
        dtype=qdtype, quant_min=qmin, quant_max=qmax,
        qscheme=torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine,
        observer_or_fake_quant_ctr=observer_cls.with_args(**(observer_kwargs or {})))


def softmax_output_spec() -> FixedQParamsQuantizationSpec:
    """The int8 output spec of a softmax: fixed scale 1/256 and zero point -128, so
    [0, 1) takes all 256 codes (1.0 saturates to 127), the ``c7x_int8_softmax``
    kernel's output (:data:`pipeline.backend.kernels.reference.SOFTMAX_OUT_SCALE`;
    docs/reference.md, "Softmax"). No observer: the range of a probability is known."""
    from ..backend.kernels.reference import SOFTMAX_OUT_SCALE, SOFTMAX_OUT_ZERO_POINT
    return FixedQParamsQuantizationSpec(dtype=torch.int8, scale=SOFTMAX_OUT_SCALE,
                                        zero_point=SOFTMAX_OUT_ZERO_POINT, quant_min=-128, quant_max=127,
                                        qscheme=torch.per_tensor_affine)


def weight_spec(weight_dtype: str) -> QuantizationSpec:
    """Per-channel symmetric weight spec, axis 0, zero point 0 (docs/reference.md,
    "Quantizer rules": weights)."""
    qdtype, qmin, qmax = DTYPES[weight_dtype]
    return QuantizationSpec(
        dtype=qdtype, quant_min=qmin, quant_max=qmax, qscheme=torch.per_channel_symmetric,
        ch_axis=0, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args())

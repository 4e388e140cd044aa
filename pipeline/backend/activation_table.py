"""Compile-time 256-entry tables of int8 element-wise activations (torch).

An int8 tensor has 256 values, so any element-wise activation with its
requantization is a table: ``table[v + 128] = q(f(dq(v)))`` for
``v in [-128, 127]`` (``docs/reference.md``, "Activation tables"). The table
is computed with the very ops torch's Q/DQ program runs for the layer
(``quantized_decomposed.dequantize_per_tensor``, the aten activation,
``quantized_decomposed.quantize_per_tensor``, all float32 on the CPU), so the
``c7x_int8_lut`` kernel reproduces the Q/DQ model exactly, by construction.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .. import torchenv

#: activation kind (the offload log's ``op``) -> the torch function of the Q/DQ program.
ACTIVATIONS = {
    "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh,
}


def activation_table(kind: str, s_in: float, zp_in: int, s_out: float, zp_out: int) -> np.ndarray:
    """int8[256] table of ``q(f(dq(v)))`` for ``v = -128 .. 127`` (index ``v + 128``).

    ``kind``: a key of :data:`ACTIVATIONS` (KeyError otherwise); ``s_in`` / ``zp_in``:
    the input's per-tensor scale and zero point, ``s_out`` / ``zp_out`` the output's
    (the float32 scales torch stored, passed as Python floats like the Q/DQ program).
    """
    torchenv.setup()   # the quantized_decomposed ops registered
    fn = ACTIVATIONS[kind]
    v = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)
    qd = torch.ops.quantized_decomposed
    with torch.no_grad():
        d = qd.dequantize_per_tensor(v, float(s_in), int(zp_in), -128, 127, torch.int8)
        q = qd.quantize_per_tensor(fn(d), float(s_out), int(zp_out), -128, 127, torch.int8)
    return q.numpy().astype(np.int8)

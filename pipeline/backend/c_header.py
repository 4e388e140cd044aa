"""``model.h``: the entry point's declarations, shapes, quantization, sizes, error codes and
the input preprocessing, printed from the static memory plan (:mod:`.emit_c` writes it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedOpError
from .memory_plan import LEVELS, Plan

#: the named section of each memory level (c7x_memory.cmd maps them)
SECTIONS = {"l2": ".l2sram", "msmc": ".msmc", "ddr": ".ddr"}
_DL_CODE = {"int": "kDLInt", "uint": "kDLUInt", "float": "kDLFloat"}


def arena_name(m: str, level: str | None) -> str:
    """C name of the activation arena of ``level`` (None: the flat plan's one arena)."""
    return f"{m}_arena" + (f"_{level}" if level else "")


def hex_literal(value: float, bits: int = 32) -> str:
    """Exact C99 hexadecimal floating constant of a float32 (``f`` suffix) or
    float64 value, e.g. 0.5 -> ``0x1p-1f``."""
    v = float(np.float32(value)) if bits == 32 else float(value)
    text = v.hex()  # [-]0x1.<13 hex digits>p<exp>
    if "." in text:
        mant, exp = text.split("p")
        text = mant.rstrip("0").rstrip(".") + "p" + exp
    return text + ("f" if bits == 32 else "")

def dl_dtype(dtype: str) -> str:
    kind = re.match(r"[a-z]+", dtype).group(0)
    if kind not in _DL_CODE:
        raise UnsupportedOpError(f"tensor of dtype {dtype} in the lowered main")
    return f"{{{_DL_CODE[kind]}, {int(dtype[len(kind):])}, 1}}"

def shape_init(shape) -> str:
    return "{" + ", ".join(str(d) for d in shape) + "}" if shape else "{0}"

@dataclass
class Quant:
    """Quantization of the model input (its first quantize) or output (its
    last dequantize): ``dtype`` of the integers, ``scale``, ``zero_point``."""

    dtype: str
    scale: float
    zero_point: int

def c_float(value: float) -> str:
    """Shortest decimal C literal of a float32 (``0.485f``) that reads back
    as exactly ``float32(value)``."""
    return np.format_float_positional(np.float32(value), unique=True, trim="0") + "f"

PREPROCESS_KEYS = ("resize", "crop", "mean", "std")

def check_preprocess(pre: dict) -> dict:
    """Validate ``{"resize": int, "crop": int, "mean": [3 numbers], "std": [3
    numbers]}`` and optionally ``"letterbox": bool`` (the model's preprocessing,
    ``PreprocessSpec`` fields); returns it normalized (ints, float tuples, a bool).
    Raises ValueError naming the bad key."""
    if set(pre) - {"letterbox"} != set(PREPROCESS_KEYS):
        raise ValueError(f"preprocess needs exactly the keys {list(PREPROCESS_KEYS)} (and optionally "
                         f"'letterbox'), got {sorted(pre)}")
    if not isinstance(pre.get("letterbox", False), bool):
        raise ValueError(f"preprocess['letterbox'] must be true or false, got {pre['letterbox']!r}")
    out = {"letterbox": pre.get("letterbox", False)}
    for key in ("resize", "crop"):
        v = pre[key]
        if key == "resize" and isinstance(v, (tuple, list)) and len(v) == 2 and all(map(_pixels, v)):
            out[key] = (int(v[0]), int(v[1]))  # exact [H, W] (the "yolo" preset)
            continue
        if not _pixels(v):
            raise ValueError(f"preprocess[{key!r}] must be a positive int"
                             + (" or [H, W]" if key == "resize" else "") + f", got {v!r}")
        out[key] = int(v)
    for key in ("mean", "std"):
        v = list(pre[key])
        if len(v) != 3 or not all(isinstance(x, (int, float, np.floating, np.integer)) for x in v):
            raise ValueError(f"preprocess[{key!r}] must be 3 numbers (R, G, B), got {pre[key]!r}")
        out[key] = tuple(float(x) for x in v)
    return out

def _pixels(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v > 0

def _preprocess_lines(M: str, pre: dict | None) -> list[str]:
    if pre is None:
        return []
    pre = check_preprocess(pre)
    exact = isinstance(pre["resize"], tuple)
    resize = (f"#define {M}_PREPROCESS_RESIZE_HW {{{pre['resize'][0]}, {pre['resize'][1]}}} "
              f"/* resized to exactly H, W pixels (aspect not kept) */" if exact else
              f"#define {M}_PREPROCESS_RESIZE {pre['resize']} /* shorter side, pixels */")
    how = "resized to H x W" if exact else "shorter side resized"
    if pre["letterbox"]:
        return ["/* input preprocessing (as calibrated): RGB in [0,1], letterboxed as ultralytics does: "
                "scaled by min(S/H, S/W) (bilinear, no antialiasing) to round(H*r) x round(W*r), padded "
                "with gray 114/255 to S x S (top = round(pad_h/2 - 0.1), left likewise), NCHW float32 */",
                f"#define {M}_PREPROCESS_LETTERBOX {pre['crop']} /* S, pixels */",
                f"#define {M}_PREPROCESS_MEAN {{{', '.join(c_float(v) for v in pre['mean'])}}} /* R, G, B */",
                f"#define {M}_PREPROCESS_STD {{{', '.join(c_float(v) for v in pre['std'])}}} /* R, G, B */", ""]
    return [f"/* input preprocessing (as calibrated): RGB in [0,1], {how} with bilinear "
            "antialiasing (torchvision), center crop, normalize, NCHW float32 */",
            "/* normalize: (x - MEAN[c]) / STD[c] per channel c = R, G, B */",
            resize,
            f"#define {M}_PREPROCESS_CROP {pre['crop']} /* center crop, pixels */",
            f"#define {M}_PREPROCESS_MEAN {{{', '.join(c_float(v) for v in pre['mean'])}}} /* R, G, B */",
            f"#define {M}_PREPROCESS_STD {{{', '.join(c_float(v) for v in pre['std'])}}} /* R, G, B */", ""]

def header(m: str, plan: Plan, sizes: dict, crc: int, quant: dict[str, Quant | None],
           c_array: bool, preprocess: dict | None = None) -> str:
    """Text of model.h (see the module docstring). ``preprocess``: see
    :func:`check_preprocess`; None leaves the PREPROCESS macros out."""
    M = m.upper()
    lines = [f"/* model.h: static C entry of model {m}; generated by doit-c7x, do not edit. */",
             f"#ifndef {M}_MODEL_H", f"#define {M}_MODEL_H", "", "#include <stddef.h>", "#include <stdint.h>", ""]
    lines += _preprocess_lines(M, preprocess)
    roles = (("INPUT", plan.input),) + ((("OUTPUT", plan.output),) if len(plan.outputs) < 2 else ())
    for role, t in roles:
        n = int(np.prod(t.shape))
        lines += [f"/* {role.lower()}: float32, NCHW for images */",
                  f"#define {M}_{role}_NDIM {len(t.shape)}",
                  f"#define {M}_{role}_SHAPE {shape_init(t.shape)}",
                  f"#define {M}_{role}_SIZE {n} /* float32 elements */"]
        q = quant.get(role.lower())
        if q is not None:
            lines += [f"/* quantized as {q.dtype}: q = clamp(round(x * (1 / scale)) + zero_point), as torch */",
                      f"#define {M}_{role}_QDTYPE \"{q.dtype}\"",
                      f"#define {M}_{role}_SCALE {hex_literal(q.scale)} /* {np.float32(q.scale)} */",
                      f"#define {M}_{role}_ZERO_POINT {q.zero_point}"]
        lines.append("")
    if len(plan.outputs) > 1:
        lines += _outputs_lines(M, plan)
    lines += ["/* memory, bytes */",
              f"#define {M}_ARENA_BYTES {sizes['arena']}u /* static activation arena"
              + (", all levels */" if plan.levels is not None else " */")]
    if plan.levels is not None:
        lv = plan.levels
        lines += [f"#define {M}_ARENA_{lvl.upper()}_BYTES {lv.arena[lvl]}u /* activations in {SECTIONS[lvl]} */"
                  for lvl in LEVELS if lv.arena[lvl]]
        if lv.slot_bytes:
            lines.append(f"#define {M}_WEIGHT_SLOT_BYTES {lv.slot_bytes}u /* one of two L2 weight slots */")
    lines += [
              f"#define {M}_WORKSPACE_BYTES {sizes['workspace']}u /* static kernel scratch (LIFO) */",
              f"#define {M}_WEIGHTS_BYTES {sizes['weights']}u /* weights.bin, 64-byte aligned */",
              f"#define {M}_WEIGHTS_COUNT {len(plan.weights)}u",
              f"#define {M}_WEIGHTS_CRC32 0x{crc:08x}u", "",
              "/* return codes of the functions below */",
              f"#define {M}_OK 0",
              f"#define {M}_ERR_NULL (-1)      /* a NULL pointer argument */",
              f"#define {M}_ERR_WEIGHTS (-2)   /* weights blob: bad magic/version/count/size/CRC or another build's */",
              f"#define {M}_ERR_ALIGN (-3)     /* weights not 64-byte aligned */",
              f"#define {M}_ERR_WORKSPACE (-4) /* a kernel asked for more scratch than the static workspace */",
              f"#define {M}_ERR_KERNEL_BASE (-1000) /* -1000 - k: kernel call k (0-based, model.c order) failed */",
              "",
              "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
              "/* One inference. weights: the weights.bin blob (64-byte aligned); input:",
              f" * {M}_INPUT_SIZE floats; output: {M}_OUTPUT_SIZE floats. Not reentrant (static arena). */",
              f"int {m}_run(const uint8_t* weights, const float* input, float* output);", "",
              "/* Full check of a weights blob of nbytes bytes (header, size, CRC-32): 0 or an error. */",
              f"int {m}_check_weights(const uint8_t* weights, size_t nbytes);", ""]
    if c_array:
        lines += ["/* weights.bin as a C array (weights_data.c) */",
                  f"extern const uint8_t {m}_weights[{M}_WEIGHTS_BYTES];", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", f"#endif /* {M}_MODEL_H */", ""]
    return "\n".join(lines)

def _outputs_lines(M: str, plan: Plan) -> list[str]:
    """model.h macros of a model with several outputs: all packed back to back
    in ``output`` in the model's return order (``<M>_OUTPUT<i>_OFFSET``)."""
    total = sum(plan.output_size(i) for i in range(len(plan.outputs)))
    lines = [f"/* {len(plan.outputs)} outputs, float32, packed back to back in output[] in the model's "
             f"return order: output i is output[{M}_OUTPUT<i>_OFFSET ...] */",
             f"#define {M}_OUTPUT_COUNT {len(plan.outputs)}",
             f"#define {M}_OUTPUT_SIZE {total} /* float32 elements, all outputs */"]
    for i, (t, off) in enumerate(zip(plan.outputs, plan.output_offsets)):
        lines += [f"#define {M}_OUTPUT{i}_NDIM {len(t.shape)}",
                  f"#define {M}_OUTPUT{i}_SHAPE {shape_init(t.shape)}",
                  f"#define {M}_OUTPUT{i}_SIZE {plan.output_size(i)} /* float32 elements */",
                  f"#define {M}_OUTPUT{i}_OFFSET {off} /* float32 elements into output */"]
    return lines + [""]

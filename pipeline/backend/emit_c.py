"""Lowered Relax module -> standalone static C: model.h, model.c, tvm_kernels.c, weights.bin.

Files written by :func:`emit` (``<m>`` is the C name of the model):

- ``model.h``: ``int <m>_run(const uint8_t* weights, const float* input,
  float* output)``, ``int <m>_check_weights(const uint8_t* weights, size_t
  nbytes)``, input/output shapes, the quantization of the model's input
  quantize and output dequantize, arena/workspace/weights sizes, the
  weights.bin CRC-32, the error codes and, when given, the input
  preprocessing (``<M>_PREPROCESS_RESIZE/CROP/MEAN/STD``).
- ``model.c``: the entry point. One static activation arena laid out by
  TVM's ``StaticPlanBlockMemory`` (each storage at a 64-byte aligned offset),
  one static LIFO workspace serving ``TVMBackendAllocWorkspace`` (no malloc;
  an oversize request makes the kernel fail and ``<m>_run`` return
  ``<M>_ERR_WORKSPACE``), one static ``DLTensor`` per tensor, and one packed
  call per kernel in ``main``'s order.
- ``tvm_kernels.c``: TVM's C codegen of every PrimFunc (offload PrimFuncs
  too: their body calls the extern kernel), with TVM's includes replaced by
  ``c7x_tvm_shim.h`` + ``c7x_kernels.h``. Post-processing, each fixing a
  measured problem of the raw output:
  * float immediates and float intrinsics are made exact / valid C by two
    TIR rewrites run at the end of TVM's pipeline (:mod:`.tir_c`): a float
    constant TVM would print inexactly (7 digits, ``inff``) becomes
    ``c7x_f32_bits(<bit pattern>)``, a math intrinsic the libm call;
  * extern kernel calls: TVM discards their int32 status; it is now checked
    (nonzero -> the kernel returns -1, so ``<m>_run`` reports the layer);
  * TVM's own prototypes of the extern functions are dropped for those of
    ``c7x_kernels.h`` (const-correct), ``math.h`` and the shim;
  * ``TVMBackend{Alloc,Free}Workspace``, the kernel entry names and TVM's
    ``__tvm_ffi__library_ctx`` are made per-model, so several models link
    into one program.
- ``weights.bin`` (format in :mod:`.weights_bin`) and, for
  ``weights_format="c_array"``, ``weights_data.c``.
- ``c7x_kernels.h``, ``c7x_tvm_shim.h``: copies, included with quotes, so the
  folder compiles on its own (``gcc -I<folder>``).
- ``lowered.py``: the lowered module as TVMScript with every constant of
  ``main`` lifted to a parameter ``w<i>`` = weights.bin entry ``i``; the
  Python reference executor (:mod:`.interp`) runs it.

Everything is a pure function of the lowered module and the model name:
same input, byte-identical files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.ir import GenericConst

from ..errors import UnsupportedOpError
from . import tir_c, weights_bin
from .lower import first_line, is_offload

KERNELS_HEADER = Path(__file__).parent / "kernels" / "c7x_kernels.h"
SHIM_HEADER = Path(__file__).parent / "kernels" / "c7x_tvm_shim.h"
ARENA_ALIGN = 64

_DL_CODE = {"int": "kDLInt", "uint": "kDLUInt", "float": "kDLFloat"}


# ---------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------

def c_name(model_name: str) -> str:
    """C identifier prefix for ``model_name``: every character outside ASCII
    ``[A-Za-z0-9_]`` (accented letters too) -> ``_``, ``m_`` prepended if it
    would start with a digit (or be empty)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", model_name)
    return "m_" + name if not name or name[0].isdigit() else name


def kernel_names() -> list[str]:
    """Extern kernel names declared in ``c7x_kernels.h`` (in file order)."""
    return re.findall(r"^int32_t\s+(\w+)\s*\(", KERNELS_HEADER.read_text(), flags=re.M)


# ---------------------------------------------------------------------------
# plan: what main does, in C terms
# ---------------------------------------------------------------------------

@dataclass
class Tensor:
    """A DLTensor of the entry point. ``home``: "input", "output", "arena"
    (``offset`` = byte offset in the arena) or "weight" (``offset`` = entry
    index). ``view``: True for a reshape view of another tensor."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    home: str
    offset: int
    view: bool = False


@dataclass
class Plan:
    """The lowered ``main`` flattened: tensors, kernel calls, weights."""

    input: Tensor
    output: Tensor
    arena_bytes: int
    tensors: list[Tensor] = field(default_factory=list)
    calls: list[tuple[str, list[Tensor]]] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)
    weight_keys: dict = field(default_factory=dict)  # content key -> weights.bin entry

    @property
    def output_aliased(self) -> bool:
        """True when the last kernel writes straight into the caller's buffer."""
        return self.output.home == "output"


def const_key(const: GenericConst) -> tuple[np.ndarray, tuple]:
    """``(value, key)`` of a constant; equal contents give equal keys, so one
    weights.bin entry serves every copy of a constant."""
    value = np.asarray(const.value.numpy(), order="C")
    return value, (str(value.dtype), value.shape, value.tobytes())


def _static_shape(ty) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (TypeError, AttributeError):
        raise UnsupportedOpError(f"dynamic or unknown shape {ty}: only static shapes are supported") from None


def _int(v) -> int:
    return int(v.value) if hasattr(v, "value") else int(v)


class _Planner:
    def __init__(self, main):
        self.main = main
        self.plan = None
        self.env: dict = {}  # relax.Var -> Tensor | list[Tensor] | ("storage", offset)
        self.arena = 0

    def tensor(self, ty, home: str, offset: int, view: bool = False) -> Tensor:
        t = Tensor(f"t{len(self.plan.tensors)}", _static_shape(ty), str(ty.dtype), home, offset, view)
        self.plan.tensors.append(t)
        return t

    def arena_alloc(self, nbytes: int) -> int:
        off = self.arena
        self.arena = (off + nbytes + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN
        return off

    def weight(self, const: GenericConst) -> Tensor:
        value, key = const_key(const)
        keys = self.plan.weight_keys
        if key not in keys:
            keys[key] = len(self.plan.weights)
            self.plan.weights.append(value)
        return self.tensor(const.ty, "weight", keys[key])

    def arg(self, expr):
        if isinstance(expr, GenericConst):
            return self.weight(expr)
        if isinstance(expr, relax.Var) and expr in self.env:
            return self.env[expr]
        raise UnsupportedOpError(f"kernel argument {expr} is neither a tensor nor a constant")

    def run(self) -> Plan:
        f = self.main
        if len(f.params) != 1:
            raise UnsupportedOpError(f"main takes {len(f.params)} parameters; expected only the model input")
        x = f.params[0]
        if str(x.ty.dtype) != "float32":
            raise UnsupportedOpError(f"model input is {x.ty.dtype}; expected float32")
        self.plan = Plan(input=None, output=None, arena_bytes=0)
        self.plan.input = self.tensor(x.ty, "input", 0)
        self.env[x] = self.plan.input
        for block in f.body.blocks:
            for b in block.bindings:
                self.bind(b.var, b.value)
        out = self.env.get(f.body.body) if isinstance(f.body.body, relax.Var) else None
        out = out if isinstance(out, list) else [out]
        if len(out) != 1 or not isinstance(out[0], Tensor) or out[0].dtype != "float32":
            raise UnsupportedOpError("the model must return exactly one float32 tensor")
        self.plan.output = out[0]
        self.plan.arena_bytes = max(self.arena, ARENA_ALIGN)
        return self.plan

    def bind(self, var, value):
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            self.builtin(var, value)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            self.plan.calls.append((value.op.name_hint, [self.arg(a) for a in value.args]))
        elif isinstance(value, relax.Var):
            self.env[var] = self.env[value]
        elif isinstance(value, relax.Tuple):
            self.env[var] = [self.arg(v) for v in value.fields]
        elif isinstance(value, relax.TupleGetItem):
            self.env[var] = self.env[value.tuple_value][value.index]
        else:
            raise UnsupportedOpError(f"unexpected binding in lowered main: {type(value).__name__}")

    def builtin(self, var, call):
        op = call.op.name
        if op == "relax.memory.alloc_storage":
            nbytes = _int(call.args[0].values[0])
            self.env[var] = ("storage", self.arena_alloc(nbytes))
        elif op == "relax.memory.alloc_tensor":
            _, base = self.env[call.args[0]]
            self.env[var] = self.tensor(var.ty, "arena", base + _int(call.args[1]))
        elif op == "relax.builtin.alloc_tensor":
            # Not planned by TVM: the graph output. Written straight into the
            # caller's buffer if it is what main returns (decided at the end).
            self.env[var] = self.tensor(var.ty, "output", 0)
        elif op == "relax.reshape":
            src = self.arg(call.args[0])
            self.env[var] = self.tensor(var.ty, src.home, src.offset, view=True)
        else:
            raise UnsupportedOpError(f"op {op} left in the lowered main; the static emitter cannot run it")


def plan_main(mod: tvm.IRModule) -> Plan:
    """Flatten the lowered ``main`` (after StaticPlanBlockMemory) into a :class:`Plan`.

    Raises UnsupportedOpError for a construct the emitter cannot express
    (dynamic shapes, more than one input or output, a non-float32 output,
    an op other than allocation / kernel call / reshape view).
    """
    plan = _Planner(mod["main"]).run()
    # builtin.alloc_tensor is left by StaticPlanBlockMemory for the returned
    # tensor only; it becomes the caller's buffer. Any other one would alias it.
    unplanned = [t for t in plan.tensors if t.home == "output" and not t.view]
    if len(unplanned) > 1 or (unplanned and plan.output.home != "output"):
        raise UnsupportedOpError("unplanned intermediate tensor in the lowered main")
    return plan


# ---------------------------------------------------------------------------
# tvm_kernels.c
# ---------------------------------------------------------------------------

@dataclass
class KernelSource:
    """``source``: tvm_kernels.c text; ``workspace``: bytes each kernel takes
    from TVMBackendAllocWorkspace (each request rounded up to 64)."""

    source: str
    workspace: dict[str, int]


def _tir_to_c(prims: tvm.IRModule) -> str:
    """C source of ``prims``: ``tvm.tirx.build(prims, target="c")`` with two
    passes appended to TVM's default TIR pipeline (:mod:`.tir_c`): the float
    intrinsics left by ``lower`` as libm calls, and float immediates made
    exact, the last step before codegen. Asserts are compiled out
    (``tirx.disable_assert``), as TI's reference does (skip-runtime-checks).
    Raises UnsupportedOpError naming the kernel TVM fails on."""
    try:
        return _build_c(prims)
    except UnsupportedOpError:
        raise
    except Exception as e:  # TVM raises builtin types too (ValueError, TypeError...)
        raise UnsupportedOpError(_codegen_failure(prims, e)) from None


def _build_c(prims: tvm.IRModule) -> str:
    from tvm.tirx.build import codegen_build, split_host_device_mods

    target = tvm.target.Target("c")
    with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
        mod = tvm.tirx.transform.BindTarget(target.with_host(target))(prims)
        pipeline, finalize_host, _ = tvm.tirx.get_tir_pipeline("default")
        host_mod, device = split_host_device_mods(pipeline(mod))
        if any(len(m.functions) for m in device.values()):
            raise UnsupportedOpError("device kernels in a C build")
        host_mod = tvm.transform.Sequential([
            tir_c.module_pass(tir_c.libm_calls, "C7xLibmCalls"),
            finalize_host(),
            tir_c.module_pass(tir_c.exact_float_constants, "C7xExactFloatConstants"),
        ])(host_mod)
        return codegen_build(host_mod, target).inspect_source()


def _codegen_failure(prims: tvm.IRModule, e: Exception) -> str:
    """One-line message for a failed C build: the first kernel that fails on
    its own (its name lists the fused Relax ops), and TVM's first line."""
    for gv, func in sorted(prims.functions.items(), key=lambda kv: kv[0].name_hint):
        try:
            _build_c(tvm.IRModule({gv: func}))
        except Exception as one:  # noqa: BLE001 - any failure names this kernel
            op = re.search(r'name="([\w.]+)"', str(one))
            why = f"unresolved {op.group(1)}" if op else first_line(one)
            return (f"TVM's C codegen cannot compile kernel {gv.name_hint} ({why}): it has no static-C "
                    "lowering; cut the model before this op and run the rest on the host")
    return f"TVM's C codegen failed: {first_line(e)}"


_WS_CALL = re.compile(r"TVMBackendAllocWorkspace\(\d+, \w+, \(uint64_t\)(\d+)ULL, \d+, \d+\)")


def _workspace(src: str, prefix: str) -> dict[str, int]:
    """Per kernel, the sum of its workspace requests (64-byte rounded)."""
    out = {}
    chunks = re.split(r"\nTVM_DLL int32_t __tvm_ffi_(\w+)\(void\* self_handle, void\* args, "
                      r"int32_t num_args, void\* result\) \{", src)
    for name, body in zip(chunks[1::2], chunks[2::2]):
        sizes = [int(n) for n in _WS_CALL.findall(body)]
        if len(sizes) != body.count("TVMBackendAllocWorkspace("):
            raise UnsupportedOpError(f"kernel {name}: workspace request of non-constant size")
        out[name[len(prefix):]] = sum((n + 63) // 64 * 64 for n in sizes)
    return out


def kernel_source(mod: tvm.IRModule, prefix: str) -> KernelSource:
    """C source of every PrimFunc of ``mod``, post-processed as the module
    docstring says. Kernel ``f`` becomes ``__tvm_ffi_<prefix>f``."""
    prims = {gv: f.with_attr("global_symbol", prefix + gv.name_hint)
             for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    src = _tir_to_c(tvm.IRModule(prims))
    # TVM's own include lines -> our shim (no TVM header needed).
    src = re.sub(r'#define TVM_EXPORTS\n|#include "tvm/[^"]+"\n|#include <(math|stdbool)\.h>\n', "", src)
    ctx = "void* __tvm_ffi__library_ctx = NULL;\n"
    src = src.replace(ctx, "" if src.count("__tvm_ffi__library_ctx") == 1 else f"static {ctx}")
    src = re.sub(r"\n// CodegenC: NOTE: Auto-generated entry function\n.*?\n}\n", "\n", src, flags=re.S)
    # TVM's prototypes of the extern functions the shim declares: math.h's
    # (libm), the shim's float-bits helpers, c7x_kernels.h's (const-correct).
    declared = "|".join(sorted(tir_c.LIBM_NAMES | {tir_c.F32_BITS, tir_c.F64_BITS, *kernel_names()}))
    src = re.sub(r'#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL \w+ (' + declared + r")\([^)]*\);\n", "", src)
    for k in kernel_names():
        # Return -1 when the kernel reports an error.
        src = re.sub(r"^(\s+)(" + k + r"\(.*\));$", r"\1if (\2 != 0) {\n\1  return -1;\n\1}", src, flags=re.M)
        unchecked = [ln for ln in src.splitlines() if re.search(rf"\b{k}\(", ln) and "if (" + k not in ln]
        if unchecked:
            raise UnsupportedOpError(f"TVM's C calls {k} in a form whose status cannot be checked: {unchecked[0].strip()}")
    workspace = _workspace(src, prefix)
    missing = {f"{prefix}{gv.name_hint}" for gv in prims} - {prefix + k for k in workspace}
    if missing:
        raise UnsupportedOpError(f"kernel entry not found in TVM's C output: {sorted(missing)[0]}")
    preamble = (f"/* tvm_kernels.c: TVM's C codegen of the kernels of model {prefix[:-1]}; generated, do not edit. */\n"
                f"#define TVMBackendAllocWorkspace {prefix}TVMBackendAllocWorkspace\n"
                f"#define TVMBackendFreeWorkspace {prefix}TVMBackendFreeWorkspace\n"
                '#include "c7x_tvm_shim.h"\n#include "c7x_kernels.h"\n')
    return KernelSource(preamble + src, workspace)


# ---------------------------------------------------------------------------
# model.h / model.c
# ---------------------------------------------------------------------------

def hex_literal(value: float, bits: int = 32) -> str:
    """Exact C99 hexadecimal floating constant of a float32 (``f`` suffix) or
    float64 value, e.g. 0.5 -> ``0x1p-1f``."""
    v = float(np.float32(value)) if bits == 32 else float(value)
    text = v.hex()  # [-]0x1.<13 hex digits>p<exp>
    if "." in text:
        mant, exp = text.split("p")
        text = mant.rstrip("0").rstrip(".") + "p" + exp
    return text + ("f" if bits == 32 else "")


def _dl_dtype(dtype: str) -> str:
    kind = re.match(r"[a-z]+", dtype).group(0)
    if kind not in _DL_CODE:
        raise UnsupportedOpError(f"tensor of dtype {dtype} in the lowered main")
    return f"{{{_DL_CODE[kind]}, {int(dtype[len(kind):])}, 1}}"


def _shape_init(shape) -> str:
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
    numbers]}`` (the model's preprocessing, ``PreprocessSpec`` fields); returns
    it normalized (ints, float tuples). Raises ValueError naming the bad key."""
    if set(pre) != set(PREPROCESS_KEYS):
        raise ValueError(f"preprocess needs exactly the keys {list(PREPROCESS_KEYS)}, got {sorted(pre)}")
    out = {}
    for key in ("resize", "crop"):
        if isinstance(pre[key], bool) or not isinstance(pre[key], (int, np.integer)) or pre[key] <= 0:
            raise ValueError(f"preprocess[{key!r}] must be a positive int, got {pre[key]!r}")
        out[key] = int(pre[key])
    for key in ("mean", "std"):
        v = list(pre[key])
        if len(v) != 3 or not all(isinstance(x, (int, float, np.floating, np.integer)) for x in v):
            raise ValueError(f"preprocess[{key!r}] must be 3 numbers (R, G, B), got {pre[key]!r}")
        out[key] = tuple(float(x) for x in v)
    return out


def _preprocess_lines(M: str, pre: dict | None) -> list[str]:
    if pre is None:
        return []
    pre = check_preprocess(pre)
    return ["/* input preprocessing (as calibrated): RGB in [0,1], shorter side resized with bilinear "
            "antialiasing (torchvision), center crop, normalize, NCHW float32 */",
            "/* normalize: (x - MEAN[c]) / STD[c] per channel c = R, G, B */",
            f"#define {M}_PREPROCESS_RESIZE {pre['resize']} /* shorter side, pixels */",
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
    for role, t in (("INPUT", plan.input), ("OUTPUT", plan.output)):
        n = int(np.prod(t.shape))
        lines += [f"/* {role.lower()}: float32, NCHW for images */",
                  f"#define {M}_{role}_NDIM {len(t.shape)}",
                  f"#define {M}_{role}_SHAPE {_shape_init(t.shape)}",
                  f"#define {M}_{role}_SIZE {n} /* float32 elements */"]
        q = quant.get(role.lower())
        if q is not None:
            lines += [f"/* quantized as {q.dtype}: q = clamp(round(x * (1 / scale)) + zero_point), as torch */",
                      f"#define {M}_{role}_QDTYPE \"{q.dtype}\"",
                      f"#define {M}_{role}_SCALE {hex_literal(q.scale)} /* {np.float32(q.scale)} */",
                      f"#define {M}_{role}_ZERO_POINT {q.zero_point}"]
        lines.append("")
    lines += ["/* memory, bytes */",
              f"#define {M}_ARENA_BYTES {sizes['arena']}u /* static activation arena */",
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


_ALIGN_MACRO = """/* 64-byte alignment (MMALIB / DMA). GCC and TI's cl7x take the GCC attribute. */
#if defined(__GNUC__) || defined(__TI_COMPILER_VERSION__)
#define C7X_ALIGNED(n) __attribute__((aligned(n)))
#else
#define C7X_ALIGNED(n)
#endif
"""


def _runtime_support(m: str, M: str) -> str:
    """Workspace allocator and weights checks (C text)."""
    return f"""
/* ---- static LIFO workspace: TVMBackendAllocWorkspace without malloc ---- */
#ifndef {M}_WORKSPACE_LIMIT /* tests may shrink it to provoke {M}_ERR_WORKSPACE */
#define {M}_WORKSPACE_LIMIT {M}_WORKSPACE_BYTES
#endif
static uint8_t {m}_workspace[{M}_WORKSPACE_LIMIT] C7X_ALIGNED(64);
static size_t {m}_ws_top;
static int {m}_ws_overflow;

void* {m}_TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint) {{
  uint64_t need = (nbytes + 63u) & ~(uint64_t)63u;
  void* p;
  (void)device_type; (void)device_id; (void)dtype_code_hint; (void)dtype_bits_hint;
  if (nbytes > (uint64_t){M}_WORKSPACE_LIMIT || need > (uint64_t)({M}_WORKSPACE_LIMIT - {m}_ws_top)) {{
    {m}_ws_overflow = 1;
    return NULL;
  }}
  p = {m}_workspace + {m}_ws_top;
  {m}_ws_top += (size_t)need;
  return p;
}}

int {m}_TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {{
  size_t off;
  (void)device_type; (void)device_id;
  if (ptr == NULL) return -1;
  off = (size_t)((uint8_t*)ptr - {m}_workspace);
  if (off >= {m}_ws_top) return -1; /* not ours, or freed out of LIFO order */
  {m}_ws_top = off;
  return 0;
}}

/* ---- weights blob checks (format: pipeline/backend/weights_bin.py) ---- */
static uint32_t {m}_rd32(const uint8_t* p) {{
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}}

static int {m}_header_ok(const uint8_t* w) {{
  static const uint8_t magic[8] = {{'C', '7', 'X', 'W', 'G', 'T', 0, 1}};
  return memcmp(w, magic, 8) == 0 && {m}_rd32(w + 8) == {weights_bin.VERSION}u &&
         {m}_rd32(w + 12) == {M}_WEIGHTS_COUNT && {m}_rd32(w + 16) == {M}_WEIGHTS_BYTES &&
         {m}_rd32(w + 20) == 0u && {m}_rd32(w + 24) == {M}_WEIGHTS_CRC32;
}}

/* CRC-32 (zlib: reflected 0xEDB88320, init and final xor 0xFFFFFFFF), bitwise. */
static uint32_t {m}_crc32(const uint8_t* p, size_t n) {{
  uint32_t c = 0xFFFFFFFFu;
  size_t i;
  int k;
  for (i = 0; i < n; ++i) {{
    c ^= p[i];
    for (k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }}
  return c ^ 0xFFFFFFFFu;
}}

int {m}_check_weights(const uint8_t* weights, size_t nbytes) {{
  if (weights == NULL) return {M}_ERR_NULL;
  if (nbytes != (size_t){M}_WEIGHTS_BYTES || !{m}_header_ok(weights)) return {M}_ERR_WEIGHTS;
  if ({m}_crc32(weights + {weights_bin.HEADER_SIZE}, nbytes - {weights_bin.HEADER_SIZE}) != {M}_WEIGHTS_CRC32) return {M}_ERR_WEIGHTS;
  return {M}_OK;
}}
"""


def _call_support(m: str, M: str, max_args: int) -> str:
    """Kernel call helper and failure code (C text; only when main calls kernels)."""
    return f"""
/* ---- kernel calls: TVM packed-function convention, DLTensor pointers ---- */
static int32_t {m}_call(C7xTvmPackedFunc f, DLTensor* const* t, int32_t n) {{
  TVMFFIAny args[{max_args}];
  TVMFFIAny ret;
  int32_t i;
  for (i = 0; i < n; ++i) {{
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].zero_padding = 0;
    args[i].v_ptr = t[i];
  }}
  ret.type_index = 0;
  ret.zero_padding = 0;
  ret.v_ptr = NULL;
  return f(NULL, args, n, &ret);
}}

static int {m}_fail(int k) {{
  return {m}_ws_overflow ? {M}_ERR_WORKSPACE : {M}_ERR_KERNEL_BASE - k;
}}
"""


def model_source(m: str, plan: Plan, entries: list, prefix: str) -> str:
    """Text of model.c for ``plan`` (kernels named ``__tvm_ffi_<prefix><name>``;
    ``entries``: the weights.bin table, :func:`weights_bin.pack`)."""
    M = m.upper()
    max_args = max([len(a) for _, a in plan.calls] + [1])
    kernels = sorted({name for name, _ in plan.calls})
    out = [f"/* model.c: static C entry of model {m}; generated by doit-c7x, do not edit. */",
           "#include <stddef.h>", "#include <stdint.h>", "#include <string.h>", "",
           '#include "model.h"', "",
           f"#define TVMBackendAllocWorkspace {m}_TVMBackendAllocWorkspace",
           f"#define TVMBackendFreeWorkspace {m}_TVMBackendFreeWorkspace",
           '#include "c7x_tvm_shim.h"', "", _ALIGN_MACRO,
           "/* kernels (tvm_kernels.c) */"]
    out += [f"int32_t __tvm_ffi_{prefix}{k}(void* self, void* args, int32_t num_args, void* result);"
            for k in kernels]
    used = {id(t) for _, args in plan.calls for t in args} | {id(plan.input), id(plan.output)}
    tensors = [t for t in plan.tensors if id(t) in used]
    if any(t.home == "arena" for t in tensors):  # else an unused static (-Wunused-variable)
        out += ["", "/* activations: one arena, offsets from TVM's StaticPlanBlockMemory */",
                f"static uint8_t {m}_arena[{M}_ARENA_BYTES] C7X_ALIGNED(64);"]
    out.append(_runtime_support(m, M))
    if plan.calls:
        out.append(_call_support(m, M, max_args))
    out.append("/* ---- tensors ---- */")
    for t in tensors:
        out.append(f"static int64_t {m}_{t.name}_shape[{max(len(t.shape), 1)}] = {_shape_init(t.shape)};")
        out.append(f"static DLTensor {m}_{t.name} = {{NULL, {{kDLCPU, 0}}, {len(t.shape)}, "
                   f"{_dl_dtype(t.dtype)}, {m}_{t.name}_shape, NULL, 0}};")
    offsets = {"input": lambda t: "(void*)input", "output": lambda t: "(void*)output",
               "arena": lambda t: f"(void*)({m}_arena + {t.offset})",
               "weight": lambda t: f"(void*)(weights + {entries[t.offset].offset})"}
    out += ["", f"int {m}_run(const uint8_t* weights, const float* input, float* output) {{",
            f"  if (weights == NULL || input == NULL || output == NULL) return {M}_ERR_NULL;",
            f"  if (((uintptr_t)weights & 63u) != 0) return {M}_ERR_ALIGN;",
            f"  if (!{m}_header_ok(weights)) return {M}_ERR_WEIGHTS;",
            f"  {m}_ws_top = 0;", f"  {m}_ws_overflow = 0;"]
    out += [f"  {m}_{t.name}.data = {offsets[t.home](t)};" for t in tensors]
    for k, (name, args) in enumerate(plan.calls):
        refs = ", ".join(f"&{m}_{t.name}" for t in args)
        out += [f"  {{ /* {k}: {name} */",
                f"    DLTensor* const a[{len(args)}] = {{{refs}}};",
                f"    if ({m}_call(__tvm_ffi_{prefix}{name}, a, {len(args)}) != 0) return {m}_fail({k});",
                "  }"]
    if not plan.output_aliased:
        n = int(np.prod(plan.output.shape))
        out.append(f"  memcpy(output, {m}_{plan.output.name}.data, sizeof(float) * {n}u);")
    out += [f"  return {M}_OK;", "}", ""]
    return "\n".join(out)


def weights_array_source(m: str, blob: bytes) -> str:
    """Text of weights_data.c: ``const uint8_t <m>_weights[]``, 64-byte aligned."""
    M = m.upper()
    rows = [", ".join(f"0x{b:02x}" for b in blob[i:i + 16]) for i in range(0, len(blob), 16)]
    return "\n".join([f"/* weights_data.c: weights.bin of model {m} as a C array; generated, do not edit. */",
                      "#include <stdint.h>", '#include "model.h"', "", _ALIGN_MACRO,
                      f"const uint8_t {m}_weights[{M}_WEIGHTS_BYTES] C7X_ALIGNED(64) = {{",
                      ",\n".join(rows), "};", ""])


# ---------------------------------------------------------------------------
# lowered.py (for the interpreter)
# ---------------------------------------------------------------------------

@relax.expr_functor.mutator
class _ConstToParam(relax.expr_functor.PyExprMutator):
    def __init__(self, mod, plan: Plan):
        super().__init__(mod)
        self.params = [relax.Var(f"w{i}", relax.TensorType(list(w.shape), str(w.dtype)))
                       for i, w in enumerate(plan.weights)]
        self.keys = plan.weight_keys

    def visit_call_(self, op):
        call = super().visit_call_(op)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.builtin.alloc_tensor":
            # Printed with ty_args=..., which tvm 0.27's parser rejects; the
            # op's own constructor gives the form that round-trips.
            return relax.op.builtin.alloc_tensor(*call.args)
        return call

    def visit_generic_const_(self, op):
        if not isinstance(op.ty, relax.TensorType):  # R.dtype / R.str / shapes stay inline
            return op
        return self.params[self.keys[const_key(op)[1]]]


def lowered_script(mod: tvm.IRModule, plan: Plan) -> str:
    """TVMScript of the lowered module, every constant of ``main`` replaced by
    the parameter ``w<i>`` (weights.bin entry ``i``): ``main(x, w0, w1, ...)``.
    Tensor constants cannot be printed inline (tvm 0.27 crashes on
    ``show_meta=True``), and the blob already holds them."""
    lifter = _ConstToParam(mod, plan)
    main = mod["main"]
    body = lifter.visit_expr(main.body)
    func = relax.Function([main.params[0], *lifter.params], body, main.ret_ty, main.is_pure, main.attrs)
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"})
    out["main"] = func
    return out.script(show_meta=False) + "\n"


# ---------------------------------------------------------------------------
# everything
# ---------------------------------------------------------------------------

def call_counts(mod: tvm.IRModule, plan: Plan) -> tuple[dict[str, int], list[str]]:
    """Kernel calls of the lowered ``main`` by backend: ``({"mmalib": n, "c7x":
    n, "tvm": n}, sorted names of the distinct scalar PrimFuncs called)``.
    An offload PrimFunc counts for its ``c7x_offload_backend``, any other for "tvm"."""
    counts = {"mmalib": 0, "c7x": 0, "tvm": 0}
    scalar = set()
    for name, _ in plan.calls:
        func = mod[name]
        backend = str(func.attrs["c7x_offload_backend"]) if is_offload(func) else "tvm"
        counts[backend] = counts.get(backend, 0) + 1
        if backend == "tvm":
            scalar.add(name)
    return counts, sorted(scalar)


HEADERS = (KERNELS_HEADER, SHIM_HEADER)
"""Headers copied into every codegen folder, so ``gcc -I<folder>`` suffices."""


def emit(mod: tvm.IRModule, model_name: str, out_dir: Path, *, quant: dict | None = None,
         weights_format: str = "bin", preprocess: dict | None = None) -> dict:
    """Write model.h, model.c, tvm_kernels.c, weights.bin (+ weights_data.c
    for ``weights_format="c_array"``), lowered.py and copies of
    c7x_kernels.h / c7x_tvm_shim.h into ``out_dir``.

    ``mod``: output of :func:`pipeline.backend.lower.lower_module` (``.mod``).
    ``quant``: ``{"input": Quant | None, "output": Quant | None}`` for model.h.
    ``preprocess``: ``{"resize", "crop", "mean", "std"}`` for model.h's
    PREPROCESS macros (:func:`check_preprocess`), or None.
    Returns ``{"c_name", "arena_bytes", "workspace_bytes", "weights_bytes",
    "weights_count", "weights_crc32", "kernels", "calls", "calls_by_backend",
    "tvm_kernels", "workspace_by_kernel"}``. Raises UnsupportedOpError (see
    :func:`plan_main`), ValueError for an unknown ``weights_format`` or a bad
    ``preprocess``.
    """
    from ..fsutil import write_bytes, write_text

    if weights_format not in ("bin", "c_array"):
        raise ValueError(f"weights_format must be 'bin' or 'c_array', not {weights_format!r}")
    if preprocess is not None:
        check_preprocess(preprocess)
    m = c_name(model_name)
    prefix = m + "_"
    plan = plan_main(mod)
    blob, entries, crc = weights_bin.pack(plan.weights)
    ks = kernel_source(mod, prefix)
    called = {name for name, _ in plan.calls}
    workspace = max([ks.workspace.get(k, 0) for k in called] + [64])
    sizes = {"arena": plan.arena_bytes, "workspace": workspace, "weights": len(blob)}
    out_dir = Path(out_dir)
    write_text(out_dir / "model.h", header(m, plan, sizes, crc, quant or {}, weights_format == "c_array",
                                           preprocess))
    write_text(out_dir / "model.c", model_source(m, plan, entries, prefix))
    write_text(out_dir / "tvm_kernels.c", ks.source)
    for h in HEADERS:
        write_text(out_dir / h.name, h.read_text())
    write_bytes(out_dir / "weights.bin", blob)
    if weights_format == "c_array":
        write_text(out_dir / "weights_data.c", weights_array_source(m, blob))
    write_text(out_dir / "lowered.py", lowered_script(mod, plan))
    by_backend, tvm_kernels = call_counts(mod, plan)
    return {"c_name": m, "arena_bytes": plan.arena_bytes, "workspace_bytes": workspace,
            "weights_bytes": len(blob), "weights_count": len(entries), "weights_crc32": crc,
            "kernels": len(called), "calls": len(plan.calls), "calls_by_backend": by_backend,
            "tvm_kernels": tvm_kernels,
            "workspace_by_kernel": {k: ks.workspace.get(k, 0) for k in sorted(called)}}

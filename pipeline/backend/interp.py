"""Python reference executor of a compiled model, bit-exact with its C.

``lowered.py`` is the lowered module as TVMScript with every constant of
``main`` lifted to a parameter ``w<i>`` = weights.bin entry ``i``: written by
:func:`lowered_script` (called by :func:`.emit_c.emit`), read by
:class:`Program`. :class:`Program` runs ``lowered.py`` + ``weights.bin``
with the semantics of ``<model>_run``, but independently of the C:

- no memory plan: every ``alloc_tensor`` is a fresh zeroed array (reshape
  stays a view), so agreement with the C, which reuses arena slots,
  proves TVM's static plan (no live tensor overwritten);
- offload PrimFuncs (attribute ``c7x_kernel``) run the numpy twin
  ``kernels.catalog.KERNELS[name]`` on the arguments of the body's
  ``T.call_extern``: buffer data pointers -> the parameters' arrays, int
  immediates -> ints, float32 immediates -> floats (contract in
  :mod:`pipeline.backend`);
- every other PrimFunc runs TVM's own LLVM build of the same TIR that
  ``tvm_kernels.c`` was printed from. LLVM is checked not to contract
  a*b+c into an FMA (gcc is run with ``-ffp-contract=off``), see
  :func:`llvm_target`.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import relax, tirx

from . import tir_c, weights_bin
from .lower import is_offload
from .memory_plan import Plan, const_key
from ..tvm_print import script_text
from ..tvmscript_guard import check_tvmscript


# ---------------------------------------------------------------------------
# LLVM without FMA contraction
# ---------------------------------------------------------------------------

def _fma_probe_module() -> tvm.IRModule:
    a = tirx.decl_buffer((1,), "float32", "a")
    d = tirx.decl_buffer((1,), "float32", "d")
    idx = [tirx.IntImm("int32", 0)]
    body = tirx.BufferStore(d, a[0] * a[0] + tirx.FloatImm("float32", -(1.0 + 2.0 ** -11)), idx)
    return tvm.IRModule({"probe": tirx.PrimFunc([a, d], body).with_attr("global_symbol", "probe")})


def _contracts(target) -> bool:
    """True if ``target`` fuses a*a + c: with a = 1 + 2^-12 the exact product
    1 + 2^-11 + 2^-24 loses its last bit in float32, so the fused result is
    2^-24 and the unfused one 0."""
    rt = tvm.tirx.build(_fma_probe_module(), target=target)
    a = tvm.runtime.tensor(np.array([1.0 + 2.0 ** -12], np.float32))
    d = tvm.runtime.tensor(np.zeros(1, np.float32))
    rt["probe"](a, d)
    return float(d.numpy()[0]) != 0.0


# LLVM's optimisation level for the reference build: the least compile + run time
# over verify's images (docs/measuring.md, "Figures behind the code"). Results
# do not depend on it (IEEE, no contraction, no reassociation; tested).
LLVM_OPT_LEVEL = 2


@functools.lru_cache(maxsize=1)
def llvm_target() -> tvm.target.Target:
    """An LLVM CPU target that does not contract float multiply-adds.

    TVM's LLVM codegen allows contraction: measured here, ``mcpu=skylake-avx512``
    emits ``vfmadd`` for a*b+c; the generic default does not (no FMA unit).
    Tries this machine's CPU without the ``fma`` feature first (its vector
    units run the scalar build faster: docs/measuring.md; IEEE
    results do not depend on the vector width, nothing is reassociated), then
    the generic default, then the default without ``fma``.
    Raises RuntimeError if all contract."""
    from tvm.target import codegen

    for spec in ({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu(), "mattr": ["-fma"],
                  "opt-level": LLVM_OPT_LEVEL},
                 {"kind": "llvm", "opt-level": LLVM_OPT_LEVEL},
                 {"kind": "llvm", "mattr": ["-fma"], "opt-level": LLVM_OPT_LEVEL}):
        target = tvm.target.Target(spec)
        if not _contracts(target):
            return target
    raise RuntimeError("TVM's LLVM target contracts a*b+c into FMA; the reference would not match gcc")


# ---------------------------------------------------------------------------
# lowered.py: the writer (emit_c.emit calls it); Program below reads it
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
    ``show_meta=True``), and the blob already holds them. The printed module is
    remembered for :class:`Program` in this process (:data:`_COMPILED`)."""
    lifter = _ConstToParam(mod, plan)
    main = mod["main"]
    body = lifter.visit_expr(main.body)
    func = relax.Function([main.params[0], *lifter.params], body, main.ret_ty, main.is_pure, main.attrs)
    out = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"})
    out["main"] = func
    text = script_text(out) + "\n"
    _remember(text, out)
    return text


# Parsing lowered.py back (TVMScript, pure Python) and building its scalar
# PrimFuncs with LLVM cost seconds per build (docs/measuring.md), repeated by
# verify, layers and holdout. Keyed by the sha256 of the file's text, so only
# a byte-identical lowered.py reuses an entry (a hand edit is parsed afresh);
# the few most recent stay, a codegen of the same process seeds them.
_COMPILED: "collections.OrderedDict[str, _Compiled]" = collections.OrderedDict()
_COMPILED_MAX = 4


@dataclass
class _Compiled:
    mod: tvm.IRModule
    lib: object = None          # tvm runtime module of the scalar PrimFuncs (None before the build)
    externs: dict | None = None
    params: dict | None = None  # scalar PrimFunc name -> _param_types


def _remember(text: str, mod: tvm.IRModule) -> "_Compiled":
    key = hashlib.sha256(text.encode()).hexdigest()
    entry = _COMPILED.pop(key, None) or _Compiled(mod)
    _COMPILED[key] = entry
    while len(_COMPILED) > _COMPILED_MAX:
        _COMPILED.popitem(last=False)
    return entry


# TVMScript parsing and TVM's build passes share global state; verify builds its
# programs from one thread per build variant, so they take turns here (the runs
# themselves, LLVM code and numpy, go in parallel).
_BUILD_LOCK = threading.Lock()


def _compiled(path: Path) -> "_Compiled":
    """The parsed and built ``lowered.py`` at ``path`` (from :data:`_COMPILED` when
    its text was seen), LLVM code generated. Thread-safe. Raises ValueError (one
    line) when it does not parse."""
    with _BUILD_LOCK:
        return _compiled_locked(path)


def _compiled_locked(path: Path) -> "_Compiled":
    text = path.read_text()
    entry = _COMPILED.get(hashlib.sha256(text.encode()).hexdigest())
    if entry is None:
        check_tvmscript(text, path)  # before TVM's parser evaluates any of it
        try:
            mod = tvm.script.from_source(text)
        except Exception as e:  # TVMScript diagnostics: one message, not a dump
            raise ValueError(f"{path}: cannot parse the lowered module: {e}") from None
        entry = _remember(text, mod)
    if entry.externs is None:
        externs, scalar = {}, {}
        for gv, f in entry.mod.functions.items():
            if is_offload(f):
                externs[gv.name_hint] = _extern_call(f)
            elif isinstance(f, tirx.PrimFunc):
                # libm_calls: already applied by lower (idempotent); kept so a
                # hand-written lowered.py computes intrinsics as the C does.
                scalar[gv] = tir_c.libm_calls(f).with_attr("global_symbol", gv.name_hint)
        entry.lib = _build_scalar(scalar) if scalar else None
        if scalar:  # the first lookup JIT-compiles the whole module: here, under the lock
            entry.lib[next(iter(scalar)).name_hint]
        entry.params = {gv.name_hint: _param_types(f) for gv, f in scalar.items()}
        entry.externs = externs
    return entry


def _build_scalar(funcs: dict) -> "tvm.runtime.Module":
    """TVM's LLVM build of the scalar PrimFuncs, without the packed API's argument
    asserts (``tirx.disable_assert``): they were half of the LLVM IR and of its
    compile time (docs/measuring.md, "Figures behind the code").
    :meth:`Program._call` checks every argument's shape and dtype instead
    (:func:`_param_types`). The C build keeps its asserts."""
    with tvm.transform.PassContext(opt_level=3, config={"tirx.disable_assert": True}):
        return tvm.tirx.build(tvm.IRModule(funcs), target=llvm_target())


def _param_types(func: tirx.PrimFunc) -> list[tuple[tuple[int, ...], str] | None]:
    """(shape, dtype) of each buffer parameter of a scalar PrimFunc, in order
    (None for a parameter that is not a buffer of static shape)."""
    out = []
    for p in func.params:
        t = p.ty
        static = isinstance(t, tirx.BufferType) and all(isinstance(d, (int, tirx.IntImm)) for d in t.shape)
        out.append((tuple(int(d) for d in t.shape), str(t.dtype)) if static else None)
    return out


# ---------------------------------------------------------------------------
# the program
# ---------------------------------------------------------------------------

def _aligned_zeros(shape, dtype) -> np.ndarray:
    """Zeroed array whose data is 64-byte aligned (TVM's from_dlpack needs it)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.zeros(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n].view(dtype).reshape(shape)


def _shape(ty) -> tuple[int, ...]:
    return tuple(int(d) for d in ty.shape.values)


@dataclass
class _Extern:
    """How to call an offload kernel: ``args`` items are ("buf", param index),
    ("int", value) or ("float", float32 value)."""

    kernel: str
    args: list


def _param_index(func: tirx.PrimFunc, arg) -> int | None:
    """Index of the parameter whose data pointer ``arg`` is (``buf.data`` is
    ``tirx.buffer_data(param)`` in tvm 0.27), else None."""
    if isinstance(arg, tvm.ir.Call) and getattr(arg.op, "name", "") == "tirx.buffer_data":
        arg = arg.args[0]
    return next((i for i, p in enumerate(func.params) if p.same_as(arg)), None)


def _extern_call(func: tirx.PrimFunc) -> _Extern:
    """Decode the ``T.call_extern`` body of an offload PrimFunc.
    Raises ValueError if the body breaks the offload PrimFunc contract."""
    tag = str(func.attrs["c7x_kernel"])
    body = func.body
    call = body.value if isinstance(body, tirx.Evaluate) else None
    if not (isinstance(call, tvm.ir.Call) and getattr(call.op, "name", "") == "tirx.call_extern"):
        raise ValueError(f"offload PrimFunc of {tag} is not one T.call_extern")
    kernel = str(call.args[0].value)
    if kernel != tag:
        raise ValueError(f"offload PrimFunc calls {kernel} but is tagged {tag}")
    args = []
    for a in call.args[1:]:
        index = _param_index(func, a)
        if index is not None:
            args.append(("buf", index))
        elif isinstance(a, tirx.IntImm):
            args.append(("int", int(a.value)))
        elif isinstance(a, tirx.FloatImm) and str(a.ty) == "float32":
            args.append(("float", float(a.value)))
        else:
            raise ValueError(f"{kernel}: argument {a} is neither a parameter buffer nor an int / float32")
    return _Extern(kernel, args)


class Program:
    """A compiled model loaded for reference execution (see the module docstring)."""

    def __init__(self, codegen_dir: Path, rounding: str = "half_up"):
        codegen_dir = Path(codegen_dir)
        compiled = _compiled(codegen_dir / "lowered.py")
        self.mod, self.lib, self.externs = compiled.mod, compiled.lib, compiled.externs
        self.params = compiled.params
        self.rounding = rounding
        self.weights = []
        for w in weights_bin.unpack((codegen_dir / "weights.bin").read_bytes()):
            a = _aligned_zeros(w.shape, w.dtype)
            a[...] = w
            self.weights.append(a)
        self._funcs = {}

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        """Shape of each model output, in return order (a tuple of one is one output)."""
        ret = self.mod["main"].ret_ty
        return [_shape(t) for t in (ret.fields if isinstance(ret, relax.TupleType) else [ret])]

    def run(self, image: np.ndarray, observer=None) -> np.ndarray:
        """One image: float32 array of the model input shape. Returns the output:
        the model's output array, or for a model with several outputs all of them
        packed as ``<m>_run`` packs them, float32 [1, total] (each output
        flattened, back to back in return order; :meth:`run_outputs` splits).

        ``observer``: optional ``observer(index, func, output)``, called after
        each kernel call of ``main`` in order (``index`` counts them from 0, as
        the manifest's ``calls``; ``func`` is the PrimFunc's name; ``output`` is
        a read-only view of the array the call wrote, its last argument; copy
        it to keep it). Without an observer nothing changes, and with one the
        computation is the same."""
        main = self.mod["main"]
        x = _aligned_zeros(image.shape, np.float32)
        x[...] = image
        env = {main.params[0]: x}
        env.update(zip(main.params[1:], self.weights))
        calls = 0
        for block in main.body.blocks:
            for b in block.bindings:
                self._bind(env, b.var, b.value)
                if observer is not None and isinstance(b.value, relax.Call) \
                        and isinstance(b.value.op, tvm.ir.GlobalVar):
                    out = env[b.value.args[-1]].view()
                    out.flags.writeable = False
                    observer(calls, b.value.op.name_hint, out)
                    calls += 1
        out = env[main.body.body]
        out = out if isinstance(out, list) else [out]
        if len(out) == 1:
            return np.array(out[0])
        return np.concatenate([np.asarray(a, np.float32).ravel() for a in out])[None]

    def run_outputs(self, image: np.ndarray, observer=None) -> list[np.ndarray]:
        """:meth:`run` with every output apart, each in its own shape (return order)."""
        return split_outputs(self.run(image, observer), self.output_shapes)

    def _bind(self, env, var, value):
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            self._call(value.op.name_hint, [env[a] for a in value.args])
        elif isinstance(value, relax.Call):
            op = value.op.name
            if op == "relax.memory.alloc_storage":
                env[var] = None  # no plan: tensors get their own arrays
            elif op in ("relax.memory.alloc_tensor", "relax.builtin.alloc_tensor"):
                env[var] = _aligned_zeros(_shape(var.ty), str(var.ty.dtype))
            elif op == "relax.reshape":
                env[var] = env[value.args[0]].reshape(_shape(var.ty))
            else:
                raise NotImplementedError(f"op {op} in the lowered main")
        elif isinstance(value, relax.Var):
            env[var] = env[value]
        elif isinstance(value, relax.Tuple):
            env[var] = [env[f] for f in value.fields]
        elif isinstance(value, relax.TupleGetItem):
            env[var] = env[value.tuple_value][value.index]
        else:
            raise NotImplementedError(f"binding {type(value).__name__} in the lowered main")

    def _call(self, name: str, arrays: list[np.ndarray]):
        if name in self.externs:
            ext = self.externs[name]
            args = [arrays[v] if kind == "buf" else v for kind, v in ext.args]
            status = _kernels()[ext.kernel](*args, rounding=self.rounding)
            if status != 0:
                raise RuntimeError(f"kernel {ext.kernel} ({name}) returned {status}")
        else:
            if name not in self._funcs:  # one function lookup per PrimFunc, not per call
                self._funcs[name] = self.lib[name]
            if len(arrays) != len(self.params[name]):
                raise ValueError(f"{name}: called with {len(arrays)} arguments, the PrimFunc takes "
                                 f"{len(self.params[name])}")
            for k, (want, a) in enumerate(zip(self.params[name], arrays)):
                if want is not None and (a.shape, a.dtype) != want:  # the asserts the LLVM build leaves out
                    raise ValueError(f"{name}: argument {k} is {a.dtype}{list(a.shape)}, the PrimFunc "
                                     f"takes {want[1]}{list(want[0])}")
            self._funcs[name](*[tvm.runtime.from_dlpack(a) for a in arrays])

    def run_recording(self, image: np.ndarray) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
        """:meth:`run` that also returns every kernel call's output in call
        order: (PrimFunc name, a copy of the array its last argument holds after
        the call), the tensors the host dump build writes (``host.read_dump``)."""
        calls = []
        out = self.run(image, observer=lambda i, func, a: calls.append((func, a.copy())))
        return out, calls


@functools.lru_cache(maxsize=1)
def _kernels() -> dict:
    from .kernels.catalog import KERNELS  # the numpy twins: only when an offload kernel runs

    return KERNELS


def split_outputs(packed: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The outputs in a packed buffer (``<m>_run``'s layout): ``packed`` holds N
    images, [N, ...] with ``sum(prod(shape))`` elements per image; returns one
    [N, *shape[1:]] array per shape ([N, *shape] for a shape without batch axis 1).
    Raises ValueError when the sizes do not add up."""
    n, sizes = len(packed), [int(np.prod(s)) for s in shapes]
    flat = np.asarray(packed).reshape(n, -1)
    if flat.shape[1] != sum(sizes):
        raise ValueError(f"{flat.shape[1]} elements per image do not hold outputs of shapes {shapes}")
    bounds = np.cumsum([0] + sizes)
    return [flat[:, a:b].reshape(n, *(s[1:] if s and s[0] == 1 else s))
            for a, b, s in zip(bounds[:-1], bounds[1:], shapes)]


def run_reference(codegen_dir: Path, inputs: np.ndarray, rounding: str = "half_up") -> np.ndarray:
    """Reference outputs of the model compiled into ``codegen_dir``.

    ``inputs``: float32 [N, C, H, W], N images of the model's [1, C, H, W]
    input, each run separately like one ``<model>_run`` call. Returns the
    outputs stacked on axis 0: [N, *output_shape[1:]] float32. ``rounding``:
    right-shift rounding of the offload kernels ("half_up" | "floor"), as
    the host build's ``C7X_ROUNDING``. A model with several outputs gives
    them packed per image, [N, total] (:func:`split_outputs`).
    """
    prog = Program(codegen_dir, rounding)
    x = np.asarray(inputs, np.float32)
    return np.concatenate([prog.run(x[i:i + 1]) for i in range(len(x))], axis=0)

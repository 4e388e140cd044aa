"""tvm_kernels.c: TVM's C codegen of every PrimFunc of the lowered module.

Scalar PrimFuncs and offload PrimFuncs alike (the body of an offload PrimFunc
calls its extern kernel), with TVM's includes replaced by ``c7x_tvm_shim.h``
+ ``c7x_kernels.h``. Post-processing, each fixing a measured problem of the
raw output:

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

:func:`kernel_source` also reads back how much static workspace each kernel
asks ``TVMBackendAllocWorkspace`` for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import tirx

from ..errors import UnsupportedOpError
from . import tir_c
from .lower import first_line

KERNELS_HEADER = Path(__file__).parent / "kernels" / "c7x_kernels.h"
DATA_FILES = ("kernels/c7x_kernels.h",)  # read at run time (code_deps.py)
#: the DMA functions of c7x_memory.h the tiled kernels call (:mod:`.tiling`)
DMA_NAMES = ("c7x_dma_copy", "c7x_dma_wait")


def kernel_names() -> list[str]:
    """Extern kernel names declared in ``c7x_kernels.h`` (in file order)."""
    return re.findall(r"^int32_t\s+(\w+)\s*\(", KERNELS_HEADER.read_text(), flags=re.M)


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


def _strip_tvm_runtime(src: str) -> str:
    """TVM's include lines (the shim replaces them: no TVM header needed), its
    library context (static, or gone when unused) and its entry function."""
    src = re.sub(r'#define TVM_EXPORTS\n|#include "tvm/[^"]+"\n|#include <(math|stdbool)\.h>\n', "", src)
    ctx = "void* __tvm_ffi__library_ctx = NULL;\n"
    src = src.replace(ctx, "" if src.count("__tvm_ffi__library_ctx") == 1 else f"static {ctx}")
    return re.sub(r"\n// CodegenC: NOTE: Auto-generated entry function\n.*?\n}\n", "\n", src, flags=re.S)


def _drop_extern_prototypes(src: str) -> str:
    """TVM's prototypes of the extern functions the shim declares: math.h's
    (libm), the shim's float-bits helpers, c7x_kernels.h's (const-correct)."""
    declared = "|".join(sorted(tir_c.LIBM_NAMES | {tir_c.F32_BITS, tir_c.F64_BITS, *kernel_names(), *DMA_NAMES}))
    return re.sub(r'#ifdef __cplusplus\nextern "C"\n#endif\nTVM_DLL \w+ (' + declared + r")\([^)]*\);\n", "", src)


def _check_kernel_status(src: str) -> str:
    """Every extern kernel call made to return -1 when the kernel reports an
    error; raises UnsupportedOpError for a call that cannot be wrapped so."""
    for k in kernel_names():
        src = re.sub(r"^(\s+)(" + k + r"\(.*\));$", r"\1if (\2 != 0) {\n\1  return -1;\n\1}", src, flags=re.M)
        unchecked = [ln for ln in src.splitlines() if re.search(rf"\b{k}\(", ln) and "if (" + k not in ln]
        if unchecked:
            raise UnsupportedOpError(f"TVM's C calls {k} in a form whose status cannot be checked: {unchecked[0].strip()}")
    return src


def _preamble(prefix: str) -> str:
    """Head of tvm_kernels.c: the per-model workspace functions and our headers."""
    return (f"/* tvm_kernels.c: TVM's C codegen of the kernels of model {prefix[:-1]}; generated, do not edit. */\n"
            f"#define TVMBackendAllocWorkspace {prefix}TVMBackendAllocWorkspace\n"
            f"#define TVMBackendFreeWorkspace {prefix}TVMBackendFreeWorkspace\n"
            '#include "c7x_tvm_shim.h"\n#include "c7x_kernels.h"\n#include "c7x_memory.h"\n')


def kernel_source(mod: tvm.IRModule, prefix: str) -> KernelSource:
    """C source of every PrimFunc of ``mod``, post-processed as the module
    docstring says. Kernel ``f`` becomes ``__tvm_ffi_<prefix>f``."""
    prims = {gv: f.with_attr("global_symbol", prefix + gv.name_hint)
             for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}
    src = _tir_to_c(tvm.IRModule(prims))
    src = _check_kernel_status(_drop_extern_prototypes(_strip_tvm_runtime(src)))
    workspace = _workspace(src, prefix)
    missing = {f"{prefix}{gv.name_hint}" for gv in prims} - {prefix + k for k in workspace}
    if missing:
        raise UnsupportedOpError(f"kernel entry not found in TVM's C output: {sorted(missing)[0]}")
    return KernelSource(_preamble(prefix) + src, workspace)

"""Save a Relax IRModule as TVMScript text that loads back, with its tensors apart.

``tvm.ir.save_json`` and ``script(show_meta=True)`` crash on tensor constants
in tvm 0.27 (segfault in ``ToJSONGraph``). So every tensor constant of
``main`` is lifted into a named parameter (``c0``, ``c1``, ...), the module is
written as plain TVMScript (scalars stay inline, printed exactly), and the
tensors go to one ``tvm.runtime.save_param_dict`` file.
:func:`load_irmodule` re-binds them as constants, giving back the same module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from ..errors import StaleArtifactError
from ..fsutil import write_bytes, write_text
from ..tvm_print import script_text
from ..tvmscript_guard import check_tvmscript


@mutator
class _ConstantLifter(PyExprMutator):
    """Replace every non-scalar relax.Constant by a fresh Var (in visit order)."""

    def __init__(self, mod):
        super().__init__(mod)
        self.lifted: list[tuple[relax.Var, np.ndarray]] = []

    def visit_generic_const_(self, op):
        value = op.value.numpy()
        if value.ndim == 0 and (value.dtype.kind not in "fc" or np.isfinite(value)):
            return op  # finite scalars stay inline, printed exactly
        # Tensors, and non-finite scalars: TVMScript prints R.const("-inf", ...) (torch's
        # safe softmax compares with -inf, ViT) and cannot parse it back.
        var = relax.Var(f"c{len(self.lifted)}", op.ty)
        self.lifted.append((var, value))
        return var


def lift_constants(mod: tvm.IRModule, params: dict[str, np.ndarray]) -> tuple[tvm.IRModule, dict]:
    """Move tensor constants of ``main`` into parameters. Returns the new module
    (``main(input, *params, *lifted)``) and the merged parameter dict."""
    lifter = _ConstantLifter(mod)
    main = mod["main"]
    body = lifter.visit_expr(main.body)
    new_params = list(main.params) + [v for v, _ in lifter.lifted]
    func = relax.Function(new_params, body, main.ret_ty, main.is_pure, main.attrs)
    out = dict(params)
    for var, value in lifter.lifted:
        out[var.name] = value
    new_mod = tvm.IRModule({**{gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}})
    new_mod["main"] = func
    return new_mod, out


def save_irmodule(mod: tvm.IRModule, params: dict[str, np.ndarray], script_path: Path,
                  params_path: Path) -> None:
    """Write ``mod`` (TVMScript) and its parameters+constants (param dict) atomically."""
    lifted, all_params = lift_constants(mod, params)
    names = [p.name for p in lifted["main"].params[1:]]
    write_text(script_path, script_text(lifted) + "\n")
    blob = tvm.runtime.save_param_dict({n: tvm.runtime.tensor(np.ascontiguousarray(all_params[n]))
                                        for n in names})
    write_bytes(params_path, bytes(blob))


def load_irmodule(script_path: Path, params_path: Path, bind: bool = True):
    """Read back a module written by :func:`save_irmodule`.

    With ``bind=True`` (default) every parameter is bound as a constant and
    ``main`` takes only the model input; returns the module. With
    ``bind=False`` returns ``(module, params)`` untouched. Raises ValueError (one
    line naming the file) when the script does not parse.
    """
    text = Path(script_path).read_text()
    check_tvmscript(text, script_path)  # before TVM's parser evaluates any of it
    try:
        mod = tvm.script.from_source(text)
    except Exception as e:  # TVMScript diagnostics: one message, not a dump
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise StaleArtifactError(f"{script_path}: cannot parse the imported module ({first.strip()[:200]}); "
                                 f"re-run its relax_import task") from None
    params = {k: v.numpy() for k, v in
              tvm.runtime.load_param_dict(bytearray(Path(params_path).read_bytes())).items()}
    if not bind:
        return mod, params
    return relax.transform.BindParams("main", params)(mod)

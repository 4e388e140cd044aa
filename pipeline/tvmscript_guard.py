"""A syntax check of TVMScript before TVM's parser evaluates it.

TVM's TVMScript parser evaluates Python expressions of the text it reads, so a
planted ``relax/module.py`` or ``lowered.py`` could run code. TVM 0.27 offers
no format that executes nothing for our modules (``tvm.ir.save_json``
segfaults on any relax constant, even after lifting the tensors out), and the
run-cache restores only entries signed with the user's secret
(``docs/trust.md``). This check is the second line: before parsing, the text
must have the one shape our writers produce, a single ``@I.ir_module`` class
of decorated functions, and no name or attribute that reaches Python's
internals (dunders, ``eval``, ``open``...). Stdlib only.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .errors import StaleArtifactError

#: Builtins that can run code, touch files or reach objects' internals; never in our modules.
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "open", "__import__", "getattr", "setattr",
                             "delattr", "globals", "locals", "vars", "breakpoint"})


def check_tvmscript(text: str, path: str | Path) -> None:
    """Raise StaleArtifactError (one line naming ``path``) unless ``text`` is TVMScript of
    the shape doit-c7x writes: one class decorated ``@I.ir_module`` holding only
    functions decorated ``@R.function`` / ``@T.prim_func``; no import, lambda or
    global statement; no dunder name or attribute; none of :data:`FORBIDDEN_NAMES`."""
    def refuse(what: str, node: ast.AST | None = None):
        line = f" (line {node.lineno})" if node is not None and hasattr(node, "lineno") else ""
        raise StaleArtifactError(f"{path}: not a TVMScript module doit-c7x wrote: {what}{line}; "
                                 f"delete it and run doit to rebuild it")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        refuse(f"a syntax error ({e.msg})", e)
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.ClassDef):
        refuse("the file must hold one class and nothing else")
    cls = tree.body[0]
    if [ast.unparse(d) for d in cls.decorator_list] != ["I.ir_module"]:
        refuse("the class is not decorated @I.ir_module", cls)
    for item in cls.body:
        if not isinstance(item, ast.FunctionDef) or not item.decorator_list or not all(
                ast.unparse(d).split("(")[0] in ("R.function", "T.prim_func") for d in item.decorator_list):
            refuse("the class holds something else than @R.function / @T.prim_func functions", item)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Lambda, ast.Global, ast.Nonlocal, ast.ClassDef)) \
                and node is not cls:
            refuse(f"a {type(node).__name__} statement", node)
        if isinstance(node, ast.Name) and (node.id.startswith("__") or node.id in FORBIDDEN_NAMES):
            refuse(f"the name {node.id!r}", node)
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            refuse(f"the attribute {node.attr!r}", node)

"""TVMScript is checked before TVM's parser evaluates it (pipeline/tvmscript_guard.py)."""

from __future__ import annotations

import pytest

from pipeline.errors import StaleArtifactError

from pipeline.tvmscript_guard import check_tvmscript

GOOD = '''# from tvm.script import ir as I
@I.ir_module
class Module:
    @T.prim_func(private=True)
    def k(data: T.Buffer((1, 8), "int8")):
        T.call_extern("int32", "c7x_int8_add", data.data, 8)

    @R.function
    def main(input: R.Tensor((1, 8), dtype="float32")) -> R.Tensor((1, 8), dtype="float32"):
        return input
'''


def test_the_shape_our_writers_produce_passes():
    check_tvmscript(GOOD, "module.py")


@pytest.mark.parametrize("planted, needle", [
    ("import os\n" + GOOD, "one class and nothing else"),
    (GOOD + "\nopen('/tmp/x', 'w')\n", "one class and nothing else"),
    (GOOD.replace("return input", "return R.__class__"), "the attribute '__class__'"),
    (GOOD.replace("return input", "return eval('1')"), "the name 'eval'"),
    (GOOD.replace("return input", "import os"), "a Import statement"),
    (GOOD.replace("@I.ir_module", "@evil"), "not decorated @I.ir_module"),
    (GOOD.replace("    @R.function\n", "    x = __import__('os')\n    @R.function\n"), "holds something else"),
    ("def (:", "a syntax error"),
])
def test_planted_python_is_refused_in_one_line(planted, needle):
    with pytest.raises(StaleArtifactError) as e:
        check_tvmscript(planted, "relax/module.py")
    assert needle in str(e.value) and "relax/module.py" in str(e.value) and "\n" not in str(e.value)


def test_every_module_the_tiny_build_writes_passes(tmp_path):
    """The real writers' output (relax/module.py, lowered.py) has the accepted shape."""
    from doitproj import Project, build_through
    p = Project(tmp_path)
    p.add_images("s", 2)
    p.add_model("tiny", "s")
    ctx = build_through(tmp_path, "codegen")
    files = [ctx.layout.relax_script] + sorted(ctx.layout.dir.glob("c/*/lowered.py"))
    assert len(files) == 3
    for f in files:
        check_tvmscript(f.read_text(), f)

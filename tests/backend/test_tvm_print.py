"""TVMScript of a one-element buffer reads back (pipeline/tvm_print.py)."""

import tvm

from pipeline.backend.passes.primfunc import TensorArg, offload_primfunc
from pipeline.tvm_print import script_text


def test_one_element_buffer_round_trips():
    # a conv with one output channel (YOLO's DFL): bias, scale and shift are [1] vectors
    f = offload_primfunc("mmalib_conv2d_i8", [TensorArg("data", (1, 16, 4, 8), "int8"),
                                              TensorArg("weight", (1, 16, 1, 1), "int8"),
                                              TensorArg("bias", (1,), "int32"),
                                              TensorArg("out", (1, 1, 4, 8), "int8")], [16, 4])
    mod = tvm.IRModule({"k": f})
    assert ".source" in mod.script(show_meta=False)   # tvm's printer quirk this module mends
    text = script_text(mod)
    assert "bias.data" in text and ".source" not in text
    back = tvm.script.from_source(text)
    tvm.ir.assert_structural_equal(back["k"], f)   # raises ValueError on any difference

"""ONNX initializers as a state dict (pipeline/tools/onnx_weights.py), on a hand-made ONNX file."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.errors import PipelineError
from pipeline.tools.onnx_weights import read_state_dict


def _model(path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 6)).astype(np.float32)            # MatMul operand: [in, out]
    cls_pos, patch_pos = rng.standard_normal((1, 1, 4)), rng.standard_normal((1, 9, 4))
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "backbone.layernorm.weight"),
             numpy_helper.from_array(w, "onnx::MatMul_7"),
             numpy_helper.from_array(cls_pos.astype(np.float32), "onnx::Concat_3"),
             numpy_helper.from_array(patch_pos.astype(np.float32), "onnx::Reshape_4"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "onnx::Shape_9")]
    nodes = [helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["y"], name="/backbone/encoder/layer.0/mlp/fc1/MatMul"),
             helper.make_node("Concat", ["onnx::Concat_3", "onnx::Concat_3"], ["c"], axis=1,
                              name="/backbone/embeddings/Concat_6"),
             helper.make_node("Reshape", ["onnx::Reshape_4", "onnx::Shape_9"], ["r"], name="/backbone/embeddings/Reshape_1")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    onnx.save(helper.make_model(graph), str(path))
    return w, cls_pos, patch_pos


def test_initializers_become_a_state_dict_with_parameter_names(tmp_path):
    w, cls_pos, patch_pos = _model(tmp_path / "m.onnx")
    state = read_state_dict(tmp_path / "m.onnx")
    assert set(state) == {"backbone.layernorm.weight", "backbone.encoder.layer.0.mlp.fc1.weight",
                          "backbone.embeddings.position_embeddings"}   # the int64 shape constant is left out
    np.testing.assert_array_equal(state["backbone.encoder.layer.0.mlp.fc1.weight"].numpy(), w.T)
    pos = state["backbone.embeddings.position_embeddings"].numpy()
    assert pos.shape == (1, 10, 4)
    np.testing.assert_allclose(pos, np.concatenate([cls_pos, patch_pos], 1), rtol=1e-6)


def test_a_file_that_is_not_onnx_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "weights.onnx"
    bad.write_bytes(b"\x80\x04 not a protobuf \xff" * 10)
    with pytest.raises(PipelineError) as e:
        read_state_dict(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)

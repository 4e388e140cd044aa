"""relax.topk as static C (pipeline/backend/passes/topk.py): the ranking ops of an
NMS-free detection head (YOLO26: max over classes, topk, gather) compile without
TVM's runtime sort, bit-exact against the Python reference and equal to torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from c_check import compile_and_compare, inputs
from qflow import quantize, randomize_bn


class RankingHead(nn.Module):
    """conv -> scores [1, A, C] -> max over classes -> topk anchors -> gather -> [1, k, 3]."""

    def __init__(self, k=5):
        super().__init__()
        self.c = nn.Conv2d(3, 6, 3, 1, 1)
        self.k = k

    def forward(self, x):
        y = F.relu(self.c(x)).flatten(2).permute(0, 2, 1)    # [1, 64, 6]
        boxes, scores = y[..., :2], y[..., 2:].sigmoid()      # [1, 64, 2], [1, 64, 4]
        best, _ = scores.max(-1)                              # topk k=1 over the classes
        top, idx = best.topk(self.k, dim=1)                   # [1, k]
        picked = boxes.gather(1, idx[..., None].expand(-1, -1, 2))
        return torch.cat([picked, top[..., None]], -1)        # [1, k, 3]


@pytest.mark.parametrize("mmalib", [False, True])
def test_ranking_head_compiles_bit_exact_and_matches_torch(tmp_path, mmalib):
    torch.manual_seed(0)
    flow = quantize(randomize_bn(RankingHead()), torch.randn(1, 3, 8, 8), dtype="int8")
    x = inputs((1, 3, 8, 8), n=3)
    summary, c = compile_and_compare(flow.mod, "net", tmp_path, x, mmalib=mmalib)
    with torch.no_grad():
        ref = np.concatenate([flow.qdq(torch.from_numpy(x[i:i + 1])).numpy() for i in range(len(x))])
    c = c.reshape(ref.shape)
    np.testing.assert_allclose(c[..., 2], ref[..., 2], rtol=0, atol=1e-6)  # the ranked scores
    assert np.all(np.diff(c[..., 2], axis=1) <= 0)
    import json
    layers = json.loads((tmp_path / "manifest.json").read_text())["layers"]
    ranking = [la for la in layers if la["op"] in ("topk", "gather_elements")]
    assert len(ranking) == 3 and all(la["backend"] == "scalar" for la in ranking)
    if mmalib:  # (with MMALIB off every layer's reason is "mmalib disabled")
        assert all(la["reason"].startswith("float detection head: ") for la in ranking)


def test_topk_primfunc_orders_ties_by_index():
    import tvm
    from pipeline.backend.passes.topk import topk_primfunc
    f = topk_primfunc(2, 7, 4, "float32", "int64").with_attr("global_symbol", "main")
    ex = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
    x = np.array([[1, 5, 5, 2, 9, 0, 5], [3, 3, 3, 3, 3, 3, 3]], "float32")
    v, i = tvm.runtime.tensor(np.zeros((2, 4), "float32")), tvm.runtime.tensor(np.zeros((2, 4), "int64"))
    ex["main"](tvm.runtime.tensor(x), v, i)
    assert v.numpy().tolist() == [[9, 5, 5, 5], [3, 3, 3, 3]]
    assert i.numpy().tolist() == [[4, 1, 2, 6], [0, 1, 2, 3]]
    tv, _ = torch.from_numpy(x).topk(4, dim=1)
    assert np.array_equal(tv.numpy(), v.numpy())


def _ranked(f, x: np.ndarray, k: int):
    import tvm
    ex = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target="llvm")
    v, i = tvm.runtime.tensor(np.zeros((len(x), k), "float32")), tvm.runtime.tensor(np.zeros((len(x), k), "int64"))
    ex["main"](tvm.runtime.tensor(x), v, i)
    return v.numpy(), i.numpy()


@pytest.mark.parametrize("values", ["ties", "normal", "integers"])
def test_radix_select_gives_value_descending_index_ascending(values):
    """The 300-of-24000 pass of YOLO26n ranks by radix select: same order as a stable sort
    (value descending, index ascending), +0 and -0 equal, infinities included."""
    from pipeline.backend.call_work import stmt_work
    from pipeline.backend.passes.topk import topk_primfunc, uses_radix_select
    rows, n, k = 2, 24000, 300
    assert uses_radix_select(n, k, "float32") and not uses_radix_select(80, 1, "float32")
    assert not uses_radix_select(n, k, "int8")
    rng = np.random.default_rng(7)
    if values == "ties":
        x = rng.choice(np.float32([0, -0.0, 1, 2, 0.5, -3, np.inf, -np.inf, 7.25]), (rows, n))
    else:
        x = (rng.standard_normal((rows, n)) * 100).astype("float32")
        x = np.round(x) if values == "integers" else x
    f = topk_primfunc(rows, n, k, "float32", "int64")
    v, i = _ranked(f, x.astype("float32"), k)
    for r in range(rows):
        order = np.lexsort((np.arange(n), -x[r].astype(np.float64)))[:k]
        np.testing.assert_array_equal(i[r], order)
        np.testing.assert_array_equal(v[r], x[r][order])
    steps, _ = stmt_work(f.body)
    assert steps < 0.1 * rows * k * n, steps  # the selection would take k * n per row

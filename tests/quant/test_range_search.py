"""Range setting by layer-output and model-output error (pipeline.quant.range_search): issue 30, item 1."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._pytree import tree_leaves

from pipeline import torchenv  # noqa: F401  (torch settings before torchao)
from pipeline.quant.graph import out_of_place
from pipeline.quant.layer_sqnr import _QDQPass
from pipeline.quant.range_search import (CANDIDATES, _Resumable, search_ranges, search_ranges_at_output,
                                         searchable)
from quant_graph import prepare
from tinynets import residual_net


def _images(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, 16, 16, generator=gen) for _ in range(n)]


@pytest.fixture(scope="module")
def calibrated():
    xs = _images(6, 0)
    gm = prepare(residual_net(), xs[0], observer="percentile")
    with torch.no_grad():
        for x in xs:
            gm(x)
    return gm, xs


def test_every_int8_observer_with_a_reader_gets_a_candidate(calibrated):
    gm, xs = calibrated
    m = copy.deepcopy(gm)
    records = search_ranges(m, xs)
    searched = {n for n, mod in gm.named_modules() if searchable(mod)}
    assert {r["observer"] for r in records} <= searched and len(records) >= len(searched) - 1  # the logits: no reader
    for r in records:
        assert r["percentile"] in (*CANDIDATES, r["was"]) and 0 < r["gain"] <= 1.0
        assert float(m.get_submodule(r["observer"]).percentile) == r["percentile"]


def test_the_error_is_the_readers_output_error(calibrated):
    """Recompute one observer's score by hand: the conv reading the stem's ReLU output."""
    gm, xs = calibrated
    m = copy.deepcopy(gm)
    conv = next(n for n in m.graph.nodes if n.name == "conv2d_1")       # proj0 reads relu(stem)
    obs_node = conv.args[0]
    obs = m.get_submodule(obs_node.target)
    params = dict(m.named_parameters())
    weight = params[conv.args[1].args[0].target] if conv.args[1].args[0].target in params else \
        m.get_buffer(conv.args[1].args[0].target)
    bias = params.get(conv.args[2].target)

    @torch.no_grad()
    def err(p):
        obs.percentile.fill_(p)
        scale, zp = obs.calculate_qparams()
        total = 0.0
        for x in xs:
            h = torch.relu(torch.nn.functional.conv2d(x, *_stem(m)[:2], padding=1))
            ref = torch.nn.functional.conv2d(h, weight, bias)
            q = torch.fake_quantize_per_tensor_affine(h, float(scale), int(zp), obs.quant_min, obs.quant_max)
            y = torch.nn.functional.conv2d(q, weight, bias)
            total += float((y.double() - ref.double()).pow(2).sum() / ref.double().pow(2).sum())
        return total

    by_hand = {p: err(p) for p in CANDIDATES}
    assert max(by_hand.values()) > 1.05 * min(by_hand.values())     # the choice matters here
    obs.percentile.fill_(99.99)
    rec = {r["observer"]: r for r in search_ranges(m, xs)}[obs_node.target]
    assert by_hand[rec["percentile"]] == pytest.approx(min(by_hand.values()), rel=1e-6)


def _stem(m):
    conv = next(n for n in m.graph.nodes if n.name == "conv2d")
    params = {**dict(m.named_parameters()), **dict(m.named_buffers())}
    return params[conv.args[1].args[0].target], params[conv.args[2].target]


def test_in_place_readers_are_scored_out_of_place():
    aten = torch.ops.aten
    assert out_of_place(aten.relu_.default) is aten.relu.default
    assert out_of_place(aten.add_.Tensor) is aten.add.Tensor
    assert out_of_place(aten.conv2d.default) is aten.conv2d.default


def test_no_images_is_an_error(calibrated):
    with pytest.raises(ValueError, match="images"):
        search_ranges(copy.deepcopy(calibrated[0]), [])


def _output_error(gm, xs) -> float:
    """Relative squared error of the Q/DQ model's logits against float, over ``xs``."""
    from pipeline.quant.graph import FloatPass
    with torch.no_grad():
        ref = torch.cat([tree_leaves(FloatPass(gm).run(x))[0] for x in xs]).double()
        got = torch.cat([tree_leaves(_QDQPass(gm).run(x))[0] for x in xs]).double()
    return float((got - ref).pow(2).sum() / ref.pow(2).sum())


def test_resumed_passes_equal_the_full_q_dq_pass(calibrated):
    """Resuming from a saved live environment, any number of times, gives the Q/DQ model's
    output bit for bit: no in-place op touches a value another resume reads."""
    gm, xs = calibrated
    run = _Resumable(gm)
    with torch.no_grad():
        want = _QDQPass(gm).run(xs[0])
        env: dict = {}
        mid = len(run.nodes) // 2
        run.advance(env, 0, mid, (xs[0],))
        assert len(env) < mid         # values die after their last reader
        for _ in range(2):
            got = run.advance(dict(env), mid, len(run.nodes), (xs[0],))
            assert all(torch.equal(a, b) for a, b in zip(tree_leaves(got), tree_leaves(want), strict=True))


def test_output_search_never_raises_the_output_error(calibrated):
    gm, xs = calibrated
    m = copy.deepcopy(gm)
    before = _output_error(m, xs)
    records = search_ranges_at_output(m, xs)
    searched = {n for n, mod in gm.named_modules() if searchable(mod)}
    assert {r["observer"] for r in records} == searched      # the logits too: the output is measured
    for r in records:
        assert r["percentile"] in (*CANDIDATES, r["was"]) and 0 < r["gain"] <= 1.0
        assert float(m.get_submodule(r["observer"]).percentile) == r["percentile"]
    after = _output_error(m, xs)
    assert after <= before
    assert after < 0.99 * before or all(r["gain"] == 1.0 for r in records)


def test_output_search_ends_each_line_search_at_a_local_minimum(calibrated):
    """The logits' observer is the last one visited: its choice has no more output error
    than either neighbouring candidate, every other observer fixed (checked by hand)."""
    gm, xs = calibrated
    m = copy.deepcopy(gm)
    records = search_ranges_at_output(m, xs)
    last = records[-1]
    obs = m.get_submodule(last["observer"])
    ladder = sorted(set((*CANDIDATES, last["was"])))
    k = ladder.index(last["percentile"])
    by_hand = {}
    for p in ladder[max(k - 1, 0):k + 2]:
        obs.percentile.fill_(p)
        by_hand[p] = sum(_output_error(m, [x]) for x in xs)   # each image by its own energy, as the search
    obs.percentile.fill_(last["percentile"])
    assert by_hand[last["percentile"]] == pytest.approx(min(by_hand.values()), rel=1e-6)
    assert 2 <= last["tried"] <= len(ladder)


def test_line_search_follows_the_falling_side_and_stops():
    from pipeline.quant.range_search import _line_search
    curve = [5.0, 3.0, 2.0, 4.0, 6.0, 7.0]
    seen = []

    def error(k):
        seen.append(k)
        return curve[k]
    errors = _line_search(error, 4, len(curve))
    assert min(errors, key=errors.get) == 2 and sorted(seen) == [1, 2, 3, 4, 5]
    assert _line_search(lambda k: [1.0, 1.0][k], 0, 2) == {0: 1.0, 1: 1.0}   # flat: stops at once


def test_stacked_batches_give_the_per_image_errors(calibrated):
    """Stacking the images is only a speed-up: the same rows, each normalised alone."""
    from pipeline.quant.range_search import _relative_error, _stack
    gm, xs = calibrated
    batches, refs = _stack(gm, xs)
    assert len(batches) < len(xs) and sum(b.shape[0] for b in batches) == len(xs)
    run = _Resumable(gm)
    with torch.no_grad():
        stacked = sum(_relative_error(run.advance({}, 0, len(run.nodes), (b,)), r) for b, r in zip(batches, refs))
        single = sum(_output_error(gm, [x]) for x in xs)
    assert stacked == pytest.approx(single, rel=1e-3)


def test_output_search_without_images_is_an_error(calibrated):
    with pytest.raises(ValueError, match="images"):
        search_ranges_at_output(copy.deepcopy(calibrated[0]), [])

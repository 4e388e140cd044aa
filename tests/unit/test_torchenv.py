"""torchenv's memoized type hints for torch.export.load: same program, fewer hint lookups."""

from __future__ import annotations

import typing

import torch

from pipeline import torchenv
from tinynets import SmallCNN


def _load(path, memoized: bool):
    from torch._export.serde import serialize
    shim = serialize.typing
    serialize.typing = shim if memoized else typing
    try:
        return torch.export.load(path)
    finally:
        serialize.typing = shim


def test_export_load_with_memoized_hints_gives_the_same_program(tmp_path):
    from torch._export.serde import serialize
    assert serialize.typing is not typing, "torchenv did not install its memoized typing"
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    ep = torch.export.export(SmallCNN().eval(), (x,))
    path = tmp_path / "p.pt2"
    torchenv.save_program(ep, path)
    slow, fast = _load(path, memoized=False), _load(path, memoized=True)
    assert fast.graph_module.code == slow.graph_module.code
    assert str(fast.graph_signature) == str(slow.graph_signature)
    assert fast.state_dict.keys() == slow.state_dict.keys()
    assert all(torch.equal(fast.state_dict[k], slow.state_dict[k]) for k in slow.state_dict)
    assert torch.equal(fast.module()(x), slow.module()(x))
    assert _hint_lookups(path, memoized=True) < _hint_lookups(path, memoized=False) / 10


def _hint_lookups(path, memoized: bool) -> int:
    """typing.get_type_hints evaluations during one load (the memo is warm by now)."""
    calls = []
    real = typing.get_type_hints
    typing.get_type_hints = lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    try:
        _load(path, memoized)
    finally:
        typing.get_type_hints = real
    return len(calls)


def test_load_program_from_memory_is_a_private_copy_of_the_loaded_program(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "p.pt2"
    torchenv.save_program(torch.export.export(SmallCNN().eval(), (x,)), path)
    fresh = torch.export.load(path)
    first, second = torchenv.load_program(path), torchenv.load_program(path)
    key = next(k for k, (ep, _) in torchenv._PROGRAMS.items() if ep.graph_module.code == fresh.graph_module.code)
    assert second is not first and second is not torchenv._PROGRAMS[key][0]
    for got in (first, second):  # the same program as torch.export.load's, node metadata included
        assert got.graph_module.code == fresh.graph_module.code
        assert str(got.graph_signature) == str(fresh.graph_signature)
        assert [sorted(n.meta) for n in got.graph.nodes] == [sorted(n.meta) for n in fresh.graph.nodes]
        assert torch.equal(got.module()(x), fresh.module()(x))
    # a caller writing into its module's parameters (ep.module() shares them) changes no other copy
    with torch.no_grad():
        next(first.module().parameters()).add_(1.0)
    assert torch.equal(torchenv.load_program(path).module()(x), fresh.module()(x))
    assert not torch.equal(first.module()(x), fresh.module()(x))


def test_load_program_copies_share_no_node_metadata(tmp_path):
    """What a caller (or torch.export, re-exporting it) writes into a node's
    ``custom`` / ``nn_module_stack`` meta does not reach the next copy."""
    torch.manual_seed(0)
    path = tmp_path / "p.pt2"
    torchenv.save_program(torch.export.export(SmallCNN().eval(), (torch.randn(1, 3, 32, 32),)), path)
    first = torchenv.load_program(path)
    node = next(n for n in first.graph.nodes if n.op == "call_function")
    assert isinstance(node.meta.get("nn_module_stack"), dict)
    node.meta.setdefault("custom", {})["written_by_a_caller"] = True
    node.meta["nn_module_stack"]["written_by_a_caller"] = ("x", object)
    again = next(n for n in torchenv.load_program(path).graph.nodes if n.name == node.name)
    assert "written_by_a_caller" not in again.meta.get("custom", {})
    assert "written_by_a_caller" not in again.meta["nn_module_stack"]


def test_load_program_reloads_a_rewritten_file_and_skips_large_ones(tmp_path, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    path = tmp_path / "p.pt2"
    torchenv.save_program(torch.export.export(SmallCNN().eval(), (x,)), path)
    before = torchenv.load_program(path).module()(x)
    torchenv.save_program(torch.export.export(SmallCNN().eval(), (x,)), path)  # new random weights
    after = torchenv.load_program(path).module()(x)
    assert torch.equal(after, torch.export.load(path).module()(x)) and not torch.equal(after, before)
    monkeypatch.setattr(torchenv, "_PROGRAMS", type(torchenv._PROGRAMS)())
    monkeypatch.setattr(torchenv, "PROGRAM_CACHE_BYTES", 2 * path.stat().st_size - 2)  # half is 1 B too small
    assert torch.equal(torchenv.load_program(path).module()(x), after)
    assert not torchenv._PROGRAMS


def test_release_torchao_modules_frees_prepared_and_converted_models():
    """PT2E's device look-ups cache every module they see (functools.cache);
    after release_torchao_modules a dropped model is garbage."""
    import gc
    import weakref

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from pipeline.quant import C7xMMAQuantizer

    torch.manual_seed(0)
    x = torch.randn(1, 3, 32, 32)
    prepared = prepare_pt2e(torch.export.export(SmallCNN().eval(), (x,)).module(), C7xMMAQuantizer())
    prepared(x)
    converted = convert_pt2e(prepared)
    refs = [weakref.ref(prepared), weakref.ref(converted)]
    del prepared, converted
    gc.collect()
    assert any(r() is not None for r in refs), "PT2E no longer caches modules: release is not needed"
    torchenv.release_torchao_modules()
    gc.collect()
    assert all(r() is None for r in refs)

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

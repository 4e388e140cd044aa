"""Refusal: how the backend says "this layer stays on the scalar path, because ...".

A helper that finds a matched layer ineligible (a rescale that does not fit,
a bias outside int32, a kernel size MMALIB lacks...) raises :class:`Declined`
with the reason, in words, that the offload log and the manifest record
verbatim. The offload planner wraps its checks in :func:`declining`, which
attaches the layer's anchor, op and dtype; ``run_pass``
(:mod:`pipeline.backend.passes.rewrite`) catches the exception once and logs
the decline.

This module is the lowest layer of the backend (no imports from it), so that
the pure-numpy :mod:`pipeline.backend.fold` can raise the same exception as
the passes.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


class Declined(Exception):
    """A matched pattern that will not be offloaded.

    ``reason``: why, as logged. ``anchor`` / ``op`` / ``dtype``: the layer
    (binding name of its main op, op name, activation dtype), ``None`` until
    :func:`declining` fills them in.
    """

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
        self.anchor: str | None = None
        self.op: str | None = None
        self.dtype: str | None = None

    @property
    def located(self) -> bool:
        """True once the layer the refusal is about is known."""
        return self.anchor is not None


@contextmanager
def declining(anchor: str, op: str, dtype: str) -> Iterator[None]:
    """Attribute every :class:`Declined` raised inside to the layer ``(anchor, op, dtype)``
    and re-raise it (an already located refusal keeps its layer)."""
    try:
        yield
    except Declined as e:
        if not e.located:
            e.anchor, e.op, e.dtype = anchor, op, dtype
        raise

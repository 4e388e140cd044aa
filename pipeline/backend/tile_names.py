"""Names of tiled PrimFuncs (:mod:`.tiling`), without TVM: the offload page and the
layers stage match a tiled call of the C to the untiled one of ``lowered.py``."""

from __future__ import annotations

import re

_PREFIX = re.compile(r"^tiled\d+[wi]_|^fused\d+_.+?_then_")


def tiled_name(name: str, tc: int, streams: str) -> str:
    """Name of the tiled form of PrimFunc ``name``: ``tiled<tc><w|i>_<name>`` (``streams``:
    "weights" or "input"). It ends in the untiled name, which ``lowered.py`` calls and
    the host dumps are matched on."""
    return f"tiled{tc}{streams[0]}_{name}"


def fused_name(producer: str, consumer: str, tc: int) -> str:
    """Name of PrimFunc ``producer`` fused into ``consumer`` over tiles of ``tc`` channels
    (:func:`.tiling.fused_primfunc`): ``fused<tc>_<producer>_then_<consumer>``. It ends in
    the consumer's name: the host dump of the fused call is the consumer's output."""
    return f"fused{tc}_{producer}_then_{consumer}"


def reference_name(func: str) -> str:
    """The PrimFunc ``lowered.py`` (the untiled program) calls where the C calls ``func``."""
    return _PREFIX.sub("", func)

"""TVMScript text of an IRModule that TVM's own parser reads back.

tvm 0.27 prints the data pointer of a one-element buffer (``T.Buffer((1,), ...)``, e.g. the
bias of a conv with one output channel, as in YOLO's DFL) as ``bias.source.data``, which its
parser rejects (``'Var' object has no attribute 'source'``); parsing ``bias.data`` gives back
the same ``tirx.buffer_data`` call, so the text is mended to that. Checked by a round-trip
test (tests/backend/test_tvm_print.py).
"""

from __future__ import annotations

import re

_ONE_ELEMENT_DATA = re.compile(r"\b([A-Za-z_]\w*)\.source\.data\b")


def script_text(mod) -> str:
    """``mod.script(show_meta=False)`` with the one-element buffer pointers mended (module doc)."""
    return _ONE_ELEMENT_DATA.sub(r"\1.data", mod.script(show_meta=False))

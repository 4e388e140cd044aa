"""Import torch/torchao the same way in every stage: quiet and deterministic.

Stages import this module (never the task loader), so ``doit list`` stays free
of torch.
"""

from __future__ import annotations

import contextlib
import logging
import os

# torchao 0.18 logs a deprecation notice through torch's pytree logger on import.
logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
# Idle OpenMP threads sleep instead of spinning: under `doit -n 2` two stages
# share 2 cores, and spinning threads made each other's stages ~3x slower
# (measured on the layers stage). Results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# The target machine has 2 cores shared with the decoder threads; more threads
# only add contention. Override with C7X_TORCH_THREADS.
torch.set_num_threads(int(os.environ.get("C7X_TORCH_THREADS", "2")))

import torchao.quantization.pt2e  # noqa: E402,F401  (registers the Q/DQ ops)
from torch.ao.quantization.fx import _decomposed  # noqa: E402,F401  (needed by torch.export.load)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op thread count set to ``n`` inside the block, restored after
    (it is per process: other threads of the process see it meanwhile)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def strip_nondeterministic_meta(ep: "torch.export.ExportedProgram") -> None:
    """Drop node metadata that embeds Python object ids (``from_node`` holds
    ``graph_id = id(graph)``), so saving the same program twice gives the same
    bytes and doit's MD5 check can stop an unchanged cascade."""
    for node in ep.graph.nodes:
        node.meta.pop("from_node", None)


def save_tensors(obj, path) -> None:
    """``torch.save`` ``obj`` to ``path`` atomically, byte-stable.

    torch.save names the zip's root folder after the file it writes to; saving
    through a buffer keeps the temporary name of the atomic write out of the bytes.
    """
    import io

    from .fsutil import write_bytes
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_bytes(path, buf.getvalue())


def save_program(ep: "torch.export.ExportedProgram", path) -> None:
    """``torch.export.save`` atomically, without nondeterministic node metadata."""
    import io

    from .fsutil import write_bytes
    strip_nondeterministic_meta(ep)
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    write_bytes(path, buf.getvalue())

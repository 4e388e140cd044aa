"""Running the exported PyTorch programs, and their outputs on the evaluation images, computed once.

:func:`run_outputs` runs a batch-1 program image by image (every output of a
tuple return; :func:`single_output` is output 0, the one the reports score).

``evaluate`` runs ``float.pt2`` and ``quantized.pt2`` on the evaluation images
(its report) and keeps what it computed in ``torch_outputs.npz``; ``verify``
compares every C build against that file instead of loading and running both
programs again (a stage does not re-run what another stage computed). The file
also holds each Q/DQ output's scale (one LSB) and PyTorch's self-noise run:
output 0 of the Q/DQ program again on the first ``SELF_NOISE_IMAGES`` images
with 1 thread and MKLDNN off, the band PyTorch moves by itself (verify.py).

Arrays: ``float_<i>`` / ``qdq_<i>`` float32 [N, ...] per output i in return
order, ``lsb`` float64 [outputs] (NaN: a float output, no LSB), ``noise``
float32 [k, ...], ``images`` (file names), ``inputs_sha256`` (of the
preprocessed float32 batch [N, C, H, W]: verify checks it decoded the same
inputs).
"""

from __future__ import annotations

import hashlib
import io
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import torchenv
from ..errors import PipelineError, UnsupportedOpError
from ..fsutil import write_bytes


SELF_NOISE_IMAGES = 5     # first images of the PyTorch self-noise pass (1 thread, no MKLDNN)


def model_outputs(out, model: str) -> list[torch.Tensor]:
    """The output tensors of a model call, in return order (a tensor, or a flat
    tuple / list of tensors, as the C entry packs them). Raises UnsupportedOpError
    for anything else (a nested tuple, a dict, a non-tensor)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not outs or not all(isinstance(t, torch.Tensor) for t in outs):
        kinds = sorted({type(t).__name__ for t in outs})
        raise UnsupportedOpError(f"model {model!r} returns {type(out).__name__} of {kinds}; the C7x entry "
                                 f"point packs tensors: return a tensor or a flat tuple of tensors")
    return outs


def single_output(out, model: str) -> torch.Tensor:
    """Output 0 of a model call, the one the accuracy reports score (:func:`model_outputs`)."""
    return model_outputs(out, model)[0]


def outputs_note(count: int) -> str | None:
    """The one-line caveat of a model with several outputs, else None."""
    if count < 2:
        return None
    return f"model has {count} outputs; accuracy is on output 0, bit-exactness on all"


def run_outputs(module, images: torch.Tensor, model: str = "") -> list[torch.Tensor]:
    """Every output of a batch-1 module on ``images`` [N, ...], one image at a time:
    one [N, ...] tensor per output, in return order."""
    with torch.no_grad():
        per_image = [model_outputs(module(images[i:i + 1]), model) for i in range(len(images))]
    return [torch.cat(parts) for parts in zip(*per_image)]


def run_program_outputs(pt2: Path, images: torch.Tensor, model: str = "") -> list[torch.Tensor]:
    """:func:`run_outputs` of an exported program (the Q/DQ program is exported with batch 1)."""
    return run_outputs(torchenv.load_program(pt2).module(), images, model)


def run_program(pt2: Path, images: torch.Tensor, model: str = "") -> torch.Tensor:
    """Logits [N, classes] float32 of an exported program (output 0 of a model
    with several), one image at a time."""
    return run_program_outputs(pt2, images, model)[0]


@dataclass
class TorchOutputs:
    """What :func:`compute` returns and :func:`write` / :func:`read` keep (module docstring)."""

    images: list[str]
    inputs_sha256: str
    float_outs: list[np.ndarray]
    qdq_outs: list[np.ndarray]
    lsbs: list[float | None]
    noise: np.ndarray


def inputs_digest(x) -> str:
    """sha256 of a preprocessed batch (tensor or array), as float32 C-order bytes."""
    a = np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x, dtype=np.float32)
    return hashlib.sha256(a.tobytes()).hexdigest()


def output_scales(ep) -> list[float | None]:
    """Per program output (return order): the scale of the dequantize feeding it
    (one LSB, in output units), or None when it comes from float ops (e.g. a
    softmax). ``ep``: a ``quantized.pt2`` path or its loaded ExportedProgram."""
    ep = torchenv.load_program(ep) if isinstance(ep, (str, Path)) else ep
    outs = next(n for n in ep.graph.nodes if n.op == "output").args[0]
    return [float(o.args[1]) if "dequantize_per_tensor" in str(getattr(o, "target", "")) else None
            for o in outs]


def output_scale(ep) -> float | None:
    """:func:`output_scales` of output 0 (the one the accuracy reports score)."""
    return output_scales(ep)[0]


def run_torch_outputs(module, x: torch.Tensor, model: str = "") -> list[np.ndarray]:
    """Every output of a batch-1 program on ``x``, one image at a time: [N, ...] each."""
    return [t.numpy() for t in run_outputs(module, x, model)]


def run_torch(module, x: torch.Tensor, model: str = "") -> np.ndarray:
    """Outputs [N, K] of a batch-1 program (output 0 of one with several), one image at a time."""
    return run_torch_outputs(module, x, model)[0]


def self_noise_run(module, x: torch.Tensor) -> np.ndarray:
    """Output 0 of ``module`` on ``x`` with 1 thread and without MKLDNN."""
    with torchenv.torch_threads(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # oneDNN's TF32-on-Intel-GPU notice on enter/exit
        with torch.backends.mkldnn.flags(enabled=False):
            return run_torch(module, x)


def compute(float_pt2: Path, quantized_pt2: Path, x: torch.Tensor, images: list[str],
            model: str = "") -> TorchOutputs:
    """Both programs on ``x`` (float32 [N, C, H, W], the preprocessed ``images``),
    each loaded once, plus the Q/DQ self-noise run on the first images."""
    qdq_ep = torchenv.load_program(quantized_pt2)
    qdq = qdq_ep.module()
    qdq_outs = run_torch_outputs(qdq, x, model)
    float_outs = run_torch_outputs(torchenv.load_program(float_pt2).module(), x, model)
    noise = self_noise_run(qdq, x[:SELF_NOISE_IMAGES])
    return TorchOutputs(list(images), inputs_digest(x), float_outs, qdq_outs, output_scales(qdq_ep), noise)


def write(path: Path, t: TorchOutputs) -> None:
    """Keep ``t`` in ``path``: an npz (``np.load`` reads it) written atomically,
    with fixed zip timestamps, so the same outputs give the same bytes and the
    verify task that depends on the file is not re-run for nothing."""
    arrays = {"images": np.array(t.images), "inputs_sha256": np.array(t.inputs_sha256), "noise": t.noise,
              "lsb": np.array([np.nan if s is None else s for s in t.lsbs], np.float64)}
    arrays.update({f"float_{i}": a for i, a in enumerate(t.float_outs)})
    arrays.update({f"qdq_{i}": a for i, a in enumerate(t.qdq_outs)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, a in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asarray(a), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), member.getvalue())
    write_bytes(path, buf.getvalue())


def read(path: Path, images: list[str], x, model: str) -> TorchOutputs:
    """The outputs kept in ``path``, checked to be of ``images`` preprocessed as
    ``x``. Raises PipelineError (file, model, what to do) when the file is
    missing, unreadable, or of other images / preprocessing."""
    redo = f"re-run `doit evaluate:{model}`"
    try:
        with np.load(path, allow_pickle=False) as z:
            count = len(z["lsb"])
            t = TorchOutputs([str(s) for s in z["images"]], str(z["inputs_sha256"]),
                             [z[f"float_{i}"] for i in range(count)], [z[f"qdq_{i}"] for i in range(count)],
                             [None if np.isnan(s) else float(s) for s in z["lsb"]], z["noise"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise PipelineError(f"model {model!r}: cannot read the PyTorch outputs {path} ({e}); {redo}") from None
    if t.images != list(images) or t.inputs_sha256 != inputs_digest(x):
        raise PipelineError(f"model {model!r}: {path} holds PyTorch outputs of other evaluation images or "
                            f"preprocessing than verify's; {redo}")
    return t

"""Stage ``verify``: prove the generated C on the host, on the real images.

For every build variant the host executable runs the preprocessed images and
is compared with

1. the Python integer reference of the same lowered program
   (``backend.interp``): must be bit-identical (0 LSB) on every image, else the
   stage fails;
2. the PyTorch Q/DQ model (``quantized.pt2``): max / mean difference in LSB of
   the output scale and top-1 agreement. The scalar baseline is expected
   within 1 LSB (int8) on every output; the MMALIB build rescales with 8-bit
   multipliers, so it is judged by top-1 agreement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import torchenv  # noqa: F401
from ..config import ModelSpec, list_images
from ..data.images import load_images
from ..errors import CalibrationDataError, PipelineError
from ..fsutil import write_json

import torch  # noqa: E402


class VerificationError(PipelineError):
    """The host C disagrees with the Python reference of the same program."""


def output_scale(quantized_pt2: Path) -> float:
    """Scale of the dequantize feeding the program output (one LSB, in logit units)."""
    ep = torch.export.load(quantized_pt2)
    out = next(n for n in ep.graph.nodes if n.op == "output").args[0][0]
    if "dequantize_per_tensor" not in str(out.target):
        raise PipelineError(f"{quantized_pt2}: the output is not dequantized from an integer tensor")
    return float(out.args[1])


def lsb_stats(a: np.ndarray, b: np.ndarray, lsb: float) -> dict:
    """Differences of two dequantized [N, K] outputs in integer steps of ``lsb``.

    Both are (q - zp) * lsb in float32; rounding each back to its integer
    before subtracting counts steps exactly (a float quotient of the
    difference reads a 1-step int16 difference as 1.002)."""
    d = np.abs(np.rint(a.astype(np.float64) / lsb) - np.rint(b.astype(np.float64) / lsb))
    return {"max_lsb": round(float(d.max()), 3), "mean_lsb": round(float(d.mean()), 4),
            "elements_off": int((d > 0.5).sum()), "elements": int(d.size),
            "top1_agreement": int((a.argmax(1) == b.argmax(1)).sum())}


def verify_variant(variant: str, codegen_dir: Path, exe: Path, images: np.ndarray,
                   torch_out: np.ndarray, lsb: float) -> dict:
    """Run one build on ``images`` [N, C, H, W] float32 and compare it."""
    from ..backend.host import run_host
    from ..backend.interp import run_reference

    host = run_host(exe, codegen_dir, images)
    ref = run_reference(codegen_dir, images)
    per_image_exact = [bool(np.array_equal(host[i], ref[i])) for i in range(len(images))]
    return {"variant": variant, "images": len(images),
            "vs_python_reference": {"bit_exact_images": sum(per_image_exact),
                                    **lsb_stats(host, ref, lsb)},
            "vs_pytorch_qdq": lsb_stats(host, torch_out, lsb)}


def summary_line(r: dict, dtype: str) -> str:
    ref, pt = r["vs_python_reference"], r["vs_pytorch_qdq"]
    n = r["images"]
    line = (f"[{r['variant']}] C == Python integer reference on {ref['bit_exact_images']}/{n} images; "
            f"vs PyTorch Q/DQ: max {pt['max_lsb']:g} LSB, mean {pt['mean_lsb']:g} LSB, "
            f"top-1 agreement {pt['top1_agreement']}/{n}")
    if r["variant"] == "scalar":
        ok = pt["max_lsb"] <= 1
        line += f" (within 1 LSB on every output: {'yes' if ok else 'NO'})"
    return line


def verify_model(spec: ModelSpec, quantized_pt2: Path, images_dir: Path,
                 builds: dict[str, tuple[Path, Path]], out: Path) -> dict:
    """Verify every build variant on the evaluation images; write ``verify.json``.

    Raises :class:`VerificationError` (after writing the JSON) if any image's
    host output differs from the Python reference.
    """
    paths = list_images(images_dir)
    if not paths:
        raise CalibrationDataError(f"model {spec.name!r}: no images in {images_dir} to verify on")
    x = load_images(paths, spec.preprocess, desc=f"verify {spec.name}")
    module = torch.export.load(quantized_pt2).module()
    with torch.no_grad():
        torch_out = torch.cat([module(x[i:i + 1]) for i in range(len(x))]).numpy()
    lsb = output_scale(quantized_pt2)
    images = x.numpy().astype(np.float32)
    results = [verify_variant(v, cdir, exe, images, torch_out, lsb) for v, (cdir, exe) in builds.items()]
    report = {"model": spec.name, "dtype": spec.dtype, "output_lsb": lsb,
              "images": [p.name for p in paths], "variants": results,
              "summary_lines": [summary_line(r, spec.dtype) for r in results]}
    write_json(out, report)
    bad = [r["variant"] for r in results if r["vs_python_reference"]["bit_exact_images"] != len(paths)]
    if bad:
        raise VerificationError(f"model {spec.name!r}: host C differs from the Python integer reference "
                                f"for build(s) {bad}; see {out}")
    return report

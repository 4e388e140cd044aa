"""Model-zoo sweep: torchvision classifiers with realistic random weights, export through verify.

    .venv/bin/python scripts/sweep.py [--models a,b,c] [--images 4] [--timeout 1800] [--out DIR]
                                      [--resume] [--include-large]

Each model is built in its own temporary project (``--out DIR/<model>/`` when
given, kept; else a temp folder, removed) by a child process running the
registry's stage functions from ``export`` to ``verify`` (``pipeline/stages/
registry.py``; no doit, no run-cache), with the weights of
``pipeline.models.zoo:torchvision_random``, made realistic by export (BatchNorm
re-estimated on the images in one pass, classifier scaled; nothing is downloaded). Calibration, BatchNorm statistics and
verify use the same first ``--images`` JPEGs of ``calib_data/imagenet20``.
One model at a time; a failure or a timeout is one row, the sweep goes on. The tables are
rewritten after every model (a killed sweep keeps its rows; ``--resume`` with the same
``--out`` builds only the models without one, timed-out ones again). Without ``--models``,
the :data:`TOO_LARGE` models are rows "skipped (too large)" with the reason.

Columns: stage reached (the last stage that finished) and error (one line),
layers and MACs offloaded (``manifest.json`` of the MMALIB build), scalar layer
kinds (op x count of the layers left to TVM's scalar path), bit-exact (images
where the host C equals the Python integer reference, every build), vs Q/DQ
max/mean LSB (each build vs PyTorch's Q/DQ program; ``sweep.json`` also has
PyTorch's Q/DQ against itself, ``qdq_self_noise_lsb``), logit std over the images
(Q/DQ, in output LSB, mean over classes) and distinct top-1, time (s) and peak
RSS (GiB, the largest process of the build: ``os.wait4``'s ``ru_maxrss``). A
model whose Q/DQ logits vary by less than ``--min-std`` LSB over the images is
"not tested (degenerate output)": bit-exact then proves only that it runs.
1-layer probe max/mean LSB: how far the Q/DQ output moves when only its first
conv / linear requantizes with the MMALIB kernels' 7-bit multiplier
(:func:`one_layer_probe`), i.e. how much the model amplifies 1-LSB differences. A
build whose mean LSB vs Q/DQ exceeds twice the baseline's plus 1 is marked "far
from Q/DQ", the baseline being the larger of the scalar build's and the probe's
mean; one above that bound for the scalar build alone but within the probe's is
marked "amplified by the model" (:func:`deviates`).
Writes ``sweep.md`` and ``sweep.json`` (``--out``, else the current folder).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "calib_data" / "imagenet20"
LAST_STAGE = "verify"
RESULT = "sweep_result.json"

#: Models the default sweep (no ``--models``) lists with the reason instead of building
#: (``--include-large`` builds them): even the lowest estimate of their peak RSS leaves less
#: than a third of a 24 GiB, 2-core machine to anything else. Peak RSS of a sweep build is
#: about 1.3 GiB + 28 B per parameter for CNNs (measured, 2 images: alexnet 61M -> 2.73 GiB,
#: vgg11 133M -> 4.98, wide_resnet50_2 69M -> 3.18) and 40-80 B per parameter with
#: LayerNorm / attention (convnext_tiny 29M -> 2.40, swin_t 28M -> 2.97, maxvit_t 31M -> 3.77).
#: Every other model is estimated at most 10 GiB at its family's rate (convnext_large, 198M:
#: 9 GiB), but for vit_l_16 / vit_l_32 (304M: 9 GiB at the CNN rate, 24 at the highest
#: attention rate; ViT is mostly Linear weights): built, and they need a larger --timeout.
TOO_LARGE: dict[str, str] = {
    "regnet_y_128gf": "645M parameters, 128 GMACs: estimated peak RSS 18 GiB of a 24 GiB machine",
    "vit_h_14": "632M parameters, 167 GMACs: estimated peak RSS 18 GiB of a 24 GiB machine, and hours of "
                "scalar attention on 2 cores",
}

ENTRY = '''builder = "pipeline.models.zoo:torchvision_random"
builder_kwargs = {{ name = "{name}", seed = 0 }}
input_shape = [1, 3, {crop}, {crop}]
dtype = "int8"
preprocess = {{ resize = {resize}, crop = {crop} }}
[weights]
pretrained = false
reestimate_batchnorm = true
batchnorm_batch = 0
logit_std = 2.0
[calibration]
set = "sweep"
[evaluation]
set = "sweep"
'''


# ----------------------------------------------------------------------------- one model (child process)

def make_project(root: Path, name: str, n_images: int) -> None:
    """``root/models/<name>.toml`` and ``root/calib_data/sweep/`` (copies of the first
    ``n_images`` shipped JPEGs): a project of one zoo model."""
    from pipeline.models.zoo import crop_of
    images = root / "calib_data" / "sweep"
    images.mkdir(parents=True, exist_ok=True)
    shipped = sorted(IMAGES.glob("*.jpg"))
    if len(shipped) < n_images:
        raise SystemExit(f"sweep: {IMAGES} has {len(shipped)} JPEGs, fewer than --images {n_images}; "
                         f"run scripts/setup.sh")
    for p in shipped[:n_images]:
        shutil.copy(p, images / p.name)
    crop = crop_of(name)
    (root / "models").mkdir(exist_ok=True)
    (root / "models" / f"{name}.toml").write_text(
        ENTRY.format(name=name, crop=crop, resize=crop * 8 // 7))


def build_one(root: Path, name: str, n_images: int) -> None:
    """Run export..verify for ``name`` in the project at ``root``; record progress in
    ``root/sweep_result.json`` after every stage (the parent reads it, even after a kill)."""
    import resource
    make_project(root, name, n_images)
    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project

    project = Project(root / "models", root=root)
    ctx = project.context(project.valid()[0])
    result = {"model": name, "stage": None, "times": {}, "error": None}
    names = [s.name for s in STAGES]
    for stage in STAGES[:names.index(LAST_STAGE) + 1]:
        if not stage.applies(ctx) or not stage.in_default_run():
            continue
        result["running"] = stage.name
        _write(root, result)
        t0 = time.perf_counter()
        try:
            stage.function()(**stage.args(ctx))
        except BaseException as e:  # one line, and the row still gets what was measured
            result["error"] = f"{stage.name}: {type(e).__name__}: {_one_line(e)}"
            break
        finally:
            result["times"][stage.name] = round(time.perf_counter() - t0, 2)
            result["rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        result["stage"] = stage.name
        if stage.name == "codegen":
            result.update(offload(ctx.layout.codegen_dir("mmalib") / "manifest.json"))
    result.pop("running", None)
    if ctx.layout.verify.is_file():
        result.update(verify_numbers(ctx.layout.verify))
        if result["error"] is None or result["error"].startswith("verify: VerificationError"):
            result["running"] = "qdq_numbers"  # a timeout here says so
            _write(root, result)
            t0 = time.perf_counter()
            result.update(qdq_numbers(ctx, result["output_lsb"]))
            result["times"]["qdq_numbers"] = round(time.perf_counter() - t0, 2)
            result.pop("running")
    _write(root, result)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:300]


def _write(root: Path, result: dict) -> None:
    from pipeline.fsutil import write_json
    write_json(root / RESULT, result)


def offload(manifest: Path) -> dict:
    """Layers and MACs offloaded, the scalar layer kinds (op -> count), the TVM scalar
    calls per inference (calls outside MMALIB/C7x kernels) and what compile-time folding
    removed, of a build."""
    m = json.loads(manifest.read_text())
    s = m["summary"]
    scalar = collections.Counter(l["op"] for l in m["layers"] if l["backend"] == "scalar")
    return {"layers": s["layers"], "layers_offloaded": s["layers_offloaded"],
            "macs_total": s["macs_total"], "macs_offloaded": s["macs_offloaded"],
            "scalar_kinds": dict(sorted(scalar.items())), "tvm_calls": s.get("calls", {}).get("tvm"),
            "folded": s.get("folded", {}).get("bindings")}


def verify_numbers(verify_json: Path) -> dict:
    """Bit-exact images per build and the MMALIB build's LSB error vs Q/DQ, from ``verify.json``."""
    v = json.loads(verify_json.read_text())
    builds = {r["variant"]: r for r in v["variants"]}
    first = builds.get("mmalib") or next(iter(builds.values()))
    noise = v.get("pytorch_qdq", {}).get("self_noise_1_thread_no_mkldnn", {})
    return {"images": len(v["images"]), "output_lsb": v.get("output_lsb"),
            "bit_exact": {k: r["vs_python_reference"]["bit_exact_images"] for k, r in builds.items()},
            "qdq_max_lsb": first["vs_pytorch_qdq"]["max_lsb"], "qdq_mean_lsb": first["vs_pytorch_qdq"]["mean_lsb"],
            "qdq_lsb": {k: [r["vs_pytorch_qdq"]["max_lsb"], r["vs_pytorch_qdq"]["mean_lsb"]] for k, r in builds.items()},
            "qdq_self_noise_lsb": [noise.get("max_lsb"), noise.get("mean_lsb")],
            "qdq_unit": first["vs_pytorch_qdq"].get("unit", "lsb")}


def qdq_numbers(ctx, lsb: float | None) -> dict:
    """:func:`output_variation` and :func:`one_layer_probe` of the Q/DQ program on the
    evaluation images."""
    import torch
    from pipeline.data.images import load_images
    x = load_images(ctx.evaluation_images, ctx.spec.preprocess, desc="variation")
    qdq = torch.export.load(ctx.layout.quantized_pt2).module()
    y = _outputs(qdq, x)
    return {**output_variation(y, lsb), **one_layer_probe(ctx.layout.quantized_pt2, x, y, lsb)}


def _outputs(module, x):
    """The module's outputs [N, K] on the images x [N, 3, H, W], one image at a time."""
    import torch
    with torch.no_grad():
        return torch.cat([module(x[i:i + 1]).reshape(1, -1) for i in range(len(x))])


def output_variation(y, lsb: float | None) -> dict:
    """How the Q/DQ program's output ``y`` [N, K] varies over the images: std over images per
    class, averaged over classes (in output LSB when the output is dequantized), and the
    number of distinct top-1 classes."""
    std = float(y.std(dim=0).mean()) / (lsb or 1.0)
    return {"logit_std": round(std, 3), "top1_distinct": len(set(y.argmax(dim=1).tolist()))}


def one_layer_probe(quantized_pt2: Path, x, y, lsb: float | None) -> dict:
    """How far the Q/DQ program's output moves when ONE layer, its first conv / linear,
    requantizes as the MMALIB kernels do (:func:`requantize_like_mmalib`), everything else
    unchanged in torch: ``probe_lsb`` = [max, mean] |y' - y| over the images, in output LSB
    (``y``: the unchanged program's outputs [N, K] on ``x``), and ``probe_layer``.

    With identical inputs 1-9 % of an MMALIB layer's outputs differ from torch by 1 LSB (the
    7-bit multiplier, ``docs/numerics.md``). A model that turns that into as large an output
    distance as a whole MMALIB build amplifies 1-LSB differences (e.g. deep random-weight
    nets with re-estimated BatchNorm): its Q/DQ distance cannot show a wrong layer
    (:func:`deviates`). ``probe_lsb`` is None when the program has no such layer."""
    import torch
    probe = torch.export.load(quantized_pt2).module()
    layer = requantize_like_mmalib(probe)
    if layer is None:
        return {"probe_lsb": None, "probe_layer": None}
    d = (_outputs(probe, x) - y).abs() / (lsb or 1.0)
    return {"probe_lsb": [round(float(d.max()), 3), round(float(d.mean()), 5)], "probe_layer": layer}


def _attr(gm, arg):
    """A Q/DQ parameter: a literal, or the module attribute a get_attr node names."""
    import functools
    if getattr(arg, "op", None) == "get_attr":
        return functools.reduce(getattr, arg.target.split("."), gm)
    return arg


def _output_quantize(node):
    """The quantize that ends a layer: down single-user ops from its main op, or None."""
    for _ in range(8):
        if len(node.users) != 1:
            return None
        (node,) = node.users
        if "quantize_per_tensor" in str(node.target) and "dequantize" not in str(node.target):
            return node
    return None


def requantize_like_mmalib(gm) -> str | None:
    """Make the first conv2d / linear of the Q/DQ module ``gm`` (in place; per-tensor input
    and output, per-channel weights) requantize with the MMALIB kernels' multiplier:
    each channel's rescale ``r[c] = d_s * w_s[c] / o_s`` becomes ``scale / 2**shift`` of
    :func:`pipeline.backend.fold.float_to_scale_shift`, by scaling ``w_s[c]`` and the float
    bias by ``r'[c] / r[c]`` (the kernel folds the bias in accumulator units, so its bias
    is scaled with the same multiplier). Returns the layer's node name, or None."""
    import torch
    from pipeline.backend import fold
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.conv2d.default,
                                                             torch.ops.aten.linear.default):
            continue
        dq_x, dq_w = node.args[0], node.args[1]
        out = _output_quantize(node)
        if (out is None or "dequantize_per_tensor" not in str(getattr(dq_x, "target", ""))
                or "dequantize_per_channel" not in str(getattr(dq_w, "target", ""))):
            continue
        d_s, o_s, w_s = float(_attr(gm, dq_x.args[1])), float(_attr(gm, out.args[1])), _attr(gm, dq_w.args[1])
        realized = [fold.float_to_scale_shift(r) for r in (d_s * w_s.double() / o_s).tolist()]
        if any(p is None for p in realized):
            continue
        ratio = torch.tensor([s / 2.0**sh * o_s / d_s for s, sh in realized], dtype=torch.float64) / w_s.double()
        bias = _attr(gm, node.args[2]) if len(node.args) > 2 and node.args[2] is not None else None
        if bias is not None:
            bias.data = (bias.double() * ratio).to(bias.dtype)
        w_s.data = (w_s.double() * ratio).to(w_s.dtype)
        return node.name
    return None


# ----------------------------------------------------------------------------- the sweep (parent)

def run_model(name: str, root: Path, n_images: int, timeout: float) -> dict:
    """Build ``name`` in a child process under ``root``; kill its process group after
    ``timeout`` s. Returns its row: the child's record plus time, peak RSS and status."""
    root.mkdir(parents=True, exist_ok=True)
    (root / RESULT).unlink(missing_ok=True)
    log = (root / "sweep.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--worker", name, "--out", str(root),
                             "--images", str(n_images)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    timed_out, pid = False, 0
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the child and its gcc / host exes
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.5)
    finally:
        if not pid:  # the sweep itself is stopped (SIGTERM, ^C): do not leave the build running
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.close()
    row = json.loads((root / RESULT).read_text()) if (root / RESULT).is_file() else {"model": name, "stage": None}
    row["time_s"] = round(time.perf_counter() - t0, 1)
    row["peak_rss_gib"] = round(usage.ru_maxrss / 2**20, 2)  # KiB on Linux; max over the process tree
    if timed_out:
        row["error"] = f"timeout: over {timeout:.0f} s, killed in {row.get('running', '?')}"
    elif row.get("error") is None and proc.returncode != 0:
        log_lines = (root / "sweep.log").read_text(errors="replace").splitlines()
        row["error"] = f"{row.get('running', 'start')}: {crash_line(proc.returncode, log_lines)}"
    row["status"] = status_of(row)
    return row


def crash_line(returncode: int, log_lines: list[str]) -> str:
    """One line for a build that died without recording an error: the signal or exit code,
    and the last log line that reports an error (TVM's, the JIT's: e.g. "JIT session error:
    Symbols not found: [ ... ]" before a segfault), else the last non-empty line (a crash's
    last line is usually a stack frame, which names nothing)."""
    what = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0 and -returncode in
            signal.valid_signals() else f"exit {returncode}")
    lines = [l.strip() for l in log_lines if l.strip()]
    errors = [l for l in lines if "error" in l.lower() and "warning" not in l.lower()]
    hint = errors[-1] if errors else (lines[-1] if lines else "")
    return f"{what}: {hint[:200]}" if hint else what


def status_of(row: dict, min_std: float = 2.0) -> str:
    """"bit-exact" (maybe "(<builds> far from Q/DQ)" or "(<builds> amplified by the model)",
    :func:`deviates`), "not tested (degenerate output)", "not bit-exact" or "failed"."""
    exact = row.get("bit_exact")
    if not exact or row.get("error") and not row["error"].startswith("verify: VerificationError"):
        return "failed"
    if any(n != row["images"] for n in exact.values()):
        return "not bit-exact"
    if row.get("logit_std", 0.0) < min_std:
        return "not tested (degenerate output)"
    far, amplified = deviates(row), deviates(row, probe=False)
    amplified = [k for k in amplified if k not in far]
    notes = ([f"{', '.join(far)} far from Q/DQ"] if far else []) + \
        ([f"{', '.join(amplified)} amplified by the model"] if amplified else [])
    return f"bit-exact ({'; '.join(notes)})" if notes else "bit-exact"


def deviates(row: dict, probe: bool = True) -> list[str]:
    """Builds whose mean LSB vs Q/DQ exceeds twice the baseline's plus 1 LSB: the C
    equals its integer reference, but that reference may lower some layer differently
    from PyTorch (bit-exactness cannot see it).

    The baseline is the scalar build's mean LSB, or, with ``probe``, the larger of it and
    the one-layer probe's (:func:`one_layer_probe`): where one layer requantized as MMALIB
    does moves the Q/DQ output as far, the distance measures the model's amplification of
    1-LSB differences, not a wrong layer (ShuffleNetV2 x0.5 and MobileNetV3-small with
    random weights: the probe's first conv alone gives 26 / 4.6 LSB mean)."""
    lsb = row.get("qdq_lsb", {})
    if "scalar" not in lsb:
        return []
    base = lsb["scalar"][1]
    if probe and row.get("probe_lsb"):
        base = max(base, row["probe_lsb"][1])
    return [k for k, (_, mean) in lsb.items() if k != "scalar" and mean > 2 * base + 1]


COLUMNS = ("model", "status", "stage reached", "layers offloaded", "MACs offloaded", "scalar layer kinds",
           "calls outside MMALIB/C7x kernels per inference", "bit-exact", "vs Q/DQ max / mean LSB", "1-layer probe max / mean LSB", "logit std (LSB) / top-1 distinct", "time (s)",
           "peak RSS (GiB)", "error")


def table_row(r: dict) -> list[str]:
    """One markdown/console row of a sweep result."""
    def pct(a, b):
        return f"{a}/{b} ({100 * a / b:.0f}%)" if b else f"{a}/{b}"
    has_manifest = "layers" in r
    return [
        r["model"], r["status"], r.get("stage") or "-",
        pct(r["layers_offloaded"], r["layers"]) if has_manifest else "-",
        (f"{r['macs_offloaded'] / 1e6:,.0f}M/{r['macs_total'] / 1e6:,.0f}M "
         f"({100 * r['macs_offloaded'] / max(r['macs_total'], 1):.1f}%)") if has_manifest else "-",
        ", ".join(f"{k} x{n}" for k, n in r.get("scalar_kinds", {}).items()) or ("none" if has_manifest else "-"),
        str(r["tvm_calls"]) if r.get("tvm_calls") is not None else "-",
        ", ".join(f"{k} {n}/{r['images']}" for k, n in r["bit_exact"].items()) if r.get("bit_exact") else "-",
        ", ".join(f"{k} {a:g} / {b:.2f}" for k, (a, b) in r["qdq_lsb"].items()) if "qdq_lsb" in r else "-",
        f"{r['probe_lsb'][0]:g} / {r['probe_lsb'][1]:.2f}" if r.get("probe_lsb") else "-",
        f"{r['logit_std']:.1f} / {r['top1_distinct']}" if "logit_std" in r else "-",
        f"{r['time_s']:.0f}" if r.get("time_s") is not None else "-",
        f"{r['peak_rss_gib']:.2f}" if r.get("peak_rss_gib") is not None else "-",
        (r.get("error") or "").replace("|", "/"),
    ]


def markdown(rows: list[dict]) -> str:
    """The sweep table as markdown, with a count line."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_row(r)) + " |" for r in rows]
    n = collections.Counter(r["status"] for r in rows)
    lines.append("")
    exact = sum(v for k, v in n.items() if k.startswith("bit-exact"))
    lines.append(f"{exact}/{len(rows)} bit-exact with non-degenerate output; "
                 + ", ".join(f"{k}: {v}" for k, v in sorted(n.items())))
    return "\n".join(lines) + "\n"


def write_tables(folder: Path, rows: list[dict]) -> None:
    """``folder/sweep.json`` (the rows) and ``folder/sweep.md`` (:func:`markdown`), each
    replaced atomically (written to a temporary name, then renamed)."""
    for name, text in (("sweep.json", json.dumps(rows, indent=1) + "\n"), ("sweep.md", markdown(rows))):
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, folder / name)


def skipped_row(name: str) -> dict:
    """The row of a :data:`TOO_LARGE` model the sweep does not build: status "skipped (too
    large)", the reason as its error."""
    return {"model": name, "stage": None, "status": "skipped (too large)", "time_s": None,
            "peak_rss_gib": None, "error": f"not built: {TOO_LARGE[name]} (--include-large builds it)"}


def plan(models: list[str], named: bool, include_large: bool) -> list[str]:
    """The models of ``models`` to build: all of them when they were named (``--models``,
    ``named``) or with ``include_large``, else all but :data:`TOO_LARGE`."""
    return list(models) if named or include_large else [m for m in models if m not in TOO_LARGE]


def previous_rows(folder: Path) -> dict[str, dict]:
    """Rows of an earlier sweep in ``folder/sweep.json`` (model -> row; {} when there is none),
    for ``--resume``: rows of timed-out and skipped models are left out (built, or skipped,
    again)."""
    path = folder / "sweep.json"
    if not path.is_file():
        return {}
    return {r["model"]: r for r in json.loads(path.read_text())
            if not str(r.get("error") or "").startswith("timeout") and not r["status"].startswith("skipped")}


def _stop(signum, frame):
    raise SystemExit(f"sweep: stopped by signal {signum}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated torchvision names (default: all classification models)")
    ap.add_argument("--images", type=int, default=4, help="images for BN statistics, calibration and verify")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per model")
    ap.add_argument("--min-std", type=float, default=2.0,
                    help="Q/DQ logit std over the images (LSB) below which a model is degenerate")
    ap.add_argument("--out", help="keep each model's project in OUT/<model>/ and the tables in OUT/")
    ap.add_argument("--include-large", action="store_true",
                    help="also build the models of TOO_LARGE (not built by default: listed with the reason)")
    ap.add_argument("--resume", action="store_true",
                    help="with --out: keep the rows of OUT/sweep.json and build only the models without one "
                         "(a timed-out model is built again)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: build this one model in --out
    args = ap.parse_args()
    if args.images < 2:
        ap.error("--images must be at least 2 (BatchNorm statistics and output variation)")
    if args.worker:
        return build_one(Path(args.out), args.worker, args.images)
    import torchvision
    known = torchvision.models.list_models(module=torchvision.models)
    models = args.models.split(",") if args.models else known
    unknown = [m for m in models if m not in known]
    if unknown:
        ap.error(f"not torchvision classification models: {', '.join(unknown)}")
    if args.resume and not args.out:
        ap.error("--resume needs --out (the folder of the earlier sweep.json)")
    out = Path(args.out).resolve() if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    tmp = None if out else tempfile.TemporaryDirectory(prefix="c7x-sweep-")
    base = out or Path(tmp.name)
    build = plan(models, bool(args.models), args.include_large)
    done = previous_rows(out) if args.resume else {}
    rows = []
    tables = out or Path.cwd()
    signal.signal(signal.SIGTERM, _stop)  # a killed sweep still writes its tables (finally)
    try:
        for name in models:
            if name in done:
                row = done[name]
            elif name not in build:
                row = skipped_row(name)
            else:
                row = run_model(name, base / name, args.images, args.timeout)
                row["status"] = status_of(row, args.min_std)
            rows.append(row)
            print(" | ".join(table_row(row)), flush=True)
            write_tables(tables, rows)  # after every model: a killed sweep keeps its rows
    finally:
        write_tables(tables, rows)
        if tmp:
            tmp.cleanup()
    print()
    print(markdown(rows))


if __name__ == "__main__":
    main()

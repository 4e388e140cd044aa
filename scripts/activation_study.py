"""Where a model's int8 activation error comes from: the per-tensor scale, outliers, or both.

    .venv/bin/python scripts/activation_study.py --model efficientnet_b0_2d3d [--top 8]

The holdout and layers stages say how far a build is from float and at which
layer; this study says why, by counterfactuals the C7x build cannot run. The
float model (conv-BN folded, as PT2E folds it) gets int8 fake quantization at
every module's output (convs, activations, pools, linears; a conv that only a
ReLU reads is quantized once, at the ReLU's output, as PT2E does; weights stay
float) on the entry's calibration images, with ranges from torchao observers:

- per-tensor, max |x| (``MinMaxObserver``) and the 99.99th percentile of |x|
  (our default observer, :class:`pipeline.quant.observers.PercentileObserver`):
  one scale per tensor, what the C7x kernels read;
- per-channel, max |x| (``PerChannelMinMaxObserver``, axis 1 of NCHW, the last
  axis of a transformer's tokens): a scale per channel, which the kernels do not
  offer for activations;
- int16 everywhere, and int16 for the ``--top`` tensors that cost most alone.

A per-channel row far better than the per-tensor rows means the channels of some
tensors span very different ranges (one step of the widest channel swallows the
narrow ones): EfficientNet-B0's SiLU outputs. Per-channel no better, and int16 on
a few tensors much better, means outliers inside channels ("massive
activations"): ResNet-50's last stages. docs/zoo.md reads the figures.

Scores, on output 0 against float: a classifier's mean |logit error| as a share of
the float logits' standard deviation, an embedding's cosine (mean, worst).
In-sample (the ranges come from the images scored) and weights in float: the rows
attribute error, they do not predict a build's held-out accuracy (the holdout
stage measures that). Needs the model's weights (``scripts/setup.sh``, ``--zoo``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline import torchenv  # noqa: E402,F401
from pipeline.data.images import load_images, select_images  # noqa: E402
from pipeline.entries import load_models  # noqa: E402
from pipeline.quant.observers import PercentileObserver  # noqa: E402
from pipeline.stages.export import build_model  # noqa: E402
from pipeline.weights import resolve_weights  # noqa: E402

import torch  # noqa: E402
from torch.nn.utils.fusion import fuse_conv_bn_eval  # noqa: E402
from torchao.quantization.pt2e import MinMaxObserver, PerChannelMinMaxObserver  # noqa: E402

SKIP = (torch.nn.Identity, torch.nn.Dropout)


def fold_batchnorm(model: torch.nn.Module) -> None:
    """Fold every BatchNorm2d that directly follows a Conv2d in a module's children (in place)."""
    for mod in list(model.modules()):
        kids = list(mod.named_children())
        for (a, conv), (b, bn) in zip(kids, kids[1:]):
            if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.BatchNorm2d):
                setattr(mod, a, fuse_conv_bn_eval(conv, bn))
                setattr(mod, b, torch.nn.Identity())


def points(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The leaf modules whose outputs are quantized, by name."""
    return {n: m for n, m in model.named_modules() if not list(m.children()) and not isinstance(m, SKIP)}


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Calls:
    """Forward hooks on ``leaves`` that name each output ``module#k`` (its k-th call in a
    pass: torchvision's ResNet calls one ReLU three times) and hand it to ``fn(key, out,
    inputs)``, which may return a replacement."""

    def __init__(self, leaves: dict, fn):
        self.count: dict[str, int] = {}
        self.hooks = [m.register_forward_hook(self._hook(n, fn)) for n, m in leaves.items()]

    def _hook(self, name, fn):
        def hook(_m, _i, out):
            k = self.count.get(name, 0)
            self.count[name] = k + 1
            return fn(f"{name}#{k}", out, _i) if torch.is_tensor(out) and out.is_floating_point() else None
        return hook

    def __call__(self, model, x):
        self.count.clear()
        with torch.no_grad():
            out = first(model(x))
        for h in self.hooks:
            h.remove()
        return out


def observe(model, leaves, x, make, skip=frozenset()) -> dict:
    """{point: observer} after one pass over ``x``, but for the points in ``skip``;
    ``make(out)`` builds an observer for the output ``out``."""
    obs = {}

    def see(key, out, _inputs):
        if key not in obs:
            obs[key] = make(out)
        obs[key](out)
    Calls(leaves, see)(model, x)
    return {k: o for k, o in obs.items() if k not in skip}


def fake_quant(o, obs):
    """``o`` through int8/int16 fake quantization with ``obs``'s scales (per tensor or per channel)."""
    scale, zp = obs.calculate_qparams()
    if scale.numel() > 1:
        return torch.fake_quantize_per_channel_affine(o, scale.float(), zp.int(), obs.ch_axis, obs.quant_min,
                                                      obs.quant_max)
    return torch.fake_quantize_per_tensor_affine(o, float(scale), int(zp), obs.quant_min, obs.quant_max)


def run(model, leaves, x, chosen: dict):
    """Output 0 with the points in ``chosen`` {point: observer} fake-quantized."""
    return Calls(leaves, lambda key, out, _i: fake_quant(out, chosen[key]) if key in chosen else None)(model, x)


def fused(model, leaves, x) -> set[str]:
    """The conv/linear outputs that only a ReLU or ReLU6 reads next: PT2E quantizes conv +
    ReLU once, at the ReLU's output (the BatchNorm between them is folded)."""
    made, seen, out = {}, [], set()

    def see(key, t, inputs):
        seen.append(t)   # kept alive: ids stay unique through the pass
        module = leaves[key.split("#")[0]]
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            made[id(t)] = key
        elif isinstance(module, (torch.nn.ReLU, torch.nn.ReLU6)) and inputs and id(inputs[0]) in made:
            out.add(made[id(inputs[0])])
    Calls(leaves, see)(model, x[:1])
    return out


def score(task: str, out, ref) -> str:
    if task == "embedding":
        cos = torch.nn.functional.cosine_similarity(out.flatten(1).double(), ref.flatten(1).double())
        return f"cosine mean {cos.mean():.3f}, worst {cos.min():.3f}"
    rel = (out - ref).abs().mean() / ref.std()
    return f"|logit error| {100 * rel:.0f}% of float's spread"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="efficientnet_b0_2d3d")
    ap.add_argument("--top", type=int, default=8, help="the most costly tensors listed and made int16")
    args = ap.parse_args()
    torch.manual_seed(0)
    spec = next((s for s in load_models(REPO / "models") if s.name == args.model), None)
    if spec is None or spec.task not in ("classification", "embedding"):
        sys.exit(f"activation_study: {args.model}: no such entry, or not a classifier or embedding")
    model, _ = build_model(spec, resolve_weights(spec, REPO), REPO)
    model.eval()
    fold_batchnorm(model)
    leaves = points(model)
    x = load_images(select_images(REPO / "calib_data" / spec.calibration.set, spec.calibration, spec.name),
                    spec.preprocess, f"{spec.name} images", model=spec.name)
    with torch.no_grad():
        ref = first(model(x))
    sym = {"dtype": torch.int8, "quant_min": -128, "quant_max": 127}
    observers = {
        "per-tensor, max |x|": lambda out: MinMaxObserver(qscheme=torch.per_tensor_symmetric, **sym),
        "per-tensor, 99.99th percentile": lambda out: PercentileObserver(qscheme=torch.per_tensor_symmetric, **sym),
        # a scale per channel: axis 1 of NCHW, the last axis of tokens [N, T, C]; a linear's
        # [N, F] output keeps one per tensor
        "per-channel, max |x|": lambda out: (PerChannelMinMaxObserver(
            ch_axis={4: 1, 3: 2}[out.dim()], qscheme=torch.per_channel_symmetric, **sym) if out.dim() in (3, 4)
            else MinMaxObserver(qscheme=torch.per_tensor_symmetric, **sym)),
    }
    skip = fused(model, leaves, x)
    int16 = observe(model, leaves, x, lambda out: MinMaxObserver(
        qscheme=torch.per_tensor_symmetric, dtype=torch.int16, quant_min=-32768, quant_max=32767), skip)
    print(f"{spec.name}: {len(int16)} activation points, {len(x)} images (in-sample ranges, float weights)")
    seen = {}
    for name, make in observers.items():
        seen[name] = observe(model, leaves, x, make, skip)
        print(f"  int8 {name:32s} {score(spec.task, run(model, leaves, x, seen[name]), ref)}")
    print(f"  int16 everywhere{'':22s} {score(spec.task, run(model, leaves, x, int16), ref)}")
    base = seen["per-tensor, 99.99th percentile"]
    alone = sorted(((_alone_error(model, leaves, x, ref, n, ob), n) for n, ob in base.items()), reverse=True)
    print(f"  the {args.top} tensors that cost most alone (int8 percentile, the rest float):")
    for err, n in alone[:args.top]:
        print(f"    {n:44s} {type(leaves[n.split('#')[0]]).__name__:18s} error alone {err:.4f}")
    for k in sorted({1, args.top // 2, args.top} - {0}):
        top = {n for _, n in alone[:k]}
        mix = {n: (int16[n] if n in top else ob) for n, ob in base.items()}
        print(f"  int16 for the top {k:<3d} int8 percentile rest {score(spec.task, run(model, leaves, x, mix), ref)}")


def _alone_error(model, leaves, x, ref, name, ob) -> float:
    """Mean |output error| with only ``name`` quantized, relative to the float output's spread."""
    return float((run(model, leaves, x, {name: ob}) - ref).abs().mean() / ref.std())


if __name__ == "__main__":
    main()

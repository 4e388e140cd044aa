"""The zoo's realistic random weights (pipeline/models/zoo.py, made realistic by
pipeline/models/random_weights.py on export's route) and the sweep (scripts/sweep.py).

Fast tests use real torchvision models on a few seeded JPEGs; the slow test
runs the sweep on three small models through verify (issue 13, the CI subset).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from doitproj import write_jpeg
from pipeline.models import random_weights, zoo

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import sweep  # noqa: E402

#: the CI subset: small models that finish export..verify in about a minute each on 2 cores
CI_MODELS = ("squeezenet1_1", "mobilenet_v3_small", "shufflenet_v2_x0_5")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("zoo_images")
    for i in range(4):
        write_jpeg(d / f"img_{i:02d}_{i}.jpg", seed=i, size=64)
    return d


def _x(images: Path, name: str) -> torch.Tensor:
    from pipeline.config import PreprocessSpec
    from pipeline.data.images import load_images
    from pipeline.config import list_images
    crop = zoo.crop_of(name)
    return load_images(list_images(images), PreprocessSpec(resize=crop * 8 // 7, crop=crop), desc="x")


def _realistic(name: str, images: Path, logit_std: float = 2.0, seed: int = 0) -> torch.nn.Module:
    """The sweep entry's route: the seeded build, then export's make_realistic."""
    model = zoo.torchvision_random(name, seed=seed)
    random_weights.make_realistic(model, _x(images, name), reestimate=True, batch=0, logit_std=logit_std)
    return model


def test_batchnorm_statistics_are_those_of_the_images():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(5, 3, 12, 12) * 3 + 1
    with torch.no_grad():
        assert random_weights.reestimate_batchnorm(net, x) == 1
        pre = net[0](x)
    bn = net[1]
    assert not bn.training and bn.momentum == 0.1  # left as torchvision builds it
    torch.testing.assert_close(bn.running_mean, pre.mean(dim=(0, 2, 3)))
    torch.testing.assert_close(bn.running_var, pre.var(dim=(0, 2, 3), unbiased=True))


def test_random_init_is_degenerate_and_ours_is_not(images):
    """torchvision's own init gives near-constant MobileNetV3 logits (issue 13); ours
    gives logit std `logit_std` over the images, centered, with input-dependent top-1."""
    import torchvision
    x = _x(images, "mobilenet_v3_small")
    torch.manual_seed(0)
    raw = torchvision.models.mobilenet_v3_small(weights=None).eval()
    ours = _realistic("mobilenet_v3_small", images, logit_std=2.0)
    with torch.no_grad():
        y_raw, y = raw(x), ours(x)
    assert float(y_raw.std(dim=0).mean()) < 1e-2
    assert float(y.std(dim=0).mean()) == pytest.approx(2.0, rel=1e-3)
    assert float(y.mean(dim=0).abs().max()) < 1e-3
    assert len(set(y.argmax(dim=1).tolist())) > 1


def test_squeezenet_conv_classifier_is_scaled(images):
    """SqueezeNet ends in conv -> ReLU -> average pool: scaled exactly, not centered on the output."""
    y = _realistic("squeezenet1_1", images, logit_std=3.0)(_x(images, "squeezenet1_1"))
    assert float(y.detach().std(dim=0).mean()) == pytest.approx(3.0, rel=1e-3)


def test_weights_are_deterministic_and_seeded(images):
    a = _realistic("shufflenet_v2_x0_5", images).state_dict()
    b = _realistic("shufflenet_v2_x0_5", images).state_dict()
    c = _realistic("shufflenet_v2_x0_5", images, seed=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["conv1.0.weight"], c["conv1.0.weight"])


def test_bad_input_fails_in_one_line():
    with pytest.raises(ValueError, match="'resnet9' is not a torchvision classification model"):
        zoo.torchvision_random("resnet9")


def test_the_sweep_entry_takes_exports_route_and_tracks_the_images(tmp_path):
    """One route to realistic random weights: the entry asks export for it, so the task
    tracks the calibration images (an edited image re-runs export) and the settings."""
    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project
    sweep.make_project(tmp_path, "squeezenet1_1", n_images=2)
    project = Project(tmp_path / "models", root=tmp_path)
    (spec,) = project.valid()
    assert spec.weights.reestimate_batchnorm and spec.weights.batchnorm_batch == 0
    assert spec.weights.logit_std == 2.0 and spec.builder_kwargs == {"name": "squeezenet1_1", "seed": 0}
    task = project.task(next(s for s in STAGES if s.name == "export"), spec)
    images = sorted((tmp_path / "calib_data" / "sweep").glob("*.jpg"))
    assert len(images) == 2 and all(str(p) in task["file_dep"] for p in images)


def test_too_few_images_fail_export_in_one_line(tmp_path):
    from pipeline.entries import load_models
    from pipeline.errors import CalibrationDataError
    from pipeline.stages.export import export_model
    sweep.make_project(tmp_path, "squeezenet1_1", n_images=2)
    (tmp_path / "calib_data" / "sweep" / sorted(p.name for p in (tmp_path / "calib_data" / "sweep").iterdir())[0]
     ).unlink()
    (spec,) = load_models(tmp_path / "models")
    with pytest.raises(CalibrationDataError, match="selects 1 image; .*needs at least 2") as e:
        export_model(spec, None, tmp_path / "float.pt2", tmp_path, calib_dir=tmp_path / "calib_data" / "sweep")
    assert "\n" not in str(e.value)


def test_a_failing_model_is_one_row(tmp_path):
    """A model whose build fails is one row naming the stage and the error."""
    row = sweep.run_model("not_a_model", tmp_path / "m", n_images=2, timeout=300)
    assert row["status"] == "failed" and row["stage"] is None
    assert row["error"].startswith("export: ConfigError: model 'not_a_model': builder")
    assert "raised ValueError: torchvision_random: 'not_a_model' is not" in row["error"]
    assert "\n" not in row["error"] and row["peak_rss_gib"] > 0


def test_a_timeout_is_listed_as_such(tmp_path):
    row = sweep.run_model("squeezenet1_1", tmp_path / "m", n_images=2, timeout=4)
    assert row["status"] == "failed"
    assert row["error"].startswith("timeout: over 4 s, killed in ")
    assert "squeezenet1_1 | failed" in sweep.markdown([row])


@pytest.mark.slow
def test_ci_subset_is_bit_exact_and_not_degenerate(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "sweep.py"), "--models", ",".join(CI_MODELS),
                          "--images", "3", "--timeout", "600", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["model"]: r for r in json.loads((tmp_path / "sweep.json").read_text())}
    assert set(rows) == set(CI_MODELS)
    for name, r in rows.items():
        assert r["status"].startswith("bit-exact"), (name, r.get("error"))
        assert r["bit_exact"] == {"mmalib": 3, "scalar": 3}
        assert r["logit_std"] >= 2.0 and r["top1_distinct"] >= 2, name
        assert r["macs_offloaded"] > 0.9 * r["macs_total"], name
        assert isinstance(r["tvm_calls"], int) and r["folded"] is not None, name   # from the manifest
    md = (tmp_path / "sweep.md").read_text()
    assert "3/3 bit-exact" in md and "calls outside MMALIB/C7x kernels per inference" in md


def _fake_row(name: str) -> dict:
    return {"model": name, "stage": "verify", "error": None, "bit_exact": {"mmalib": 2, "scalar": 2}, "images": 2,
            "logit_std": 30.0, "top1_distinct": 2, "qdq_lsb": {"mmalib": [3.0, 1.0], "scalar": [2.0, 0.5]},
            "time_s": 1.0, "peak_rss_gib": 1.0}


def _main(monkeypatch, argv: list[str], run_model) -> None:
    monkeypatch.setattr(sweep, "run_model", run_model)
    monkeypatch.setattr(sys, "argv", ["sweep.py", *argv])
    sweep.main()


def test_rows_are_written_after_every_model(tmp_path, monkeypatch):
    """A sweep stopped during its second model (here ^C) keeps the first model's row in
    sweep.json and sweep.md: the tables are rewritten after every model."""
    def run(name, root, n_images, timeout):
        if name == "resnet18":
            (tmp_path / "seen.json").write_text((tmp_path / "sweep.json").read_text())
            raise KeyboardInterrupt
        return _fake_row(name)
    with pytest.raises(KeyboardInterrupt):
        _main(monkeypatch, ["--models", "alexnet,resnet18,vgg11", "--out", str(tmp_path)], run)
    assert [r["model"] for r in json.loads((tmp_path / "seen.json").read_text())] == ["alexnet"]
    assert [r["model"] for r in json.loads((tmp_path / "sweep.json").read_text())] == ["alexnet"]
    assert "| alexnet | bit-exact |" in (tmp_path / "sweep.md").read_text()
    assert not list(tmp_path.glob(".sweep*.tmp"))


def test_too_large_models_are_listed_not_built(tmp_path, monkeypatch):
    """The default (all models) lists TOO_LARGE with the reason and builds the rest; named in
    --models, or with --include-large, a large model is built."""
    large = next(iter(sweep.TOO_LARGE))
    built = []
    _main(monkeypatch, ["--out", str(tmp_path)], lambda name, *a: built.append(name) or _fake_row(name))
    rows = {r["model"]: r for r in json.loads((tmp_path / "sweep.json").read_text())}
    assert len(rows) == 80 and set(built) == set(rows) - set(sweep.TOO_LARGE)
    assert rows[large]["status"] == "skipped (too large)"
    assert rows[large]["error"].startswith(f"not built: {sweep.TOO_LARGE[large]}")
    md = (tmp_path / "sweep.md").read_text()
    assert f"| {large} | skipped (too large) | - |" in md
    assert f"{80 - len(sweep.TOO_LARGE)}/80 bit-exact" in md and f"skipped (too large): {len(sweep.TOO_LARGE)}" in md
    assert sweep.plan([large, "alexnet"], named=True, include_large=False) == [large, "alexnet"]
    assert sweep.plan([large, "alexnet"], named=False, include_large=True) == [large, "alexnet"]
    assert sweep.plan([large, "alexnet"], named=False, include_large=False) == ["alexnet"]


def test_resume_builds_only_models_without_a_row(tmp_path, monkeypatch):
    """--resume keeps the earlier rows, but builds a timed-out model again."""
    def first(name, *a):
        return _fake_row(name) if name == "alexnet" else {**_fake_row(name), "error": "timeout: over 9 s, killed in verify"}
    _main(monkeypatch, ["--models", "alexnet,resnet18", "--out", str(tmp_path)], first)
    built = []
    _main(monkeypatch, ["--models", "alexnet,resnet18,vgg11", "--out", str(tmp_path), "--resume"],
          lambda name, *a: built.append(name) or _fake_row(name))
    assert built == ["resnet18", "vgg11"]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["model"] for r in rows] == ["alexnet", "resnet18", "vgg11"]
    assert all(r["status"] == "bit-exact" for r in rows)


def test_a_stopped_sweep_kills_the_build(tmp_path, monkeypatch):
    """A sweep interrupted while a model builds kills that build's process group (it runs in
    its own session, so it would otherwise go on alone)."""
    import os
    procs = []
    real_popen = subprocess.Popen

    def popen(*a, **k):
        procs.append(real_popen(*a, **k))
        return procs[-1]

    def interrupt(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(sweep.subprocess, "Popen", popen)
    monkeypatch.setattr(sweep.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        sweep.run_model("squeezenet1_1", tmp_path / "m", n_images=2, timeout=300)
    with pytest.raises(ProcessLookupError):
        os.killpg(procs[0].pid, 0)


def test_a_crash_names_the_signal_and_the_error_line():
    """A segfaulted build (swin_v2_t in codegen) is named by its signal and the JIT's error
    line, not by the stack frame it printed last."""
    log = ["calibrate swin_v2_t: 2 images", "[12:00] transform.h:1261: Warning: Fast mode segfaults when ...",
           "JIT session error: Symbols not found: [ mmalib_matmul_bias_i8 ]", "!!!!!!! Segfault encountered !!!!!!!",
           '  File "./signal/../sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c", line 0, in 0x00007f7ab565a04f']
    assert sweep.crash_line(-11, log) == \
        "killed by SIGSEGV: JIT session error: Symbols not found: [ mmalib_matmul_bias_i8 ]"
    assert sweep.crash_line(3, ["a", "last words", ""]) == "exit 3: last words"
    assert sweep.crash_line(-9, []) == "killed by SIGKILL"


def test_a_zero_initialised_head_is_redrawn_then_scaled():
    """torchvision's VisionTransformer initialises heads.head to zero: its logits are the
    bias, constant over the images (vit_b_16's sweep row was degenerate, std 0). The head is
    re-drawn, then scaled to logit_std, deterministically under the seed."""
    import torchvision
    x = torch.randn(4, 3, 32, 32)

    def vit(seed):
        torch.manual_seed(seed)
        m = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1, num_heads=2,
                                                 hidden_dim=16, mlp_dim=32, num_classes=10).eval()
        assert not m.heads.head.weight.any()
        with torch.no_grad():
            random_weights.scale_classifier(m, x, logit_std=2.0)
            return m, m(x)
    m, y = vit(0)
    assert m.heads.head.weight.any()
    assert float(y.std(dim=0).mean()) == pytest.approx(2.0, rel=1e-3)
    assert len(set(y.argmax(dim=1).tolist())) > 1
    assert torch.equal(vit(0)[1], y)

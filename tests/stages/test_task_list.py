"""`doit list` shows every stage of every model and loads neither torch nor tvm."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import sys
from doit.doit_cmd import DoitMain
code = DoitMain().run(["list", "--all"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tvm", "torchvision", "torchao", "ultralytics"))
print("HEAVY=" + ",".join(heavy))
sys.exit(code)
"""


def test_list_shows_every_stage_of_every_model_without_torch_or_tvm():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout.splitlines()[-1]
    names = {line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith("HEAVY")}
    stages = ["export", "prepare", "calibrate", "convert", "relax_import", "codegen",
              "host_build", "verify", "evaluate", "profile", "visualize", "cross_compile"]
    for model in ("mobilenet_v2", "mobilenet_v2_int16", "resnet18"):
        for stage in stages:
            assert f"{stage}:{model}" in names
    assert "summary" in names


def test_skipped_model_is_marked_in_list_and_named_in_the_summary(tmp_path):
    """resnet18's weights are on no registry: without them the default run skips it."""
    env = {"TORCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # nothing printed while loading
    line = next(line for line in proc.stdout.splitlines() if line.startswith("export:resnet18 "))
    assert "skipped by default: weights not found" in line
    import os
    os.environ["TORCH_HOME"] = str(tmp_path)
    try:
        from pipeline.stages.summary import render
        from pipeline.tasks import Project
        text = render(Project(REPO / "models", artifacts_dir=tmp_path / "art").summary_payload())
    finally:
        del os.environ["TORCH_HOME"]
    skip = [line for line in text.splitlines() if line.startswith("resnet18: skipped")]
    assert len(skip) == 1 and "resnet18-f37072fd.pth" in skip[0] and str(tmp_path) in skip[0]

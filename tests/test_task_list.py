"""`doit list` shows every stage of every model and loads neither torch nor tvm."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = """
import sys
from doit.doit_cmd import DoitMain
code = DoitMain().run(["list", "--all"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tvm", "torchvision", "torchao"))
print("HEAVY=" + ",".join(heavy))
sys.exit(code)
"""


def test_list_shows_every_stage_of_every_model_without_torch_or_tvm():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout, proc.stdout.splitlines()[-1]
    names = {line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith("HEAVY")}
    stages = ["export", "prepare", "calibrate", "convert", "relax_import", "codegen",
              "host_build", "verify", "evaluate", "cross_compile"]
    for model in ("mobilenet_v2", "mobilenet_v2_int16", "resnet18"):
        for stage in stages:
            assert f"{stage}:{model}" in names
    assert "summary" in names


def test_skipped_model_is_announced_in_one_line(tmp_path):
    """resnet18's weights are on no registry: without them the default run skips it."""
    env = {"TORCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("skipping")]
    assert len(lines) == 1 and lines[0].startswith("skipping resnet18: ")
    assert "resnet18-f37072fd.pth" in lines[0] and str(tmp_path) in lines[0]

"""Build throw-away doit projects in a temp folder and run doit on them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent

DODO = '''from pipeline.tasks import load_project
globals().update(load_project("models"))
'''

TINY = '''builder = "tinynets:small_cnn"
input_shape = [1, 3, 32, 32]
dtype = "{dtype}"
preprocess = {{ resize = 36, crop = 32 }}
[weights]
pretrained = false
[calibration]
set = "{set}"
'''


def tiny_spec(folder: Path, **calibration):
    """The ModelSpec of TINY (int8, random init) with ``folder / "tiny.toml"`` as its
    source and calibration set ``s``; ``calibration``: CalibrationSpec fields."""
    from pipeline.config import CalibrationSpec, ModelSpec, PreprocessSpec, WeightsSpec
    return ModelSpec(name="tiny", source=folder / "tiny.toml", builder="tinynets:small_cnn",
                     input_shape=(1, 3, 32, 32), weights=WeightsSpec(pretrained=False),
                     preprocess=PreprocessSpec(resize=36, crop=32),
                     calibration=CalibrationSpec(set="s", **calibration), evaluation_set="s")


def write_jpeg(path: Path, seed: int, size: int = 48) -> None:
    """A real JPEG file of seeded noise (torchvision's encoder)."""
    import torch
    from torchvision.io import encode_jpeg
    g = torch.Generator().manual_seed(seed)
    img = (torch.rand(3, size, size, generator=g) * 255).to(torch.uint8)
    path.write_bytes(encode_jpeg(img, quality=90).numpy().tobytes())


@dataclass
class Run:
    executed: list[str]
    uptodate: list[str]
    returncode: int
    out: str

    def ran(self, stage: str) -> set[str]:
        """Models whose ``stage`` task executed."""
        return {t.split(":", 1)[1] for t in self.executed if t.startswith(stage + ":")}


class Project:
    """A temp project: dodo.py, models/*.toml, calib_data/<set>/*.jpg, tinynets.py."""

    def __init__(self, root: Path, copy_pipeline: bool = False):
        self.root = root
        (root / "models").mkdir(parents=True)
        (root / "dodo.py").write_text(DODO)
        shutil.copy(TESTS / "tinynets.py", root / "tinynets.py")
        if copy_pipeline:  # a private copy of the package, first on PYTHONPATH, safe to edit
            shutil.copytree(TESTS.parent / "pipeline", root / "pipeline",
                            ignore=shutil.ignore_patterns("__pycache__"))

    def add_model(self, name: str, set_name: str = "setA", dtype: str = "int8", extra: str = "") -> Path:
        p = self.root / "models" / f"{name}.toml"
        p.write_text(TINY.format(dtype=dtype, set=set_name) + extra)
        return p

    def add_images(self, set_name: str, n: int, seed0: int = 0) -> list[Path]:
        d = self.root / "calib_data" / set_name
        d.mkdir(parents=True, exist_ok=True)
        out = []
        for i in range(n):
            p = d / f"img_{seed0 + i:02d}_{(seed0 + i) % 10}.jpg"
            write_jpeg(p, seed0 + i)
            out.append(p)
        return out

    def artifact(self, model: str, name: str):
        """The JSON artifact ``artifacts/<model>/<name>``, parsed."""
        return json.loads((self.root / "artifacts" / model / name).read_text())

    def doit(self, *args: str, env: dict | None = None, timeout: int = 900) -> Run:
        e = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(self.root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        # the run-cache's signing secret: the project's own, not the user's (~/.config)
        e.setdefault("DOIT_C7X_CACHE_SECRET", str(self.root / "cache-secret"))
        e.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root, env=e,
                              capture_output=True, text=True, timeout=timeout)
        out = proc.stdout + proc.stderr
        return Run(executed=re.findall(r"^\.  (\S+)$", proc.stdout, re.M),
                   uptodate=re.findall(r"^-- (\S+)$", proc.stdout, re.M),
                   returncode=proc.returncode, out=out)


def build_through(root: Path, last: str = "codegen"):
    """Run the stage functions of the first model of the project at ``root``,
    from export through ``last``, without doit; return its StageContext."""
    from pipeline.stages.registry import STAGES
    from pipeline.tasks import Project as C7xProject

    project = C7xProject(root / "models")
    ctx = project.context(project.valid()[0])
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the project's builder module (tinynets.py)
    names = [s.name for s in STAGES]
    for stage in STAGES[:names.index(last) + 1]:
        if stage.applies(ctx):
            stage.function()(**stage.args(ctx))
    return ctx


def build_zoo(root: Path, models: tuple[str, ...], wheels: tuple[str, ...], sets: tuple[str, ...]) -> tuple:
    """``doit zoo`` in a fresh project at ``root`` holding the shipped entries ``models`` and the
    image ``sets`` (the slow zoo tests; a module fixture each). Skips when one of the zoo's
    ``wheels`` (import names) is not installed. Returns ``(project, run)``; asserts exit 0."""
    import importlib.util

    import pytest

    repo = TESTS.parent
    missing = [w for w in wheels if importlib.util.find_spec(w) is None]
    if missing:
        pytest.skip(f"the zoo's wheels are not installed ({', '.join(missing)}): bash scripts/setup.sh --zoo")
    p = Project(root)
    for m in models:
        shutil.copy(repo / "models" / f"{m}.toml", p.root / "models")
    for folder in sets:
        shutil.copytree(repo / "calib_data" / folder, p.root / "calib_data" / folder)
    run = p.doit("zoo", timeout=2400)
    assert run.returncode == 0, run.out[-4000:]
    return p, run

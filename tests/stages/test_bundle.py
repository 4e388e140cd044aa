"""The bundle stage: a self-contained folder and tarball whose example builds with gcc
outside the project and prints what the verified build computes."""

from __future__ import annotations

import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from doitproj import Project
from test_cross_compile import fake_cgt

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("make") is None,
                                reason="gcc and make build the bundle's example")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("bundle"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    run = p.doit("bundle:tiny")
    assert run.returncode == 0, run.out
    return p, p.root / "artifacts" / "tiny"


def test_the_tarball_s_example_builds_elsewhere_and_prints_the_reference_s_top5(built, tmp_path):
    from pipeline.backend.interp import run_reference

    _, art = built
    with tarfile.open(art / "tiny_bundle.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "tiny_bundle"
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in (art / "bundle").iterdir())
    done = subprocess.run(["make", "check"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "check: the example prints what the verified build printed" in done.stdout
    # expected.txt (the host build's output) is the Python integer reference's top 5, to the digit
    x = np.fromfile(folder / "input.f32", np.float32).reshape(1, 3, 32, 32)
    ref = run_reference(art / "c" / "mmalib", x)[0]
    order = sorted(range(ref.size), key=lambda j: (-ref[j], j))[:5]
    assert (folder / "output.txt").read_text().splitlines() == ["%d %.6g" % (j, ref[j]) for j in order]
    # another file as weights.bin: one line that says what is wrong, not only "error -2"
    (folder / "other.bin").write_bytes((folder / "weights.bin").read_bytes()[:-64] + bytes(64))
    bad = subprocess.run(["./example", "other.bin", "input.f32"], cwd=folder, capture_output=True, text=True)
    assert bad.returncode == 3 and bad.stderr.strip().count("\n") == 0
    assert "error -2: weights file is not this build's weights.bin" in bad.stderr, bad.stderr


def test_make_c7x_runs_ti_s_flags_on_every_source(built, tmp_path):
    _, art = built
    folder = tmp_path / "b"
    shutil.copytree(art / "bundle", folder)
    cgt = fake_cgt(tmp_path)
    done = subprocess.run(["make", "c7x", f"TI_CGT_C7000_PATH={cgt}"], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    compiled = [c for c in calls if c.startswith("cl7x ")]
    assert [c.split()[-1] for c in compiled] == ["model.c", "tvm_kernels.c", "c7x_kernels_ref.c"]
    assert all("-mv7524" in c and "--c99" in c and "-O3" in c for c in compiled)
    assert calls[-1].startswith("ar7x rq libmodel.a model.obj")
    missing = subprocess.run(["make", "c7x", "TI_CGT_C7000_PATH="], cwd=folder, capture_output=True, text=True)
    assert missing.returncode != 0 and "set TI_CGT_C7000_PATH" in missing.stdout


def test_the_tarball_is_byte_stable(built, tmp_path):
    from pipeline.stages.bundle import bundle_model
    from pipeline.tasks import Project as C7xProject

    p, art = built
    project = C7xProject(p.root / "models")
    ctx = project.context(project.valid()[0])
    first = (art / "tiny_bundle.tar.gz").read_bytes()
    bundle_model(ctx.spec, art / "c" / "mmalib", art / "host" / "mmalib.exe", ctx.evaluation_images[0],
                 tmp_path / "again", tmp_path / "again.tar.gz")
    assert (tmp_path / "again.tar.gz").read_bytes() == first

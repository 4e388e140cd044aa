"""``python -m pipeline.predict``: a built model's host C on the user's images, and its refusals."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from doitproj import Project, write_jpeg


def _predict(p: Project, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(p.root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pipeline.predict", *args], cwd=p.root, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny classifier built through host_build, a second entry never built, two photos."""
    p = Project(tmp_path_factory.mktemp("predict"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    p.add_model("unbuilt", "setA")
    run = p.doit("host_build:tiny")
    assert run.returncode == 0, run.out
    photos = p.root / "photos"
    photos.mkdir()
    for i in range(2):
        write_jpeg(photos / f"p{i}.jpg", seed=40 + i, size=64)
    return p, photos


def test_prints_the_top_labels_of_the_deployed_c_and_saves_the_pictures(built):
    from pipeline.backend.interp import run_reference
    from pipeline.config import PreprocessSpec
    from pipeline.data.images import load_image, make_transform

    p, photos = built
    done = _predict(p, "tiny", str(photos), "--top", "3", "--save", str(p.root / "shown"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiny [mmalib]: 2 image(s), host C ") and "not C7x cycles" in lines[0]
    # the printed top-1 is the Python integer reference's on the same preprocessed image
    transform = make_transform(PreprocessSpec(resize=36, crop=32))
    x = np.stack([load_image(photos / f"p{i}.jpg", transform).numpy() for i in range(2)])
    ref = run_reference(p.root / "artifacts" / "tiny" / "c" / "mmalib", x)
    for i in range(2):
        at = lines.index(f"{photos / f'p{i}.jpg'}:")
        top = lines[at + 1:at + 4]
        assert len(top) == 3 and all(t.startswith("  0.") or t.startswith("  1.") for t in top)
        assert top[0].endswith(f"class {int(np.argmax(ref[i]))}"), (top, ref[i])
        assert lines[at + 4] == f"  saved {p.root / 'shown' / f'p{i}.jpg'}"
        assert (p.root / "shown" / f"p{i}.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


@pytest.mark.parametrize("args, needle", [
    (["nosuch", "photos"], "no model 'nosuch' in "),
    (["unbuilt", "photos"], "model 'unbuilt' is not built yet: run .venv/bin/doit host_build:unbuilt"),
    (["tiny", "photos/none.jpg"], "photos/none.jpg: no such file or folder"),
    (["tiny", "bad.jpg"], "bad.jpg: not a readable JPEG/PNG image"),
])
def test_refuses_in_one_line(built, args, needle):
    p, _ = built
    (p.root / "bad.jpg").write_bytes(b"\xff\xd8\xff not a jpeg at all")
    done = _predict(p, *args)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and needle in done.stderr, done.stderr


def test_a_build_older_than_its_inputs_is_refused(built):
    p, photos = built
    entry = p.root / "models" / "tiny.toml"
    text = entry.read_text()
    entry.write_text(text.replace('set = "setA"', 'set = "setA"\nobserver = "minmax"'))
    try:
        done = _predict(p, "tiny", str(photos))
    finally:
        entry.write_text(text)
    assert done.returncode == 2 and "the build on disk is older than its inputs (stale: calibrate" in done.stderr
    assert "run .venv/bin/doit host_build:tiny first" in done.stderr
    assert _predict(p, "tiny", str(photos)).returncode == 0  # the entry restored, the build matches again

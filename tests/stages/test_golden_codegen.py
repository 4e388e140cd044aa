"""Refactors keep behaviour: the generated C, ``weights.bin`` and the task list
of a small project are byte-identical to the recorded golden digests.

``tests/stages/golden/`` was recorded before the stage-registry refactor (issue 8).
A deliberate change to codegen output or to the task list re-records it with
``C7X_RECORD_GOLDEN=1 pytest tests/stages/test_golden_codegen.py`` and says why in
the commit.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from doitproj import Project

GOLDEN = Path(__file__).parent / "golden"
MODELS = {"tiny8": "int8", "tiny16": "int16"}


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("golden"))
    p.add_images("setA", 3, seed0=0)
    for name, dtype in MODELS.items():
        p.add_model(name, "setA", dtype=dtype)
    run = p.doit(*[f"codegen:{m}" for m in MODELS])
    assert run.returncode == 0, run.out
    return p


def _digests(root: Path) -> dict[str, str]:
    out = {}
    for model in MODELS:
        cdir = root / "artifacts" / model / "c"
        for f in sorted(cdir.rglob("*")):
            if f.is_file():
                out[str(f.relative_to(root / "artifacts"))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _check(name: str, actual):
    path = GOLDEN / name
    if os.environ.get("C7X_RECORD_GOLDEN"):
        path.write_text(json.dumps(actual, indent=1, sort_keys=True) + "\n")
    expected = json.loads(path.read_text())
    assert actual == expected


def test_generated_c_and_weights_are_byte_identical(proj):
    digests = _digests(proj.root)
    assert any(k.endswith("mmalib/weights.bin") for k in digests)
    assert any(k.endswith("scalar/model.c") for k in digests)
    _check("codegen_sha256.json", digests)


def test_task_list_is_unchanged(proj):
    run = proj.doit("list", "--all")
    assert run.returncode == 0, run.out
    lines = [ln.rstrip() for ln in run.out.splitlines() if ln.strip()]
    assert any(ln.startswith("codegen:tiny8") for ln in lines)
    _check("task_list.json", lines)

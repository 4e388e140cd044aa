"""Relocatable, authenticated, hand-edit-proof artifacts (issue 27): a clone of a
project at another path restores every stage from a shared run-cache; no
artifact holds the machine's paths; every model-entry field an output records is
in its stage's key; an output edited by hand makes its stage stale; a cache
entry tampered with by someone without the secret never runs code."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from doitproj import Project
from pipeline.config import ModelSpec
from pipeline.stages.registry import STAGES
from pipeline.tasks import Project as C7xProject

DEFAULT = ("export", "prepare", "calibrate", "convert", "relax_import", "codegen", "host_build",
           "evaluate", "verify")


def _restored(run) -> list[str]:
    m = re.search(r"run-cache: restored \d+ stages? of tiny without running (?:them|it) \(([^)]*)\)", run.out)
    return m.group(1).split(", ") if m else []


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".stamps" not in p.parts and "logs" not in p.parts}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(first project, shared cache, environment): tiny built through its default run."""
    base = tmp_path_factory.mktemp("reloc")
    env = {"DOIT_C7X_CACHE": str(base / "shared-cache"), "DOIT_C7X_CACHE_SECRET": str(base / "team-secret")}
    p = Project(base / "first")
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    run = p.doit(env=env)
    assert run.returncode == 0, run.out
    return p, env


def test_no_artifact_holds_the_projects_path_or_the_environments(built):
    p, _ = built
    needles = [str(p.root).encode(), str(Path(sys.prefix).resolve()).encode()]
    for rel, data in _tree(p.root / "artifacts" / "tiny").items():
        for needle in needles:
            assert needle not in data, f"{rel} holds {needle.decode()}"


def test_a_clone_at_another_path_restores_every_stage(built, tmp_path):
    p, env = built
    clone = tmp_path / "elsewhere" / "clone"
    shutil.copytree(p.root, clone, ignore=shutil.ignore_patterns("artifacts", "__pycache__"))
    q = Project.__new__(Project)
    q.root = clone
    run = q.doit(env=env)
    assert run.returncode == 0, run.out
    ran = {t.split(":")[0] for t in run.executed if t.endswith(":tiny")}
    assert set(DEFAULT) <= ran and sorted(_restored(run)) == sorted(ran), run.out  # nothing ran: all restored
    assert _tree(clone / "artifacts" / "tiny") == _tree(p.root / "artifacts" / "tiny")
    again = q.doit(env=env)
    assert again.executed == [], again.out


def _spec_fields(spec: ModelSpec) -> dict[str, object]:
    """Model-entry values an output might record, by the name outputs use."""
    d = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    d["model"] = spec.name
    d["weight_dtype"] = spec.quantizer.weight_dtype or "int8"
    return d


def _plain(value):
    """A model-entry value as JSON would record it."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str))


def _tracked(stage, field: str) -> bool:
    path = {"model": "name", "weight_dtype": "quantizer.weight_dtype"}.get(field, field)
    if path == "name" and not stage.shared:
        return True  # the model name is in the key of every stage but the shared ones
    return any(p == path or p.startswith(path + ".") or path.startswith(p + ".") for p in stage.params)


def test_every_entry_field_an_output_records_is_in_its_stages_key(built):
    """An output that records a model-entry value (report.json's dtype) must re-run
    when that value changes, or a cache restore could bring back another build's."""
    p, _ = built
    project = C7xProject(p.root / "models")
    ctx = project.context(project.valid()[0])
    fields = _spec_fields(ctx.spec)
    checked, missing = 0, []
    for stage in STAGES:
        if not stage.applies(ctx):
            continue
        inputs = {}
        for dep in stage.deps(ctx):
            if Path(dep).suffix == ".json" and Path(dep).is_file():
                inputs.update(json.loads(Path(dep).read_text()))
        for out in stage.outs(ctx):
            if Path(out).suffix != ".json" or not Path(out).is_file():
                continue
            record = json.loads(Path(out).read_text())
            for key in set(record) & set(fields):
                if _plain(fields[key]) != record[key]:
                    continue  # another meaning of the word (calibration.json's "source")
                if key in inputs and inputs[key] == record[key]:
                    continue  # copied from an input file, whose hash is in the key
                checked += 1
                if not _tracked(stage, key):
                    missing.append(f"{stage.name}: {Path(out).name} records {key!r}, not in its key")
    assert missing == []
    assert checked >= 3  # report.json's model, dtype, weight_dtype at least


def test_an_output_edited_by_hand_makes_its_stage_stale(built):
    p, env = built
    report = p.root / "artifacts" / "tiny" / "report.json"
    good = report.read_bytes()
    report.write_text(report.read_text().replace('"dtype": "int8"', '"dtype": "int16"'))
    run = p.doit("evaluate:tiny", env=env)
    assert run.returncode == 0, run.out
    assert run.executed == ["evaluate:tiny"] or _restored(run) == ["evaluate"], run.out
    assert report.read_bytes() == good


def test_a_tampered_cache_entry_runs_no_code_and_is_not_restored(built, tmp_path):
    """Whoever can write to the shared cache, without the secret, plants a pickle
    in float.pt2 and Python in relax/module.py (both files and hashes replaced)."""
    p, env = built
    from pipeline.runcache import _sha256
    marker = tmp_path / "planted-code-ran"
    payload = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('x')\n"
    cache = Path(env["DOIT_C7X_CACHE"])
    tampered = 0
    for info in cache.glob("entries/*/*/entry.json"):
        rec = json.loads(info.read_text())
        for rel in rec["files"]:
            f = info.parent / "files" / rel
            if rel.endswith(".py"):
                f.write_text(payload + f.read_text())
            elif rel.endswith((".pt2", ".pt")):
                import pickle
                class Boom:
                    def __reduce__(self):
                        return (exec, (payload,))
                f.write_bytes(pickle.dumps(Boom()))
            elif rel.endswith(".json"):
                f.write_text(f.read_text().replace("tiny", "evil"))
            elif rel.endswith(".exe"):
                f.write_text(f"#!/bin/sh\ntouch {marker}\n")  # verify would run it
            else:  # C sources, weights.bin, params.bin, npz...: other bytes
                f.write_bytes(f.read_bytes() + b"planted")
            rec["files"][rel][:2] = [f.stat().st_size, _sha256(f)]
            tampered += 1
        info.write_text(json.dumps(rec))
    assert tampered >= 20  # every file of every entry
    clone = tmp_path / "clone"
    shutil.copytree(p.root, clone, ignore=shutil.ignore_patterns("artifacts", "__pycache__"))
    q = Project.__new__(Project)
    q.root = clone
    run = q.doit(env=env)
    assert run.returncode == 0, run.out
    assert not marker.exists()
    assert _restored(run) == [], run.out
    assert "is not signed with this cache's secret" in run.out
    report = json.loads((clone / "artifacts" / "tiny" / "report.json").read_text())
    assert report["model"] == "tiny"


def test_a_key_holders_code_never_runs_but_their_data_stages_restore(built, tmp_path, monkeypatch):
    """Issue 48: a colleague who holds the secret signs entries whose code-bearing files carry
    payloads (Python in TVMScript, a pickle in the .pt2 archives, a constructor in model.c, a
    script as the executable). Their files are not yours (others may write them; as root,
    another account owns them): no code from them comes back, the stages that make code run
    here, and the data stages (calibration ...) still restore."""
    p, env = built
    from pipeline.runcache import _sha256, _signature, carries_code, load_secret
    cache = tmp_path / "team-cache"
    shutil.copytree(env["DOIT_C7X_CACHE"], cache, symlinks=True)
    monkeypatch.setenv("DOIT_C7X_CACHE_SECRET", env["DOIT_C7X_CACHE_SECRET"])   # the team's secret
    secret = load_secret(cache)
    marker = tmp_path / "planted-code-ran"
    payload = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('x')\n"
    planted = 0
    for info in cache.glob("entries/*/*/entry.json"):
        rec = json.loads(info.read_text())
        for rel, (_, _, x) in rec["files"].items():
            f = info.parent / "files" / rel
            if not carries_code(rel, x):
                continue
            if rel.endswith(".py"):
                f.write_text(payload + f.read_text())
            elif rel.endswith(".pt2"):
                import pickle
                class Boom:
                    def __reduce__(self):
                        return (exec, (payload,))
                f.write_bytes(pickle.dumps(Boom()))
            elif rel.endswith(".c"):
                f.write_text(f'#include <stdlib.h>\n__attribute__((constructor)) static void planted(void)'
                             f'{{ system("touch {marker}"); }}\n' + f.read_text())
            elif x:
                f.write_text(f"#!/bin/sh\ntouch {marker}\n")
            rec["files"][rel][:2] = [f.stat().st_size, _sha256(f)]
            f.chmod(0o777 if x else 0o666)       # a file you cannot vouch for
            if hasattr(os, "chown") and os.getuid() == 0:
                os.chown(f, 4242, 4242)          # a colleague's account
            planted += 1
        rec["hmac"] = _signature(secret, info.parent.name, rec["files"], rec["meta"])   # signed: a key holder
        info.write_text(json.dumps(rec))
    assert planted >= 8
    clone = tmp_path / "clone"
    shutil.copytree(p.root, clone, ignore=shutil.ignore_patterns("artifacts", "__pycache__"))
    q = Project.__new__(Project)
    q.root = clone
    run = q.doit(env={**env, "DOIT_C7X_CACHE": str(cache)})
    assert run.returncode == 0, run.out
    assert not marker.exists(), run.out
    restored = _restored(run)
    assert "calibrate" in restored and not {"export", "convert", "relax_import", "codegen", "host_build"} & set(restored), \
        [line for line in run.out.splitlines() if "run-cache" in line]
    assert "holds code" in run.out and "that you did not store yourself" in run.out

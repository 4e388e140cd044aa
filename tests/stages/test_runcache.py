"""The run-cache (pipeline/runcache.py, issue 12): hit, miss, sharing between
variants, corrupted entries, pruning; first on plain files, then through doit
on a tiny project (int8 -> int16 -> int8 restores every stage it ran)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from doitproj import Project
from pipeline import runcache
from pipeline.runcache import RunCache, parse_size, stage_key

# ----------------------------------------------------------------------------- plain files

SECRET = b"0123456789abcdef0123456789abcdef"


def _outputs(base: Path, text: str) -> list[str]:
    (base / "sub").mkdir(parents=True, exist_ok=True)
    (base / "a.bin").write_bytes(text.encode() * 1000)
    (base / "sub" / "b.json").write_text(json.dumps({"v": text}))
    return ["a.bin", "sub/b.json"]


def test_store_then_restore_gives_the_same_bytes(tmp_path):
    rc = RunCache(tmp_path / "cache", SECRET)
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("calibrate", "m1", "cfg", ["d1"], outs)
    assert not rc.restore(key, tmp_path / "m2", outs)  # miss: nothing stored yet
    assert rc.store(key, tmp_path / "m1", outs, {"stage": "calibrate"})
    assert not rc.store(key, tmp_path / "m1", outs, {})  # one entry per key
    assert rc.restore(key, tmp_path / "m2", outs)
    for rel in outs:
        assert (tmp_path / "m2" / rel).read_bytes() == (tmp_path / "m1" / rel).read_bytes()
    assert rc.size()[0] == 1
    assert rc.restore(key, tmp_path / "m2", outs)  # again, onto its own copies
    assert sorted(p.name for p in (tmp_path / "m2").rglob("*")) == ["a.bin", "b.json", "sub"]  # no temporaries
    # plain files, not links into the cache: editing one leaves the entry as it was
    assert (tmp_path / "m2" / "a.bin").stat().st_nlink == 1 and (tmp_path / "m1" / "a.bin").stat().st_nlink == 1
    (tmp_path / "m2" / "a.bin").write_bytes(b"edited")
    assert (rc.entry(key) / "files" / "a.bin").read_bytes() == (tmp_path / "m1" / "a.bin").read_bytes()


def test_concurrent_writers_of_one_key_leave_one_whole_entry(tmp_path):
    from concurrent.futures import ProcessPoolExecutor
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("s", "m", "c", [], outs)
    with ProcessPoolExecutor(4) as pool:
        won = list(pool.map(_store_once, [(tmp_path, key, outs)] * 8))
    rc = RunCache(tmp_path / "cache", SECRET)
    assert sum(won) == 1 and rc.size()[0] == 1  # rename() onto a whole entry fails for the others
    assert not list((tmp_path / "cache" / "tmp").iterdir())  # losers cleaned up
    assert rc.restore(key, tmp_path / "m2", outs)


def _store_once(job) -> bool:
    tmp_path, key, outs = job
    return RunCache(tmp_path / "cache", SECRET).store(key, tmp_path / "m1", outs, {})


def test_key_changes_with_every_input():
    base = dict(stage="calibrate", model="m", config_digest="c", dep_md5s=["1", "2"], outs=["x"])
    keys = {stage_key(**base)}
    for change in ({"stage": "convert"}, {"model": "n"}, {"model": None}, {"config_digest": "d"},
                   {"dep_md5s": ["2", "1"]}, {"outs": ["y"]}):
        keys.add(stage_key(**{**base, **change}))
    assert len(keys) == 7


def test_corrupted_entry_is_ignored_and_removed(tmp_path):
    rc = RunCache(tmp_path / "cache", SECRET)
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("s", "m", "c", [], outs)
    rc.store(key, tmp_path / "m1", outs, {})
    cached = rc.entry(key) / "files" / "a.bin"
    cached.write_bytes(b"x" * 3000)  # same size, other bytes: only the hash can tell
    target = tmp_path / "m2"
    assert not rc.restore(key, target, outs)
    assert not (target / "a.bin").exists()  # nothing half-restored
    assert not rc.entry(key).exists()


def _forge(rc: RunCache, key: str, rel: str, data: bytes, sign_with: bytes | None = None) -> None:
    """What someone who can write to the cache but lacks its secret can do: replace a
    file and rewrite entry.json to match (re-signed with ``sign_with`` if given)."""
    from pipeline.runcache import _sha256, _signature
    entry = rc.entry(key)
    (entry / "files" / rel).write_bytes(data)
    rec = json.loads((entry / "entry.json").read_text())
    rec["files"][rel][:2] = [len(data), _sha256(entry / "files" / rel)]
    rec["hmac"] = _signature(sign_with, key, rec["files"], rec["meta"]) if sign_with else "0" * 64
    (entry / "entry.json").write_text(json.dumps(rec))


@pytest.mark.parametrize("sign_with", [None, b"another team's secret, 32 bytes."])
def test_an_entry_rewritten_without_the_secret_is_ignored(tmp_path, capsys, sign_with):
    rc = RunCache(tmp_path / "cache", SECRET)
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("s", "m", "c", [], outs)
    rc.store(key, tmp_path / "m1", outs, {"stage": "s"})
    _forge(rc, key, "a.bin", b"planted", sign_with)
    assert not rc.restore(key, tmp_path / "m2", outs)
    assert not (tmp_path / "m2").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not signed with this cache's secret" in err[0]
    assert rc.entry(key).exists()  # not ours to delete: it may be a colleague's with another secret


def test_executables_come_back_only_from_a_cache_the_user_alone_can_write(tmp_path, capsys):
    base = tmp_path / "m1"
    base.mkdir()
    (base / "model.exe").write_bytes(b"\x7fELF...")
    (base / "model.exe").chmod(0o755)
    rc = RunCache(tmp_path / "cache", SECRET)
    key = stage_key("host_build", "m", "c", [], ["model.exe"])
    rc.store(key, base, ["model.exe"], {})
    assert rc.restore(key, tmp_path / "m2", ["model.exe"])
    assert os.access(tmp_path / "m2" / "model.exe", os.X_OK)
    exe = rc.entry(key) / "files" / "model.exe"
    exe.chmod(0o775)  # others could have rewritten it
    assert not rc.restore(key, tmp_path / "m3", ["model.exe"])
    assert not (tmp_path / "m3").exists()
    assert "holds code (model.exe) that you did not store yourself" in capsys.readouterr().err
    exe.chmod(0o755)
    if os.getuid() == 0:  # root can hand the file to another account, as a colleague's would be
        os.chown(exe, 4242, 4242)
        assert not rc.restore(key, tmp_path / "m4", ["model.exe"])


def test_the_secret_is_made_once_outside_the_cache_and_refused_inside(tmp_path, monkeypatch):
    monkeypatch.setenv(runcache.SECRET_ENV, str(tmp_path / "keys" / "secret"))
    first = runcache.load_secret(tmp_path / "cache")
    assert len(first) == 64 and runcache.load_secret(tmp_path / "cache") == first
    assert (tmp_path / "keys" / "secret").stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(runcache.SECRET_ENV, str(tmp_path / "cache" / "secret"))
    with pytest.raises(runcache.CacheSecretError, match="inside the cache folder"):
        runcache.load_secret(tmp_path / "cache")


def test_a_secret_others_can_read_or_that_is_hard_linked_is_refused(tmp_path, monkeypatch):
    secret = tmp_path / "keys" / "secret"
    monkeypatch.setenv(runcache.SECRET_ENV, str(secret))
    runcache.load_secret(tmp_path / "cache")
    secret.chmod(0o644)
    with pytest.raises(runcache.CacheSecretError, match=r"read or written by others \(mode 644\); chmod 600"):
        runcache.load_secret(tmp_path / "cache")
    secret.chmod(0o600)
    (tmp_path / "cache").mkdir()
    os.link(secret, tmp_path / "cache" / "planted")   # a hard link into the cache: the path check passes
    with pytest.raises(runcache.CacheSecretError, match="2 hard links"):
        runcache.load_secret(tmp_path / "cache")


def test_restore_of_an_entry_with_other_files_is_a_miss(tmp_path):
    rc = RunCache(tmp_path / "cache", SECRET)
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("s", "m", "c", [], outs)
    rc.store(key, tmp_path / "m1", outs, {})
    assert not rc.restore(key, tmp_path / "m2", outs[:1])


def test_prune_removes_least_recently_used_first(tmp_path):
    rc = RunCache(tmp_path / "cache", SECRET)
    keys = []
    for i, text in enumerate(("old", "mid", "new")):
        outs = _outputs(tmp_path / text, text)
        keys.append(stage_key("s", text, "c", [], outs))
        rc.store(keys[-1], tmp_path / text, outs, {})
        os.utime(rc.entry(keys[-1]) / "entry.json", (1000 + i, 1000 + i))
    os.utime(rc.entry(keys[0]) / "entry.json", (2000, 2000))  # "old" was just restored
    sizes = {e.name: size for e, _, size in rc.entries()}
    removed, freed = rc.prune(sizes[keys[0]] + sizes[keys[2]])
    assert (removed, freed) == (1, sizes[keys[1]])
    assert not rc.entry(keys[1]).exists() and rc.entry(keys[0]).exists() and rc.entry(keys[2]).exists()
    assert rc.prune(0)[0] == 2 and rc.size() == (0, 0)


def test_sizes_parse_and_bad_ones_say_so():
    assert parse_size("20G") == 20 << 30 and parse_size("500m") == 500 << 20 and parse_size("1024") == 1024
    assert parse_size("1.5GiB") == 3 << 29
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(runcache.CACHE_ENV, raising=False)
    assert runcache.cache_root(tmp_path) == tmp_path / ".cache"
    monkeypatch.setenv(runcache.CACHE_ENV, str(tmp_path / "shared"))
    assert runcache.cache_root(tmp_path / "x") == tmp_path / "shared"
    monkeypatch.setenv(runcache.CACHE_ENV, "off")
    assert runcache.cache_root(tmp_path) is None


# ----------------------------------------------------------------------------- through doit

STAGES = ("export", "prepare", "calibrate", "convert", "relax_import", "codegen", "host_build")
LAST = "host_build:tiny"


def _tree(d: Path) -> dict[str, bytes]:
    """Every artifact file of a model, minus stamps and logs (they record times)."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and ".stamps" not in p.parts and "logs" not in p.parts}


def _restored(run) -> list[str]:
    m = re.search(r"run-cache: restored \d+ stages? of tiny without running (?:them|it) \(([^)]*)\)", run.out)
    return m.group(1).split(", ") if m else []


@pytest.fixture(scope="module")
def proj(tmp_path_factory):
    p = Project(tmp_path_factory.mktemp("runcache"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    run = p.doit(LAST)
    assert run.returncode == 0, run.out
    assert _restored(run) == []
    return p


def test_switching_back_restores_every_stage_without_running_it(proj):
    art = proj.root / "artifacts" / "tiny"
    int8 = _tree(art)
    model = proj.root / "models" / "tiny.toml"
    model.write_text(model.read_text().replace('dtype = "int8"', 'dtype = "int16"'))
    run16 = proj.doit(LAST)
    assert run16.returncode == 0, run16.out
    assert _restored(run16) == [] and run16.ran("calibrate") == {"tiny"}  # a miss runs the stage
    model.write_text(model.read_text().replace('dtype = "int16"', 'dtype = "int8"'))
    back = proj.doit(LAST)
    assert back.returncode == 0, back.out
    assert _restored(back) == list(STAGES[1:])  # export was never stale
    assert "calibrate tiny:" not in back.out  # the stage's own line: it did not run
    assert _tree(art) == int8
    again = proj.doit(LAST)
    assert again.executed == [], again.out


def test_a_variant_with_the_same_upstream_inputs_shares_the_export(proj):
    proj.add_model("tiny16", "setA", dtype="int16")
    run = proj.doit("export:tiny16")
    assert run.returncode == 0, run.out
    assert "run-cache: restored 1 stage of tiny16 without running it (export)" in run.out
    a, b = proj.root / "artifacts" / "tiny", proj.root / "artifacts" / "tiny16"
    assert (a / "float.pt2").read_bytes() == (b / "float.pt2").read_bytes()
    assert (a / "export.json").read_bytes() == (b / "export.json").read_bytes()
    (proj.root / "models" / "tiny16.toml").unlink()


def test_a_corrupted_entry_is_not_restored_and_the_stage_runs(proj):
    art = proj.root / "artifacts" / "tiny"
    good = (art / "calibrated.pt").read_bytes()
    rc = RunCache(proj.root / "artifacts" / ".cache", (proj.root / "cache-secret").read_bytes().strip())
    # every calibrate entry holding these bytes (the int16 run may have made the same file)
    entries = [e for e, _, _ in rc.entries() if json.loads((e / "entry.json").read_text())["meta"]["stage"] == "calibrate"
               and (e / "files" / "calibrated.pt").read_bytes() == good]
    assert entries
    for entry in entries:
        cached = entry / "files" / "calibrated.pt"
        cached.write_bytes(good[:-8] + b"\0" * 8)
    (art / "calibrated.pt").unlink()
    run = proj.doit(LAST)
    assert run.returncode == 0, run.out
    assert "is corrupted (calibrated.pt); ignoring it" in run.out
    assert "calibrate" not in _restored(run) and "calibrate tiny:" in run.out
    assert (art / "calibrated.pt").read_bytes() == good


def test_cache_task_shows_the_size_and_prunes(proj):
    run = proj.doit("cache")
    assert run.returncode == 0, run.out
    n = int(re.search(r"run-cache: \S+: (\d+) entries", run.out).group(1))
    assert n >= len(STAGES)
    pruned = proj.doit("cache", "--max-size", "0")
    assert f"pruned {n} entries" in pruned.out and ": 0 entries, 0 B" in pruned.out
    bad = proj.doit("cache", "--max-size", "lots")
    assert bad.returncode != 0 and "cache: --max-size: 'lots' is not a size" in bad.out


def test_cache_off_runs_the_stages(proj):
    model = proj.root / "models" / "tiny.toml"
    model.write_text(model.read_text().replace('dtype = "int8"', 'dtype = "int16"'))
    run = proj.doit(LAST, env={runcache.CACHE_ENV: "off"})
    assert run.returncode == 0, run.out
    assert run.ran("calibrate") == {"tiny"} and _restored(run) == []
    assert not list((proj.root / "artifacts" / ".cache").glob("entries/*/*"))  # pruned above, nothing stored


# ----------------------------------------------------------------------------- entries that try to stop a build


def _deep(entry: Path) -> None:
    (entry / "entry.json").write_text("[" * 200_000 + "]" * 200_000)


def _non_ascii_hmac(entry: Path) -> None:
    rec = json.loads((entry / "entry.json").read_text())
    rec["hmac"] = "\u00e9" * 64
    (entry / "entry.json").write_text(json.dumps(rec))


def _fifo_record(entry: Path) -> None:
    (entry / "entry.json").unlink()
    os.mkfifo(entry / "entry.json")


def _fifo_file(entry: Path) -> None:
    (entry / "files" / "a.bin").unlink()
    os.mkfifo(entry / "files" / "a.bin")


def _dev_zero(entry: Path) -> None:
    (entry / "files" / "a.bin").unlink()
    (entry / "files" / "a.bin").symlink_to("/dev/zero")


def _linked_record(entry: Path) -> None:
    (entry / "elsewhere.json").write_text((entry / "entry.json").read_text())
    (entry / "entry.json").unlink()
    (entry / "entry.json").symlink_to(entry / "elsewhere.json")


def _huge_record(entry: Path) -> None:
    (entry / "entry.json").write_text(" " * (runcache.MAX_RECORD_BYTES + 1) + "{}")


def _escaping_path(entry: Path) -> None:
    rec = json.loads((entry / "entry.json").read_text())
    rec["files"]["../../../../evil"] = rec["files"].pop("a.bin")
    (entry / "entry.json").write_text(json.dumps(rec))


@pytest.mark.parametrize("plant", [_deep, _non_ascii_hmac, _fifo_record, _fifo_file, _dev_zero, _linked_record,
                                   _huge_record, _escaping_path])
def test_a_planted_entry_is_ignored_in_one_line_and_the_next_store_replaces_it(tmp_path, capsys, plant):
    """Issue 48's cache DoS: anyone who can write the cache folder, without the secret. Each
    restore must return (no hang, no flood, no exception), print one line naming the entry,
    restore nothing; the stage then runs and its store replaces the planted entry."""
    import signal

    rc = RunCache(tmp_path / "cache", SECRET)
    outs = _outputs(tmp_path / "m1", "one")
    key = stage_key("s", "m", "c", [], outs)
    rc.store(key, tmp_path / "m1", outs, {"stage": "s"})
    plant(rc.entry(key))
    capsys.readouterr()
    signal.alarm(20)   # a FIFO that blocks would hang here: the alarm fails the test instead
    try:
        assert not rc.restore(key, tmp_path / "m2", outs)
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"entry {key[:12]}" in err[0], err
    assert not (tmp_path / "m2" / "a.bin").exists() and not (tmp_path / "evil").exists()
    assert rc.store(key, tmp_path / "m1", outs, {"stage": "s"})   # the planted entry does not block ours
    assert rc.restore(key, tmp_path / "m3", outs)
    assert (tmp_path / "m3" / "a.bin").read_bytes() == (tmp_path / "m1" / "a.bin").read_bytes()


def test_record_parser_types_every_field():
    good = {"files": {"a.bin": [3, "0" * 64, False]}, "meta": {}, "hmac": "f" * 64}
    assert runcache.parse_record(json.dumps(good).encode())["files"] == good["files"]
    for bad in ({**good, "hmac": 5}, {**good, "files": {"a.bin": ["3", "0" * 64, False]}},
                {**good, "files": {"a.bin": [3, "0" * 64, 1]}}, {**good, "files": {"/etc/passwd": [3, "0" * 64, False]}},
                {**good, "meta": []}, [good]):
        with pytest.raises(ValueError):
            runcache.parse_record(json.dumps(bad).encode())


@pytest.mark.parametrize("rel, code", [("model.c", True), ("c/mmalib/lowered.py", True), ("float.pt2", True),
                                       ("offload.html", True), ("bundle/Makefile", True), ("host/m.exe", True),
                                       ("calibration.json", False), ("calibrated.pt", False),
                                       ("c/mmalib/weights.bin", False), ("detections/a_float.jpg", False)])
def test_code_is_restored_only_from_an_entry_you_wrote(tmp_path, capsys, rel, code):
    """Issue 48: a colleague holding the secret could get code run (a signed model.c with a
    constructor, a pt2 with a pickle, TVMScript). Code comes back only from your own entries;
    a colleague's data still restores. "Someone else's" is simulated by a file others could
    have written (and, as root, by handing it to another account)."""
    from pipeline.runcache import carries_code
    assert carries_code(rel, rel.endswith(".exe")) == code
    base = tmp_path / "m1"
    (base / rel).parent.mkdir(parents=True, exist_ok=True)
    (base / rel).write_bytes(b"payload")
    rc = RunCache(tmp_path / "cache", SECRET)
    key = stage_key("s", "m", "c", [], [rel])
    assert rc.store(key, base, [rel], {})
    stored = rc.entry(key) / "files" / rel
    assert rc.restore(key, tmp_path / "mine", [rel])          # your own entry: everything comes back
    stored.chmod(0o666)
    if os.getuid() == 0:
        os.chown(stored, 4242, 4242)
    capsys.readouterr()
    assert rc.restore(key, tmp_path / "theirs", [rel]) == (not code)
    err = capsys.readouterr().err
    assert ("holds code" in err) == code and (tmp_path / "theirs" / rel).exists() == (not code)

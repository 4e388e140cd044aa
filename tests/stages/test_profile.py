"""Per-layer profile (issue 9, item 3; TI's ``-profile-layers``).

- the switch ``-D<M>_PROFILE_LAYERS`` costs nothing when off: model.c without
  the define compiles to the same object bytes as model.c with the profiling
  text removed (``strip_profile``, a purely textual rule: every ``#if`` block
  on ``<M>_PROFILE_LAYERS`` and every ``<M>_PROFILE_*();`` hook line), at -O0
  and -O2; both ways compile clean with -Wall -Wextra -Wpedantic -Werror, and
  the C7x branch (``__C7000__``) reads ``__TSC``;
- on, the host build prints one parseable block per image, one line per
  manifest call, and computes the same outputs;
- the parser round-trips, finds several blocks in log noise, and fails in one
  line naming the file;
- the stage writes profile.json from host time, or from a board log for the
  MMALIB build (last block = steady state), and a bad board log fails in one
  line; with doit, adding / editing / removing the board log re-runs only
  ``profile``.

A tiny net goes through the stage functions (no doit) except in the doit test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from doitproj import Project

from pipeline.backend.host import CFLAGS, build_host, model_info, profile_flags, run_host, run_host_timed
from pipeline.backend.profile_block import (HEADER, ProfileBlock, ProfileLogError, format_block, match_calls,
                                            parse_blocks, read_blocks)
from pipeline.perf.measured import board_label
from pipeline.stages.profile import HOST_LABEL, profile_model
from pipeline.stages.registry import STAGES, get
from pipeline.tasks import Project as C7xProject

GCC = shutil.which("gcc")
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Wpedantic", "-Werror"]  # as tests/backend/c_check.py
pytestmark = pytest.mark.skipif(GCC is None, reason="needs gcc")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny int8 model through host_build (both builds) via the stage functions."""
    p = Project(tmp_path_factory.mktemp("profile"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    project = C7xProject(p.root / "models")
    ctx = project.context(project.valid()[0])
    sys.path.insert(0, str(p.root))
    try:
        for stage in STAGES[:[s.name for s in STAGES].index("host_build") + 1]:
            if stage.applies(ctx):
                stage.function()(**stage.args(ctx))
    finally:
        sys.path.remove(str(p.root))
    return ctx


def manifest(ctx, variant):
    return json.loads((ctx.layout.codegen_dir(variant) / "manifest.json").read_text())


def strip_profile(text: str, M: str) -> str:
    """model.c without its profiling text: each ``#if``/``#ifdef`` block whose
    condition names ``<M>_PROFILE_LAYERS`` (to its matching ``#endif``) and each
    ``<M>_PROFILE_<X>(...);`` hook line."""
    out, depth = [], 0
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if depth:
            depth += s.startswith("#if") - s.startswith("#endif")
            continue
        if s.startswith("#if") and f"{M}_PROFILE_LAYERS" in s:
            depth = 1
            continue
        if re.fullmatch(rf"{M}_PROFILE_[A-Z]+\(\d*\);", s):
            continue
        out.append(line)
    assert depth == 0
    return "".join(out)


def compile_obj(src, out_dir, obj, *flags):
    done = subprocess.run([GCC, *flags, "-I", str(out_dir), "-c", str(src), "-o", str(obj)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return obj.read_bytes()


# ----------------------------------------------------------------------------- the switch

@pytest.mark.parametrize("variant", ["mmalib", "scalar"])
def test_switch_off_compiles_to_the_same_object_bytes_as_model_c_without_profiling(built, variant, tmp_path):
    cdir = built.layout.codegen_dir(variant)
    M = model_info(cdir).c_name.upper()
    text = (cdir / "model.c").read_text()
    stripped = strip_profile(text, M)
    assert f"{M}_PROFILE_START();" in text and "_PROFILE_" not in re.sub(r"/\*.*?\*/", "", stripped, flags=re.S)
    src = tmp_path / "model.c"  # one path for both: the object names its source file
    for opt in ("-O0", "-O2"):
        flags = (*CFLAGS, opt)
        src.write_text(text)
        new = compile_obj(src, cdir, tmp_path / "new.o", *flags)
        src.write_text(stripped)
        old = compile_obj(src, cdir, tmp_path / "old.o", *flags)
        assert new == old, f"{variant} {opt}: the profiling text changes the object code without the define"


def test_model_c_is_strict_c99_clean_with_and_without_the_switch_and_reads_the_tsc_on_c7x(built, tmp_path):
    cdir = built.layout.codegen_dir("mmalib")
    M = model_info(cdir).c_name.upper()
    src = cdir / "model.c"
    compile_obj(src, cdir, tmp_path / "off.o", *STRICT)
    compile_obj(src, cdir, tmp_path / "on.o", *STRICT, f"-D{M}_PROFILE_LAYERS")
    syms = subprocess.run(["nm", str(tmp_path / "on.o")], capture_output=True, text=True).stdout
    assert "clock_gettime" in syms and "tiny_print_layer_profile" in syms
    # The C7x branch, compiled by gcc against a stand-in for TI's c7x.h (which
    # declares the control register __TSC): the timer reads __TSC, not the clock.
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "c7x.h").write_text("extern volatile unsigned long __TSC; /* stand-in for TI's c7x.h */\n")
    compile_obj(src, cdir, tmp_path / "c7x.o", *STRICT, f"-D{M}_PROFILE_LAYERS", "-D__C7000__", "-I", str(stub))
    syms = subprocess.run(["nm", str(tmp_path / "c7x.o")], capture_output=True, text=True).stdout
    assert "__TSC" in syms and "clock_gettime" not in syms


def test_switch_on_prints_one_block_per_image_with_one_line_per_call_and_same_outputs(built, tmp_path):
    x = np.random.default_rng(3).standard_normal((3, 3, 32, 32)).astype(np.float32)
    for variant in ("mmalib", "scalar"):
        cdir = built.layout.codegen_dir(variant)
        calls = manifest(built, variant)["calls"]
        build_host(cdir, tmp_path / "plain.exe")
        build_host(cdir, tmp_path / "prof.exe", extra_flags=profile_flags(cdir))
        run = run_host_timed(tmp_path / "prof.exe", cdir, x)
        blocks = parse_blocks(run.stdout, "stdout")
        assert len(blocks) == len(x)
        for b in blocks:
            assert len(b.counts) == len(calls)
            assert list(b.names) == [f"__tvm_ffi_tiny_{c['func']}" for c in calls]
            assert all(c > 0 for c in b.counts) or variant == "scalar"
            match_calls(b, calls, "tiny", "stdout", "fix")
        assert run.stdout.count(HEADER) == len(x) and f"({len(calls)} layers)" in run.stdout
        np.testing.assert_array_equal(run.outputs.view(np.uint32),
                                      run_host(tmp_path / "plain.exe", cdir, x).view(np.uint32))


# ----------------------------------------------------------------------------- the parser

NAMES = ["__tvm_ffi_m_quantize", "__tvm_ffi_m_mmalib_conv2d_i8_0", "__tvm_ffi_m_a_very_long_fused_kernel_name_x"]


def test_format_parse_round_trip():
    text = format_block(NAMES, [5, 1234567, 0])
    assert text.startswith("\n" + HEADER + "\n")
    assert "[  1] __tvm_ffi_m_mmalib_conv2d_i8_0           1234567 cycles\n" in text
    assert text.endswith("Total: 1234572 cycles (3 layers)\n=============================\n")
    (block,) = parse_blocks(text)
    assert block == ProfileBlock(tuple(NAMES), (5, 1234567, 0)) and block.total == 1234572
    assert format_block(block.names, block.counts) == text


def test_several_blocks_in_log_noise_first_and_last_kept_apart():
    a, b, c = [10, 20, 30], [7, 8, 9], [6, 7, 8]
    log = ("boot: c7x firmware 1.2\r\n" + format_block(NAMES, a).replace("\n", "\r\n")
           + "Inference complete: 123 cycles\n"
           + format_block(NAMES, b).replace("[  1]", "[DSP] some printf\n[  1]")  # noise inside a block
           + "".join("[12:00:01.5] c7x_1: " + ln + "\n" for ln in format_block(NAMES, c).splitlines())
           + "=============================\n")
    blocks = parse_blocks(log, "board.txt")
    assert [list(x.counts) for x in blocks] == [a, b, c]
    assert blocks[0].line == 3 and all(list(x.names) == NAMES for x in blocks)
    thousands = format_block(NAMES, [1000, 2000000, 3]).replace("2000000", "2,000,000").replace(
        "2001003", "2,001,003")
    assert parse_blocks(thousands)[0].counts == (1000, 2000000, 3)
    assert parse_blocks("no profile here\n") == []


@pytest.mark.parametrize("mangle, needle", [
    (lambda t: t.replace("Total: 60 cycles (3 layers)", "Total: 61 cycles (3 layers)"), "does not match"),
    (lambda t: t.replace("[  1]", "[  2]"), "layer [2] where [1] was expected"),
    (lambda t: t.replace("[  1]", "[ 1]").split("-----")[0], "cut off"),
    (lambda t: t.split("-----")[0] + t, "cut off"),
])
def test_malformed_blocks_fail_in_one_line_naming_the_file(mangle, needle):
    with pytest.raises(ProfileLogError, match=re.escape(needle)) as e:
        parse_blocks(mangle(format_block(NAMES, [10, 20, 30])), "logs/board.txt")
    assert str(e.value).startswith("logs/board.txt: line ") and "\n" not in str(e.value)


def test_a_log_without_a_block_or_with_another_builds_block_fails_in_one_line(tmp_path):
    log = tmp_path / "board.txt"
    log.write_text("c7x boot\nInference complete: 5 cycles\n")
    with pytest.raises(ProfileLogError, match=rf"^{re.escape(str(log))}: no '{HEADER}' block") as e:
        read_blocks(log)
    assert "\n" not in str(e.value)
    calls = [{"index": i, "func": n.removeprefix("__tvm_ffi_m_")} for i, n in enumerate(NAMES)]
    (block,) = parse_blocks(format_block(NAMES[:2], [1, 2]))
    with pytest.raises(ProfileLogError, match=r"board.txt: line 2: the block has 2 layers but the build makes "
                                              r"3 kernel calls; re-run"):
        match_calls(block, calls, "m", "board.txt", "re-run")
    (block,) = parse_blocks(format_block(["__tvm_ffi_m_quantize", "__tvm_ffi_m_other", NAMES[2]], [1, 2, 3]))
    with pytest.raises(ProfileLogError, match=r"layer \[1\] is __tvm_ffi_m_other"):
        match_calls(block, calls, "m", "board.txt", "re-run")
    (block,) = parse_blocks(format_block([n.replace("_m_", "_") for n in NAMES], [1, 2, 3]))
    match_calls(block, calls, "m", "board.txt", "re-run")  # TI's unprefixed names are accepted


# ----------------------------------------------------------------------------- the stage

def stage_args(ctx, board_log=None):
    args = get("profile").args(ctx)
    args["board_log"] = board_log
    return args


def test_stage_writes_host_profile_of_both_builds(built):
    plain = {v: built.layout.host_exe(v).read_bytes() for v in ("mmalib", "scalar")}
    report = profile_model(**stage_args(built))
    assert report == json.loads(built.layout.profile.read_text())
    for variant in ("mmalib", "scalar"):
        m = report["variants"][variant]
        calls = manifest(built, variant)["calls"]
        assert m["source"] == "host" and m["unit"] == "ns" and m["label"] == HOST_LABEL
        assert m["runs"] == 3 and "median over 3 images" in m["statistic"]
        assert [c["index"] for c in m["calls"]] == list(range(len(calls)))
        assert [c["layer"] for c in m["calls"]] == [c["layer"] for c in calls]
        assert m["total"] == pytest.approx(sum(c["time"] for c in m["calls"]))
        assert sum(c["share"] for c in m["calls"]) == pytest.approx(1, abs=1e-4)
        assert sum(r["share"] for r in m["layers"]) == pytest.approx(1, abs=1e-4)
        times = [r["time"] for r in m["layers"]]
        assert times == sorted(times, reverse=True)
        modules = {r["layer"]: r["module"] for r in m["layers"]}
        assert modules["conv2d"] == "stem.0" and modules[None] is None
        assert built.layout.profile_exe(variant).is_file()
        assert "-DTINY_PROFILE_LAYERS" in m["build"]
    assert all(HOST_LABEL in line for line in report["summary_lines"])
    assert {v: built.layout.host_exe(v).read_bytes() for v in plain} == plain  # the normal harness: untouched


def test_board_log_replaces_host_time_of_the_mmalib_build(built, tmp_path):
    calls = manifest(built, "mmalib")["calls"]
    names = [f"__tvm_ffi_tiny_{c['func']}" for c in calls]
    first = [100 * (i + 3) for i in range(len(calls))]
    last = [100 * (i + 1) for i in range(len(calls))]
    log = tmp_path / "board.txt"
    log.write_text("c7x: loading\n" + format_block(names, first) + "noise\n" + format_block(names, last))
    report = profile_model(**stage_args(built, log))
    m = report["variants"]["mmalib"]
    assert m["source"] == "board" and m["unit"] == "cycles" and m["label"] == board_label(log)
    assert m["label"] == f"C7x cycles (board log {log})" and m["runs"] == 2
    assert [c["time"] for c in m["calls"]] == last and m["total"] == sum(last)
    assert [c["init_delta"] for c in m["calls"]] == [200] * len(calls)
    assert sum(r["init_delta"] for r in m["layers"]) == 200 * len(calls)
    assert m["host"]["label"] == HOST_LABEL and m["host"]["unit"] == "ns"  # kept for comparison
    assert report["variants"]["scalar"]["source"] == "host"
    assert report["board_log"] == str(log)


def test_bad_board_log_fails_in_one_line_naming_file_model_and_fix(built, tmp_path):
    calls = manifest(built, "mmalib")["calls"]
    log = tmp_path / "board.txt"
    log.write_text(format_block([f"__tvm_ffi_tiny_{c['func']}" for c in calls[:-1]], [1] * (len(calls) - 1)))
    with pytest.raises(ProfileLogError) as e:
        profile_model(**stage_args(built, log))
    msg = str(e.value)
    assert msg.startswith(f"{log}: line 2: the block has {len(calls) - 1} layers but the build makes "
                          f"{len(calls)} kernel calls")
    assert "model 'tiny'" in msg and "-DTINY_PROFILE_LAYERS" in msg and "\n" not in msg
    with pytest.raises(ProfileLogError, match=r"board log not found \(model 'tiny', build mmalib\); fix "
                                              r"\[profile\] board_log in .*tiny.toml or remove the key"):
        profile_model(**stage_args(built, tmp_path / "missing.txt"))


# ----------------------------------------------------------------------------- with doit

def test_board_log_is_a_tracked_input_of_profile_only(tmp_path):
    p = Project(tmp_path / "proj")
    p.add_images("setA", 2)
    p.add_model("tiny", "setA")
    run = p.doit("profile:tiny")
    assert run.returncode == 0, run.out
    assert "profile:tiny" in run.executed and HOST_LABEL in run.out
    assert p.doit("profile:tiny").executed == []

    art = p.root / "artifacts" / "tiny"
    calls = json.loads((art / "c" / "mmalib" / "manifest.json").read_text())["calls"]
    names = [f"__tvm_ffi_tiny_{c['func']}" for c in calls]
    log = art / "board_profile.txt"

    def profile():
        return json.loads((art / "profile.json").read_text())["variants"]["mmalib"]

    log.write_text(format_block(names, [5] * len(calls)))
    run = p.doit("profile:tiny")
    assert run.returncode == 0, run.out
    assert run.executed == ["profile:tiny"], run.executed
    assert profile()["source"] == "board" and profile()["total"] == 5 * len(calls)

    log.write_text(format_block(names, [5] * len(calls)) + format_block(names, [7] * len(calls)))
    run = p.doit("profile:tiny")
    assert run.executed == ["profile:tiny"] and profile()["total"] == 7 * len(calls), run.out
    assert p.doit("profile:tiny").executed == []

    log.write_text("nothing printed\n")
    run = p.doit("profile:tiny")
    assert run.returncode != 0 and f"{log}: no '{HEADER}' block" in run.out

    log.unlink()
    run = p.doit("profile:tiny")
    assert run.executed == ["profile:tiny"] and run.returncode == 0, run.out
    assert profile()["source"] == "host" and profile()["label"] == HOST_LABEL
    assert p.doit("profile:tiny").executed == []

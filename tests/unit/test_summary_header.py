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

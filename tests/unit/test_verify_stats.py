"""verify's comparison arithmetic."""

import numpy as np

from pipeline.stages.verify import lsb_stats


def test_int16_steps_are_counted_exactly():
    lsb = np.float32(0.00087)
    q = np.arange(-5, 5, dtype=np.float32).reshape(2, 5)
    a, b = q * lsb, (q + np.array([[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)) * lsb
    s = lsb_stats(a, b, float(lsb))
    assert s["unit"] == "lsb" and s["max_lsb"] == 1 and s["elements_off"] == 1 and s["elements"] == 10
    # the same in float output units (logits), comparable with an int8 build's
    assert s["max_abs"] == round(float(lsb), 6) and s["mean_abs"] == round(float(lsb) / 10, 6)


def test_float_outputs_are_compared_in_output_units():
    a = np.array([[0.1, 0.7, 0.2]], np.float32)
    b = np.array([[0.1, 0.6, 0.3]], np.float32)
    s = lsb_stats(a, b, None)
    assert s["unit"] == "float" and abs(s["max_lsb"] - 0.1) < 1e-6 and s["top1_agreement"] == 1

"""evaluate's PyTorch outputs file (pipeline/data/torch_outputs.py), which verify reads
instead of running the float and Q/DQ programs again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.errors import PipelineError
from pipeline.data import torch_outputs as T

NAMES = ["a.jpg", "b.jpg", "c.jpg"]


def kept(x: torch.Tensor) -> T.TorchOutputs:
    rng = np.random.default_rng(0)
    return T.TorchOutputs(NAMES, T.inputs_digest(x), [rng.standard_normal((3, 10), np.float32),
                                                       rng.standard_normal((3, 2, 4), np.float32)],
                          [rng.standard_normal((3, 10), np.float32), rng.standard_normal((3, 2, 4), np.float32)],
                          [0.125, None], rng.standard_normal((2, 10), np.float32))


def test_outputs_round_trip_with_float_outputs_and_same_bytes_every_time(tmp_path):
    """Every array and the per-output LSB (None for a float output) come back; writing the
    same outputs again gives the same bytes (fixed zip times), so verify is not re-run."""
    x = torch.randn(3, 3, 5, 5)
    t = kept(x)
    T.write(tmp_path / "o.npz", t)
    first = (tmp_path / "o.npz").read_bytes()
    back = T.read(tmp_path / "o.npz", NAMES, x.numpy(), "m")
    assert back.images == NAMES and back.lsbs == [0.125, None] and back.inputs_sha256 == t.inputs_sha256
    for got, want in zip(back.float_outs + back.qdq_outs + [back.noise], t.float_outs + t.qdq_outs + [t.noise]):
        np.testing.assert_array_equal(got, want)
    T.write(tmp_path / "o.npz", t)
    assert (tmp_path / "o.npz").read_bytes() == first


@pytest.mark.parametrize("case", ["other_images", "other_preprocessing", "missing", "corrupt"])
def test_stale_or_bad_outputs_name_the_file_the_model_and_the_fix(tmp_path, case):
    x = torch.randn(3, 3, 5, 5)
    path = tmp_path / "o.npz"
    T.write(path, kept(x))
    names, inputs = NAMES, x.numpy()
    if case == "other_images":
        names = ["a.jpg", "b.jpg", "d.jpg"]
    elif case == "other_preprocessing":
        inputs = inputs * 0.5
    elif case == "missing":
        path = tmp_path / "none.npz"
    else:
        path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(PipelineError) as e:
        T.read(path, names, inputs, "tiny")
    msg = str(e.value)
    assert "'tiny'" in msg and str(path) in msg and "doit evaluate:tiny" in msg and "\n" not in msg

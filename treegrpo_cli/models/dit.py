"""A tiny text-conditioned diffusion transformer (DiT) for the embedded shapes world.

Pixel space, 32x32x3 images in [-1, 1], 4x4 patches -> 64 image tokens. The prompt's words (a
closed vocabulary from the shapes grammar) are embedded and prepended to the image tokens, so
every block attends jointly over text and image (in-context conditioning); the noise level enters
through adaLN-zero modulation. About 1.2M parameters with the default sizes.
"""

from __future__ import annotations

import copy
import re
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import Conditions, PixelNetPolicy
from .flops import Ledger
from .pixel import sigma_embedding

VOCAB = (
    "<pad>",
    "<unk>",
    "a",
    "one",
    "two",
    "three",
    "small",
    "big",
    "red",
    "green",
    "blue",
    "yellow",
    "purple",
    "orange",
    "circle",
    "circles",
    "square",
    "squares",
    "triangle",
    "triangles",
    "left",
    "right",
    "of",
    "above",
    "below",
    "an",
)


@dataclass(frozen=True)
class DiTConfig:
    image_size: int = 32
    channels: int = 3
    patch: int = 4
    dim: int = 128
    depth: int = 5
    heads: int = 4
    mlp_ratio: float = 2.5
    max_words: int = 12
    text_ada: bool = False  # also condition adaLN on the prompt's mean word embedding
    text_layers: int = 0  # transformer layers over the words alone before the joint blocks (a text encoder)
    word_std: float = 1.0  # init std of the word embeddings (1: torch's default; word positions start at 0.02)
    pos: str = "sincos"  # image-token positions: fixed 2D sin-cos ("sincos") or "learned"
    refine: int = 32  # channels of the convolutional refiner at full resolution (0 = none)
    refine_feats: int = 8  # extra feature channels per pixel the patch decoder hands the refiner
    vocab: tuple[str, ...] = field(default=VOCAB)


def tokenize(prompts: list[str], vocab: tuple[str, ...], max_words: int) -> tuple[Tensor, Tensor]:
    """-> ids [P, W] int64 (0 = pad, 1 = unknown word), mask [P, W] bool."""
    index = {w: i for i, w in enumerate(vocab)}
    ids = torch.zeros(len(prompts), max_words, dtype=torch.long)
    for p, text in enumerate(prompts):
        for w, word in enumerate(re.findall(r"[a-z]+", text.lower())[:max_words]):
            ids[p, w] = index.get(word, 1)
    return ids, ids > 0


class Block(nn.Module):
    """Pre-norm transformer block with adaLN-zero: shift, scale and gate from the condition."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.ada = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, h: Tensor, c: Tensor, key_mask: Tensor) -> Tensor:
        # h [B, S, D], c [B, D], key_mask [B, S] bool (True = attend)
        B, S, D = h.shape
        s1, b1, g1, s2, b2, g2 = self.ada(F.silu(c))[:, None].chunk(6, dim=-1)
        x = self.norm1(h) * (1 + s1) + b1
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        h = h + g1 * self.proj(att.transpose(1, 2).reshape(B, S, D))
        x = self.norm2(h) * (1 + s2) + b2
        return h + g2 * self.mlp(x)


class TextBlock(nn.Module):
    """Pre-norm transformer layer over the prompt's words only: gives each word its role in the sentence
    (which object is named first) before the image tokens read it. Padding attends to itself only."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, t: Tensor, mask: Tensor) -> Tensor:
        # t [B, W, D], mask [B, W] bool (True = a word)
        B, W, D = t.shape
        allowed = mask[:, None, :] | torch.eye(W, dtype=torch.bool, device=t.device)  # [B, W, W]
        q, k, v = self.qkv(self.norm1(t)).view(B, W, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        t = t + self.proj(att.transpose(1, 2).reshape(B, W, D))
        return t + self.mlp(self.norm2(t))


class TinyDiT(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        _check_sizes(cfg)
        self.cfg = cfg
        D, p = cfg.dim, cfg.patch
        n = (cfg.image_size // p) ** 2
        self.patch_in = nn.Linear(cfg.channels * p * p, D)
        if cfg.pos == "sincos":
            self.register_buffer("pos", sincos_2d(cfg.image_size // p, D), persistent=False)
        else:
            self.pos = nn.Parameter(torch.randn(1, n, D) * 0.02)
        self.words = nn.Embedding(len(cfg.vocab), D, padding_idx=0)
        if cfg.word_std != 1.0:  # words on the positions' scale, so that word order can count
            with torch.no_grad():
                self.words.weight.normal_(0.0, cfg.word_std)
                self.words.weight[0].zero_()
        self.word_pos = nn.Parameter(torch.randn(1, cfg.max_words, D) * 0.02)
        self.time = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D))
        self.text_pool = nn.Sequential(nn.Linear(D, D), nn.SiLU(), nn.Linear(D, D)) if cfg.text_ada else None
        self.text_blocks = nn.ModuleList(TextBlock(D, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.text_layers))
        self.blocks = nn.ModuleList(Block(D, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(D, 2 * D)
        feats = cfg.refine_feats if cfg.refine else 0
        self.patch_out = nn.Linear(D, (cfg.channels + feats) * p * p)
        for layer in (self.ada_out, self.patch_out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)
        self.refiner = Refiner(cfg.channels, feats, cfg.refine) if cfg.refine else None

    def forward(self, x: Tensor, sigma: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
        # x [B, C, H, W], sigma [B], ids/mask [B, W] -> v [B, C, H, W]
        B, C, H, W = x.shape
        p = self.cfg.patch
        patches = x.unfold(2, p, p).unfold(3, p, p)  # [B, C, H/p, W/p, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(B, (H // p) * (W // p), C * p * p)  # B = 0 too
        img = self.patch_in(patches) + self.pos  # [B, N, D]
        txt = self.words(ids) + self.word_pos[:, : ids.shape[1]]  # [B, W, D]
        for block in self.text_blocks:
            txt = block(txt, mask)
        h = torch.cat([txt, img], dim=1)
        key_mask = torch.cat([mask, torch.ones(B, img.shape[1], dtype=torch.bool, device=x.device)], dim=1)
        c = self.time(sigma_embedding(sigma, self.cfg.dim))  # [B, D]
        if self.text_pool is not None:  # + mean word embedding (0 if none)
            words = (txt if self.cfg.text_layers else self.words(ids)) * mask[..., None]
            c = c + self.text_pool(words.sum(1) / mask.sum(1, keepdim=True).clamp(min=1))
        for block in self.blocks:
            h = block(h, c, key_mask)
        shift, scale = self.ada_out(F.silu(c))[:, None].chunk(2, dim=-1)
        out = self.patch_out(self.norm_out(h[:, ids.shape[1] :]) * (1 + scale) + shift)  # [B, N, (C+F)*p*p]
        g, F_ = H // p, out.shape[-1] // (p * p)
        out = out.view(B, g, g, F_, p, p).permute(0, 3, 1, 4, 2, 5).reshape(B, F_, H, W)
        if self.refiner is None:
            return out
        return out[:, :C] + self.refiner(torch.cat([x, out], dim=1))  # [B, C, H, W]


def sincos_2d(grid: int, dim: int) -> Tensor:
    """[1, grid*grid, dim] fixed positions: a quarter of the channels each for sin/cos of the row and
    of the column, at geometric frequencies 1 .. 1/10000 (row-major token order, as the patches)."""
    q = dim // 4
    freqs = 1.0 / 10000 ** (torch.arange(q, dtype=torch.float64) / q)  # [q]
    ys, xs = torch.meshgrid(
        torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64), indexing="ij"
    )
    ay, ax = ys.reshape(-1, 1) * freqs, xs.reshape(-1, 1) * freqs  # [grid*grid, q]
    return torch.cat([ay.sin(), ay.cos(), ax.sin(), ax.cos()], dim=1)[None].float()


class Refiner(nn.Module):
    """Three 3x3 convolutions at full resolution on (x_sigma, patch output, patch features): sharpens
    the edges a linear patch decoder draws blocky; the last layer starts at zero."""

    def __init__(self, channels: int, feats: int, width: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(2 * channels + feats, width, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(width, channels, 3, padding=1),
        )
        for p in self.net[-1].parameters():  # the last convolution's weight and bias
            nn.init.zeros_(p)

    def forward(self, z: Tensor) -> Tensor:
        # z [B, 2C+F, H, W] -> [B, C, H, W]
        return self.net(z)


class DiTPolicy(PixelNetPolicy):
    """Policy adapter for TinyDiT: pixel latents in [-1, 1], closed-vocabulary word conditions.

    guidance w != 1: classifier-free guidance, v = v(empty prompt) + w * (v(prompt) - v(empty prompt)),
    both halves in one forward (the guided velocity is the policy: its log-probs are trained)."""

    net: TinyDiT
    latent_shape: tuple[int, ...]

    def __init__(
        self, cfg: DiTConfig, net: TinyDiT, name: str = "tiny-shapes", source: str = "", guidance: float = 1.0
    ):
        self.cfg, self.net, self.name, self.source, self.guidance = cfg, net, name, source, float(guidance)
        self.latent_shape = (cfg.channels, cfg.image_size, cfg.image_size)

    @property
    def evals_per_row(self) -> int:
        return 1 if self.guidance == 1.0 else 2

    def velocity(self, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        ids, mask = cond["ids"], cond["mask"]
        if self.guidance == 1.0:
            return self.net(x, sigma, ids, mask)
        v_c, v_u = self.net(
            torch.cat([x, x]),
            torch.cat([sigma, sigma]),
            torch.cat([ids, torch.zeros_like(ids)]),
            torch.cat([mask, torch.zeros_like(mask)]),
        ).chunk(2)
        return v_u + self.guidance * (v_c - v_u)

    def flops_per_row(self) -> tuple[int, int] | None:
        """(forward, backward) FLOPs of one network row (one CFG half), derived from the config
        (dit_flops): prompts are padded to max_words text tokens."""
        return dit_flops(self.cfg, self.cfg.max_words)

    def encode(self, prompts: list[str]) -> Conditions:
        ids, mask = tokenize(prompts, self.cfg.vocab, self.cfg.max_words)
        return {"ids": ids.to(self._device()), "mask": mask.to(self._device())}

    def reference(self) -> DiTPolicy:
        return DiTPolicy(
            self.cfg,
            copy.deepcopy(self.net).requires_grad_(False),
            f"{self.name}-reference",
            self.source,
            self.guidance,
        )

    def describe(self) -> dict:
        cfg = asdict(self.cfg)
        cfg["vocab"] = list(cfg["vocab"])
        return {"name": self.name, "adapter": "dit", "source": self.source, "guidance": self.guidance, "config": cfg}


def num_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def _check_sizes(cfg: DiTConfig) -> None:
    if cfg.image_size % cfg.patch or cfg.dim % cfg.heads or cfg.dim % 4:
        raise ValueError(f"image_size must be a multiple of patch, dim of heads and of 4: {cfg}")
    if cfg.pos not in ("sincos", "learned"):
        raise ValueError(f"pos must be 'sincos' or 'learned', got {cfg.pos!r}")


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
def dit_flops(cfg: DiTConfig, text_tokens: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of one row of TinyDiT(cfg), every weight trained; text_tokens: the
    prompt's padded length (DiTPolicy pads every prompt to cfg.max_words)."""
    led, D, p, W = Ledger(), cfg.dim, cfg.patch, text_tokens
    N = (cfg.image_size // p) ** 2  # image tokens
    hidden = int(D * cfg.mlp_ratio)
    led.linear("patch_in", N, cfg.channels * p * p, D, x_grad=False)  # patches [N, C p p] -> [N, D]
    c = led.linear("time.2", 1, D, D, led.linear("time.0", 1, D, D, x_grad=False))  # sigma features [1, D]
    for _ in range(cfg.text_layers):  # words [W, D], trained embeddings
        _dit_text_block(led, W, D, hidden)
    if cfg.text_ada:  # mean word embedding [1, D] -> + c
        led.linear("text_pool.2", 1, D, D, led.linear("text_pool.0", 1, D, D, x_grad=True))
    for _ in range(cfg.depth):  # text and image tokens [W + N, D]
        _dit_block(led, W + N, D, hidden, c)
    led.linear("ada_out", 1, D, 2 * D, c)  # silu(c) [1, D] -> shift, scale
    feats = cfg.refine_feats if cfg.refine else 0
    led.linear("patch_out", N, D, (cfg.channels + feats) * p * p, x_grad=True)  # -> [N, (C+F) p p]
    if cfg.refine:  # three 3x3 convolutions on [H*W] pixels: (x, patch output) -> R -> R -> C channels
        px, R = cfg.image_size**2, cfg.refine
        led.linear("refiner.net.0", px, 9 * (2 * cfg.channels + feats), R, x_grad=True)
        led.linear("refiner.net.2", px, 9 * R, R, x_grad=True)
        led.linear("refiner.net.4", px, 9 * R, cfg.channels, x_grad=True)
    return led.fwd, led.bwd


def _dit_block(led: Ledger, S: int, D: int, hidden: int, c: bool) -> None:
    """Block: adaLN-zero on c [1, D], attention and MLP over h [S, D]."""
    led.linear("ada", 1, D, 6 * D, c)  # [1, D] -> 6 modulations
    led.linear("qkv", S, D, 3 * D, x_grad=True)
    led.attention(S, D, grad=True)
    led.linear("proj", S, D, D, x_grad=True)
    led.linear("mlp.2", S, hidden, D, led.linear("mlp.0", S, D, hidden, x_grad=True))


def _dit_text_block(led: Ledger, W: int, D: int, hidden: int) -> None:
    """TextBlock: attention and MLP over the words t [W, D]."""
    led.linear("qkv", W, D, 3 * D, x_grad=True)
    led.attention(W, D, grad=True)
    led.linear("proj", W, D, D, x_grad=True)
    led.linear("mlp.2", W, hidden, D, led.linear("mlp.0", W, D, hidden, x_grad=True))

"""Denoiser FLOPs of one network row (batch 1), forward and backward: the benchmark's compute axis.

Counted the way torch.utils.flop_counter.FlopCounterMode counts, so that a count can be checked against
it: only matmul-like ops, 2*m*k*n for a [m, k] @ [k, n] product (linear layers, convolutions as
[pixels, k*k*c_in] @ [k*k*c_in, c_out], bias additions, norms and activations free), and attention with
torch's scaled_dot_product_attention formulas: forward 4*s_q*s_k*d (scores and the weighted sum), backward
10*s_q*s_k*d (the scores recomputed, then four gradient products), d the summed width of all heads.

Backward of a linear layer y = x W^T: the weight gradient (2*m*k*n) when W is trained, the input gradient
(2*m*k*n) when x requires grad (a trained layer upstream); a LoRA layer adds its A [k -> r] and B [r -> n]
products forward and their weight and input gradients backward. The count follows which tensors require
grad through the network, as autograd does: the sampler latent and the text embeddings never do.

`dit_flops`, `flux_flops` and `sd3_flops` (and flops_models.py's `qwen_image_flops`, `flux2_flops`)
derive the count from a model's config; `measure` and
`measure_policy_flops` run FlopCounterMode itself (the fallback of the adapters with no formula: pixel, SD1.5).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

if TYPE_CHECKING:
    from .dit import DiTConfig

TIME_FEATURES = 256  # diffusers' Timesteps(num_channels=256) in FLUX's time and guidance embedders
FLUX_DEFAULTS: dict[str, Any] = {  # FluxTransformer2DModel's constructor defaults (FLUX.1)
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
}


@dataclass
class Ledger:
    """Running (forward, backward) FLOPs of one row. rank None: every weight is trained (full fine-tuning);
    rank r: the weights are frozen and the linear layers whose names match `targets` (peft's rule: the name
    or a '.'-suffix of it) carry a trained rank-r LoRA adapter."""

    rank: int | None = None
    targets: tuple[str, ...] | str = ()  # names, or one regular expression of full names (peft's two forms)
    fwd: int = 0
    bwd: int = 0

    def lora(self, name: str) -> int:
        if self.rank is None:
            return 0
        if isinstance(self.targets, str):
            return self.rank if re.fullmatch(self.targets, name) else 0
        return self.rank if any(name == t or name.endswith("." + t) for t in self.targets) else 0

    def dead(self, name: str, m: int, k: int, n: int) -> None:
        """A linear layer whose output never reaches the loss: its forward only (autograd skips its backward)."""
        r = self.lora(name)
        self.fwd += 2 * m * k * n + (2 * m * k * r + 2 * m * r * n if r else 0)

    def linear(self, name: str, m: int, k: int, n: int, x_grad: bool) -> bool:
        """x [m, k] -> y [m, n]; x_grad: x requires grad. Returns whether y requires grad."""
        mm, r = 2 * m * k * n, self.lora(name)
        self.fwd += mm
        if r:  # y = x W^T + B(A x): A [k -> r], B [r -> n]
            a, b = 2 * m * k * r, 2 * m * r * n
            self.fwd += a + b
            self.bwd += a + 2 * b + (mm + a if x_grad else 0)  # dA, dB, d(Ax); dx through W and A
            return True
        trained = self.rank is None
        self.bwd += (mm if trained else 0) + (mm if x_grad else 0)  # dW; dx
        return trained or x_grad

    def attention(self, s: int, d: int, grad: bool, keys: int | None = None) -> None:
        """q [s, d], k and v [keys, d] (all heads; keys default s) -> [s, d]; grad: the output requires grad."""
        k = s if keys is None else keys
        self.fwd += 4 * s * k * d
        self.bwd += 10 * s * k * d if grad else 0


Targets = Sequence[str] | str | None  # LoRA target names, or one regular expression of full names
Formula = Callable[..., tuple[int, int]]


def formula(defaults: dict[str, Any], default_targets: Callable[[], Targets], body: Callable[..., int]) -> Formula:
    """A FLOP formula of a diffusers denoiser: `count(config, image_tokens, text_tokens, rank=None, targets=None,
    recompute=False)` -> (forward, backward) of one network row. config: the model's config (a mapping or an
    object), read over `defaults`, its constructor's; rank None: full fine-tuning, else LoRA of that rank on
    `targets` (None: the adapter's `default_targets()`); recompute: gradient checkpointing, whose backward runs
    every block's forward again. body(led, cfg, N, T) counts the network into the ledger and returns the
    forward FLOPs of the checkpointed blocks."""

    def count(
        config: Any,
        image_tokens: int,
        text_tokens: int,
        rank: int | None = None,
        targets: Targets = None,
        recompute: bool = False,
    ) -> tuple[int, int]:
        get = config.get if isinstance(config, Mapping) else lambda k, v: getattr(config, k, v)
        cfg = {k: get(k, v) for k, v in defaults.items()}
        if rank is not None and targets is None:
            targets = default_targets()
        led = Ledger(rank, targets if isinstance(targets, str) else tuple(targets or ()))
        blocks = body(led, cfg, image_tokens, text_tokens)
        return led.fwd, led.bwd + (blocks if recompute else 0)

    return count


# -- the tiny DiT (models/dit.py) --------------------------------------------------------------
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


# -- FLUX (diffusers' FluxTransformer2DModel) --------------------------------------------------
def _flux(led: Ledger, cfg: dict[str, Any], N: int, T: int) -> int:
    """FluxTransformer2DModel: N packed latent tokens, T T5 tokens."""
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    M = int(D * 4.0)  # mlp ratio 4
    img = led.linear("x_embedder", N, cfg["in_channels"], D, x_grad=False)  # packed latents [N, 64] -> [N, D]
    temb = _flux_time_text(led, D, cfg["pooled_projection_dim"], cfg["guidance_embeds"])  # [1, D]
    txt = led.linear("context_embedder", T, cfg["joint_attention_dim"], D, x_grad=False)  # T5 [T, 4096] -> [T, D]
    blocks = led.fwd
    for i in range(cfg["num_layers"]):
        img, txt = _flux_double(led, f"transformer_blocks.{i}.", N, T, D, M, img, txt, temb)
    h = img or txt  # single-stream blocks over cat(text, image) [T + N, D]
    for i in range(cfg["num_single_layers"]):
        h = _flux_single(led, f"single_transformer_blocks.{i}.", T + N, D, M, h, temb)
    blocks = led.fwd - blocks
    led.linear("norm_out.linear", 1, D, 2 * D, temb)  # AdaLayerNormContinuous: [1, D] -> scale, shift
    out = cfg["out_channels"] or cfg["in_channels"]
    led.linear("proj_out", N, D, cfg["patch_size"] ** 2 * out, h)  # image tokens [N, D] -> [N, 64]
    return blocks


def _flux_targets() -> Targets:
    from .flux import FLUX_LORA

    return FLUX_LORA.targets


# FLUX.1 (dev, schnell): the LoRA defaults are models/flux.py's FLUX_LORA
flux_flops = formula(FLUX_DEFAULTS, _flux_targets, _flux)


def _flux_time_text(led: Ledger, D: int, pooled: int, guidance: bool) -> bool:
    """temb [1, D] = MLP(time features [1, 256]) (+ MLP(guidance features)) + MLP(pooled CLIP [1, pooled])."""
    pre = "time_text_embed."
    g = led.linear(pre + "timestep_embedder.linear_1", 1, TIME_FEATURES, D, x_grad=False)
    g = led.linear(pre + "timestep_embedder.linear_2", 1, D, D, g)
    if guidance:
        gg = led.linear(pre + "guidance_embedder.linear_1", 1, TIME_FEATURES, D, x_grad=False)
        g = led.linear(pre + "guidance_embedder.linear_2", 1, D, D, gg) or g
    y = led.linear(pre + "text_embedder.linear_1", 1, pooled, D, x_grad=False)
    return led.linear(pre + "text_embedder.linear_2", 1, D, D, y) or g


def _flux_double(
    led: Ledger, pre: str, N: int, T: int, D: int, M: int, img: bool, txt: bool, c: bool
) -> tuple[bool, bool]:
    """FluxTransformerBlock: image [N, D] and text [T, D] streams, each with its adaLN-zero, q/k/v, output
    projection and feed-forward; joint attention over [T + N, D]. Returns the streams' requires-grad."""
    mod = led.linear(pre + "norm1.linear", 1, D, 6 * D, c)  # [1, D] -> 6 modulations of the image stream
    cmod = led.linear(pre + "norm1_context.linear", 1, D, 6 * D, c)  # ... of the text stream
    x, y = img or mod, txt or cmod  # the modulated streams
    qkv = [led.linear(pre + f"attn.to_{n}", N, D, D, x) for n in "qkv"]
    qkv += [led.linear(pre + f"attn.add_{n}_proj", T, D, D, y) for n in "qkv"]
    led.attention(T + N, D, any(qkv))
    img = led.linear(pre + "attn.to_out.0", N, D, D, any(qkv)) or x
    txt = led.linear(pre + "attn.to_add_out", T, D, D, any(qkv)) or y
    img = led.linear(pre + "ff.net.2", N, M, D, led.linear(pre + "ff.net.0.proj", N, D, M, img)) or img
    txt = led.linear(pre + "ff_context.net.2", T, M, D, led.linear(pre + "ff_context.net.0.proj", T, D, M, txt)) or txt
    return img, txt


def _flux_single(led: Ledger, pre: str, S: int, D: int, M: int, h: bool, c: bool) -> bool:
    """FluxSingleTransformerBlock over h [S, D]: adaLN, q/k/v and attention in parallel with proj_mlp
    [S, D] -> [S, 4D], then proj_out on cat(attention, mlp) [S, 5D] -> [S, D]."""
    x = led.linear(pre + "norm.linear", 1, D, 3 * D, c) or h  # [1, D] -> shift, scale, gate
    mlp = led.linear(pre + "proj_mlp", S, D, M, x)
    qkv = [led.linear(pre + f"attn.to_{n}", S, D, D, x) for n in "qkv"]
    led.attention(S, D, any(qkv))
    return led.linear(pre + "proj_out", S, D + M, D, any(qkv) or mlp) or x


# -- SD3 / SD3.5 (diffusers' SD3Transformer2DModel) ---------------------------------------------
SD3_DEFAULTS: dict[str, Any] = {  # SD3Transformer2DModel's constructor defaults
    "patch_size": 2,
    "in_channels": 16,
    "num_layers": 18,
    "attention_head_dim": 64,
    "num_attention_heads": 18,
    "joint_attention_dim": 4096,
    "caption_projection_dim": 1152,
    "pooled_projection_dim": 2048,
    "out_channels": 16,
    "dual_attention_layers": (),
}


def _sd3(led: Ledger, cfg: dict[str, Any], N: int, T: int) -> int:
    """SD3Transformer2DModel (SD3, SD3.5 Medium with its dual-attention blocks, SD3.5 Large): N patches, T CLIP+T5
    tokens."""
    D, p, L = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["patch_size"], cfg["num_layers"]
    img = led.linear("pos_embed.proj", N, cfg["in_channels"] * p * p, D, x_grad=False)  # patches -> [N, D]
    pre = "time_text_embed."
    t = led.linear(pre + "timestep_embedder.linear_1", 1, TIME_FEATURES, D, x_grad=False)
    t = led.linear(pre + "timestep_embedder.linear_2", 1, D, D, t)
    y = led.linear(pre + "text_embedder.linear_1", 1, cfg["pooled_projection_dim"], D, x_grad=False)
    temb = led.linear(pre + "text_embedder.linear_2", 1, D, D, y) or t  # [1, D]
    txt = led.linear("context_embedder", T, cfg["joint_attention_dim"], cfg["caption_projection_dim"], x_grad=False)
    blocks = led.fwd
    dual = tuple(cfg["dual_attention_layers"])
    for i in range(L):
        img, txt = _sd3_block(led, f"transformer_blocks.{i}.", N, T, D, img, txt, temb, i == L - 1, i in dual)
    blocks = led.fwd - blocks
    led.linear("norm_out.linear", 1, D, 2 * D, temb)  # AdaLayerNormContinuous: [1, D] -> scale, shift
    led.linear("proj_out", N, D, p * p * cfg["out_channels"], img)
    return blocks


def _sd3_targets() -> Targets:
    from .sd3 import SD3_LORA

    return SD3_LORA.targets


# SD3 / SD3.5: the LoRA defaults are models/sd3.py's SD3_LORA
sd3_flops = formula(SD3_DEFAULTS, _sd3_targets, _sd3)


def _sd3_block(
    led: Ledger, pre: str, N: int, T: int, D: int, img: bool, txt: bool, c: bool, last: bool, dual: bool
) -> tuple[bool, bool]:
    """JointTransformerBlock: image [N, D] and text [T, D] streams with their adaLN-zero (9 modulations with a
    second, image-only attention in SD3.5 Medium's dual blocks; the last block's text stream only feeds the
    attention: a continuous adaLN, no output projection or feed-forward), joint attention over [T + N, D]."""
    mod = led.linear(pre + "norm1.linear", 1, D, (9 if dual else 6) * D, c)
    cmod = led.linear(pre + "norm1_context.linear", 1, D, (2 if last else 6) * D, c)
    x, y = img or mod, txt or cmod
    qkv = [led.linear(pre + f"attn.to_{n}", N, D, D, x) for n in "qkv"]
    qkv += [led.linear(pre + f"attn.add_{n}_proj", T, D, D, y) for n in "qkv"]
    led.attention(T + N, D, any(qkv))
    img = led.linear(pre + "attn.to_out.0", N, D, D, any(qkv)) or x
    if dual:  # attn2 on the image stream alone
        qkv2 = [led.linear(pre + f"attn2.to_{n}", N, D, D, x) for n in "qkv"]
        led.attention(N, D, any(qkv2))
        img = led.linear(pre + "attn2.to_out.0", N, D, D, any(qkv2)) or img
    img = led.linear(pre + "ff.net.2", N, 4 * D, D, led.linear(pre + "ff.net.0.proj", N, D, 4 * D, img)) or img
    if last:
        return img, False
    txt = led.linear(pre + "attn.to_add_out", T, D, D, any(qkv)) or y
    ctx = led.linear(pre + "ff_context.net.0.proj", T, D, 4 * D, txt)
    return img, led.linear(pre + "ff_context.net.2", T, 4 * D, D, ctx) or txt


# -- measured (FlopCounterMode) ----------------------------------------------------------------
def _sdpa(q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(q, k, v)


def _sdpa_backward(g: Any, q: Any, k: Any, v: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(g, q, k, v)


def flop_counter() -> FlopCounterMode:
    """torch's FlopCounterMode (display off), also counting the CPU flash-attention kernels with torch's own
    attention formulas: torch registers them for the CUDA kernels only and counts CPU attention as 0."""
    aten = torch.ops.aten
    cpu = {
        aten._scaled_dot_product_flash_attention_for_cpu: _sdpa,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
    }
    return FlopCounterMode(display=False, custom_mapping=cpu)


def measure(fn: Callable[[], Tensor], params: Sequence[Tensor]) -> tuple[int, int]:
    """FlopCounterMode totals of out = fn() (forward) and of the gradient of out.sum() with respect to
    params (backward; torch.autograd.grad, so no parameter's .grad is touched)."""
    with torch.enable_grad():
        with flop_counter() as counter:
            out = fn()
        fwd = counter.get_total_flops()
        trained = [p for p in params if p.requires_grad]
        if not trained or not out.requires_grad:
            return fwd, 0
        with flop_counter() as counter:
            torch.autograd.grad(out.float().sum(), trained, allow_unused=True)
    return fwd, counter.get_total_flops()


def measure_policy_flops(policy: Any, prompt: str) -> tuple[int, int]:
    """(forward, backward) FLOPs of one network row, MEASURED with FlopCounterMode (not derived from shapes):
    policy.velocity on one probe latent row [1, *latent_shape] at sigma 0.5 with policy.encode([prompt]),
    backward into policy.trainable_parameters(); both divided by policy.evals_per_row (true CFG runs two
    network rows per latent row)."""
    cond = policy.encode([prompt])
    device = next(iter(cond.values())).device
    x = torch.randn(1, *policy.latent_shape, generator=torch.Generator().manual_seed(0)).to(device)
    sigma = torch.full((1,), 0.5, device=device)
    fwd, bwd = measure(lambda: policy.velocity(x, sigma, cond), policy.trainable_parameters())
    rows = int(policy.evals_per_row)
    return fwd // rows, bwd // rows


# Dense bf16 tensor-core peaks (TFLOP/s, the vendors' datasheets, without sparsity) of the GPUs users train on,
# matched against torch.cuda.get_device_name; model FLOPs utilisation is reported only on these.
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A6000": 155.0, "4090": 165.0, "L4": 121.0}


def device_peak_flops(device: str) -> float | None:
    """The device's peak FLOP/s, or None where it is not known (the CPU, an unlisted GPU)."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    name = torch.cuda.get_device_name(torch.device(device))
    return next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in name), None)

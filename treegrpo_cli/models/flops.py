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

Each model's formula lives with its adapter, built on the `Ledger` and `formula` here: `dit_flops` (models/dit.py),
`flux_flops` (flux.py), `sd3_flops` (sd3.py), `qwen_image_flops` (qwenimage.py), `flux2_flops` (flux2.py),
`wan_flops` (wan.py); the adapter's `flop_formula()` names it. `measure` and `measure_policy_flops` run
FlopCounterMode itself (the fallback of the adapters with no formula: pixel, SD1.5). This module imports no
adapter.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

TIME_FEATURES = 256  # diffusers' Timesteps(num_channels=256) in the time and guidance embedders


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


def formula(defaults: dict[str, Any], default_targets: Targets, body: Callable[..., int]) -> Formula:
    """A FLOP formula of a diffusers denoiser: `count(config, image_tokens, text_tokens, rank=None, targets=None,
    recompute=False)` -> (forward, backward) of one network row. config: the model's config (a mapping or an
    object), read over `defaults`, its constructor's; rank None: full fine-tuning, else LoRA of that rank on
    `targets` (None: `default_targets`, the adapter's LoRA defaults); recompute: gradient checkpointing, whose
    backward runs every block's forward again (True), or that share of the blocks' forward FLOPs
    (policy.checkpoint_blocks; the blocks are taken as equal in cost). body(led, cfg, N, T) counts the network
    into the ledger and returns the forward FLOPs of the checkpointed blocks."""

    def count(
        config: Any,
        image_tokens: int,
        text_tokens: int,
        rank: int | None = None,
        targets: Targets = None,
        recompute: float = 0.0,
    ) -> tuple[int, int]:
        get = config.get if isinstance(config, Mapping) else lambda k, v: getattr(config, k, v)
        cfg = {k: get(k, v) for k, v in defaults.items()}
        if rank is not None and targets is None:
            targets = default_targets
        led = Ledger(rank, targets if isinstance(targets, str) else tuple(targets or ()))
        blocks = body(led, cfg, image_tokens, text_tokens)
        return led.fwd, led.bwd + round(blocks * float(recompute))

    return count


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

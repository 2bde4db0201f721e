"""FLUX.1 (dev and schnell) through diffusers' FluxPipeline.

* Denoiser: FluxTransformer2DModel, a rectified-flow transformer predicting the velocity; called with
  timestep = sigma (the pipeline's t/1000) and, for FLUX.1-dev, the distilled guidance embedding
  (3.5 by default, no true CFG: one forward per row), as DanceGRPO, BranchGRPO and MixGRPO do.
* Latents: the policy's latent is the UNPACKED VAE latent [16, H/8, W/8], so trees store image-like
  tensors as for SD3 and SD. velocity() packs 2x2 patches into tokens [(H/16)(W/16), 64] with their
  (0, row, col) position ids before the transformer and unpacks its output. Packing is a permutation,
  so the Gaussian noise, the SDE step and the per-element log-prob are the same either way.
* Text: CLIP-L pooled output [768] and T5-XXL hidden states [L, 4096] (L = 512 for dev, 256 for schnell),
  txt_ids all zero, as FluxPipeline.encode_prompt returns them.
* Time grid: the presets' shifted grid (s = 3, the FLUX GRPO references), FlowSDE.
* Decode: vae.decode(latent / scaling_factor + shift_factor) (0.3611 and 0.1159 for FLUX.1).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Conditions
from .diffusers_base import DiffusersPolicy, LoraDefaults
from .flops import Formula

# flow_grpo scripts/train_flux.py: r 64, alpha 128, Gaussian init, attention and feed-forward projections
FLUX_LORA = LoraDefaults(
    64,
    128.0,
    (
        "attn.to_k",
        "attn.to_q",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "ff.net.0.proj",
        "ff.net.2",
        "ff_context.net.0.proj",
        "ff_context.net.2",
    ),
)


def pack(x: Tensor) -> Tensor:
    """[B, C, h, w] -> [B, (h/2)(w/2), 4C]: every 2x2 patch one token (FluxPipeline._pack_latents)."""
    B, C, h, w = x.shape
    x = x.view(B, C, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)  # [B, h/2, w/2, C, 2, 2]
    return x.reshape(B, (h // 2) * (w // 2), C * 4)


def unpack(tokens: Tensor, h: int, w: int) -> Tensor:
    """[B, (h/2)(w/2), 4C] -> [B, C, h, w] (the inverse of pack)."""
    B, _, D = tokens.shape
    x = tokens.view(B, h // 2, w // 2, D // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)  # [B, C, h/2, 2, w/2, 2]
    return x.reshape(B, D // 4, h, w)


def image_ids(h2: int, w2: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """[(h2*w2), 3] position ids (0, row, col) of the packed tokens, row-major."""
    ids = torch.zeros(h2, w2, 3, device=device, dtype=dtype)
    ids[..., 1] = torch.arange(h2, device=device, dtype=dtype)[:, None]
    ids[..., 2] = torch.arange(w2, device=device, dtype=dtype)[None, :]
    return ids.reshape(h2 * w2, 3)


class FluxPolicy(DiffusersPolicy):
    adapter = "flux"
    denoiser_attr = "transformer"
    text_encoder_attrs = ("text_encoder", "text_encoder_2")
    lora_defaults = FLUX_LORA
    default_guidance = 3.5
    default_resolution = 720

    @property
    def distilled_guidance(self) -> bool:
        return bool(self.denoiser.config.guidance_embeds)  # dev: yes; schnell: no

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor)
        side = self._check_resolution(sf * 2) // sf
        return (self.denoiser.config.in_channels // 4, side, side)

    def max_sequence_length(self) -> int:
        return self.opts.max_sequence_length or (512 if self.distilled_guidance else 256)

    def flop_formula(self) -> Formula:
        from .flops import flux_flops

        return flux_flops

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length()
        )
        return {"prompt_embeds": embeds, "pooled": pooled}  # [n, L, 4096], [n, 768]

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32."""
        B, _, h, w = x.shape
        dt = self.dtype
        emb = cond["prompt_embeds"]  # [B, L, D]
        guidance = (
            torch.full((B,), self.guidance, device=x.device, dtype=torch.float32)
            if net.config.guidance_embeds
            else None
        )
        out = net(
            hidden_states=pack(x.to(dt)),
            timestep=sigma.to(dt),
            guidance=guidance,
            pooled_projections=cond["pooled"].to(dt),
            encoder_hidden_states=emb.to(dt),
            txt_ids=torch.zeros(emb.shape[1], 3, device=x.device, dtype=dt),
            img_ids=image_ids(h // 2, w // 2, x.device, dt),
            return_dict=False,
        )[0]
        return unpack(out.float(), h, w)

    def _vae_in(self, latents: Tensor) -> Tensor:
        cfg = self.pipe.vae.config
        return latents / cfg.scaling_factor + cfg.shift_factor

    def describe(self) -> dict:
        return {
            **super().describe(),
            "distilled_guidance": self.distilled_guidance,
            "max_sequence_length": self.max_sequence_length(),
        }

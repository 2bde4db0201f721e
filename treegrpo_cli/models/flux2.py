"""FLUX.2 [dev] and [klein] through diffusers' Flux2Pipeline and Flux2KleinPipeline.

* Denoiser: Flux2Transformer2DModel (8 double-stream and 48 single-stream blocks for [dev], 32B
  parameters; 5 and 20 for [klein] 4B) predicting the flow velocity, called with timestep = sigma.
* Guidance as each model samples: [dev] has a distilled guidance embedding (4.0, one forward per row);
  [klein] base models use true classifier-free guidance against the empty prompt (4.0, 2 evaluations per
  row); the step-distilled [klein] models (model_index `is_distilled`) sample with no guidance at all.
* Latents: the policy's latent is the pipeline's own sampling space, the VAE latent patchified 2x2 into
  [128, H/16, W/16] and normalised by the VAE's batch-norm statistics, so noise and log-probs live where the
  pipeline draws them. velocity() flattens it into [(H/16)(W/16), 128] tokens with (t, h, w, l) = (0, row,
  col, 0) position ids; text tokens get (0, 0, 0, l).
* Text: [dev] Mistral-Small-3.1 hidden states of layers 10, 20, 30, [klein] Qwen3 layers 9, 18, 27,
  concatenated per token ([512, 3 x width]), padded to max_sequence_length as the pipelines do.
* Time grid: the scheduler's own (sampler.grid = "model"): FLUX.2's empirical shift mu(token count, steps).
* Decode: x * sqrt(bn.running_var + eps) + bn.running_mean, un-patchify, vae.decode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Conditions
from .diffusers_base import DiffusersPolicy, LoraDefaults
from .flops import Formula

# DiffSynth-Studio's FLUX.2 LoRA recipe (examples/flux2/model_training/lora): rank 32, alpha = rank, every
# attention projection and feed-forward layer of the double-stream blocks, and the single-stream blocks' fused
# qkv-and-MLP input and their output projections (a regular expression: peft matches it on the full name)
FLUX2_LORA = LoraDefaults(
    32,
    32.0,
    r".*(\.attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out|to_qkv_mlp_proj)"
    r"|\.ff(_context)?\.linear_(in|out)|single_transformer_blocks\.\d+\.attn\.to_out)",
)


def flatten(x: Tensor) -> Tensor:
    """[B, C, h, w] -> [B, h*w, C], row-major tokens (Flux2Pipeline._pack_latents)."""
    return x.flatten(2).transpose(1, 2)


def unflatten(tokens: Tensor, h: int, w: int) -> Tensor:
    """[B, h*w, C] -> [B, C, h, w] (the inverse of flatten)."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


def positions(B: int, h: int, w: int, text: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """([B, h*w, 4] image ids (0, row, col, 0), [B, text, 4] text ids (0, 0, 0, l))."""
    img = torch.zeros(h, w, 4, device=device, dtype=torch.long)
    img[..., 1] = torch.arange(h, device=device)[:, None]
    img[..., 2] = torch.arange(w, device=device)[None, :]
    txt = torch.zeros(text, 4, device=device, dtype=torch.long)
    txt[:, 3] = torch.arange(text, device=device)
    return img.reshape(1, h * w, 4).expand(B, -1, -1), txt.expand(B, -1, -1)


def empirical_mu(tokens: int, steps: int) -> float:
    """FLUX.2's shift: two lines in the token count, fitted at 10 and 200 steps, interpolated linearly in the
    step count (the token count alone above 4300 tokens)."""
    at200 = 1.6927e-4 * tokens + 0.45666666
    if tokens > 4300:
        return at200
    at10 = 8.73809524e-05 * tokens + 1.89833333
    return at10 + (at200 - at10) * (steps - 10) / 190.0


class Flux2Policy(DiffusersPolicy):
    adapter = "flux2"
    text_encoder_attrs = ("text_encoder",)
    lora_defaults = FLUX2_LORA
    default_guidance = 4.0
    default_resolution = 1024

    @property
    def distilled_guidance(self) -> bool:
        return bool(self.denoiser.config.guidance_embeds)  # [dev]: yes; [klein]: no

    @property
    def step_distilled(self) -> bool:
        return bool(getattr(self.pipe.config, "is_distilled", False))  # the 4-step [klein] models

    @property
    def uses_negative(self) -> bool:  # type: ignore[override]
        return not self.distilled_guidance and not self.step_distilled

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor) * 2
        side = self._check_resolution(sf) // sf
        return (self.denoiser.config.in_channels, side, side)

    def image_tokens(self) -> int:
        return self.latent_shape[1] * self.latent_shape[2]

    def shift_mu(self, steps: int) -> float:
        return empirical_mu(self.image_tokens(), steps)

    def flop_formula(self) -> Formula:
        from .flops_models import flux2_flops

        return flux2_flops

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length()
        )
        return {"prompt_embeds": embeds}  # [n, L, 3 x width]

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32 (guided where the model is)."""
        B, _, h, w = x.shape
        emb = cond["prompt_embeds"]
        cfg = self.uses_negative and self.guidance != 1.0
        if cfg:
            emb, x, sigma = (
                torch.cat([emb, self.negative(B)["prompt_embeds"]]),
                torch.cat([x, x]),
                torch.cat([sigma] * 2),
            )
        rows = x.shape[0]
        img_ids, txt_ids = positions(rows, h, w, emb.shape[1], x.device)
        guidance = torch.full((rows,), self.guidance, device=x.device) if self.distilled_guidance else None
        out = net(
            hidden_states=flatten(x).to(self.dtype),
            timestep=sigma.to(self.dtype),
            guidance=guidance,
            encoder_hidden_states=emb.to(self.dtype),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        v = unflatten(out.float(), h, w)
        return self.guide(*v.chunk(2)) if cfg else v

    def _vae_in(self, latents: Tensor) -> Tensor:
        """Normalised patchified latents [B, 4C, h, w] -> the VAE's [B, C, 2h, 2w]."""
        vae = self.pipe.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(latents)
        z = latents * std + mean
        B, C4, h, w = z.shape
        return z.reshape(B, C4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(B, C4 // 4, 2 * h, 2 * w)

    def describe(self) -> dict:
        return {
            **super().describe(),
            "distilled_guidance": self.distilled_guidance,
            "step_distilled": self.step_distilled,
            "max_sequence_length": self.max_sequence_length(),
        }

"""Wan2.1 / Wan2.2 text-to-video through diffusers' WanPipeline.

* Denoiser: WanTransformer3DModel predicting the flow velocity of a video latent [16, F, H/8, W/8]
  (F = (frames - 1) / 4 + 1: the VAE's 4x temporal and 8x spatial compression), patchified (1, 2, 2) inside
  the model; called with timestep = 1000 sigma as the pipeline does. The engine sees a rank-5 latent and
  does not care: noise, the SDE step and the per-element log-prob are the same on any shape.
* True classifier-free guidance (5.0, the pipeline's and the model card's) against the negative prompt (the
  pipeline's default, the empty prompt), both halves in one batched forward, as the image adapters do.
* Text: UMT5-XXL last hidden states [L, 4096], each prompt's tokens then zeros up to max_sequence_length (226),
  as WanPipeline pads them; encoded once per prompt and shared by every node of a tree.
* Time grid: the presets' shifted grid with the model's flow shift (the scheduler's `flow_shift` or `shift`:
  3.0 for 480p, 5.0 for 720p; models/hub.py adapter_defaults), FlowSDE; Wan's own UniPC multistep sampler is
  not a one-step kernel, so the grid is the flow-matching Euler one DanceGRPO and BranchGRPO train Wan with.
* Decode: z * latents_std + latents_mean (the VAE config's per-channel statistics), the causal video VAE:
  videos [B, 3, frames, H, W] in [0, 1].
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Conditions
from .diffusers_base import DiffusersPolicy, LoraDefaults
from .flops import Formula

# DiffSynth-Studio's Wan LoRA recipe (q, k, v, o and the feed-forward of every block): rank 32, alpha = rank,
# the self- and cross-attention projections and both feed-forward layers
WAN_LORA = LoraDefaults(32, 32.0, ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"))


class WanPolicy(DiffusersPolicy):
    adapter = "wan"
    uses_negative = True
    default_guidance = 5.0
    text_encoder_attrs = ("text_encoder",)
    lora_defaults = WAN_LORA
    default_resolution = 480
    default_text_tokens = 226  # UMT5 tokens, as WanPipeline pads them
    default_frames = 33  # DanceGRPO's and BranchGRPO's Wan2.1 clips

    @property
    def frames(self) -> int:
        return int(self.opts.frames or self.default_frames)

    def _latent_shape(self) -> tuple[int, ...]:
        cfg = getattr(self.pipe, "config", None)
        if getattr(self.pipe, "transformer_2", None) is not None or getattr(cfg, "expand_timesteps", False):
            from ..errors import ConfigError

            raise ConfigError(f"{self.name}: Wan2.2's two-expert and TI2V pipelines are not supported yet (Wan2.1 is)")
        vae = self.pipe.vae.config
        st, ss = int(vae.scale_factor_temporal), int(vae.scale_factor_spatial)
        if (self.frames - 1) % st:
            raise_frames(self.frames, st, self.name)
        side = self._check_resolution(ss * int(self.denoiser.config.patch_size[-1])) // ss
        return (int(self.denoiser.config.in_channels), (self.frames - 1) // st + 1, side, side)

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length(),
            device=self.device,
        )
        return {"prompt_embeds": embeds}  # [n, L, 4096]

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, F, h, w] fp32, sigma [B] -> guided velocity [B, C, F, h, w] fp32."""
        B, emb = x.shape[0], cond["prompt_embeds"]
        cfg = self.guidance != 1.0
        if cfg:
            emb, x, sigma = (
                torch.cat([emb, self.negative(B)["prompt_embeds"]]),
                torch.cat([x, x]),
                torch.cat([sigma] * 2),
            )
        out = net(
            hidden_states=x.to(self.dtype),
            timestep=sigma.float() * 1000,
            encoder_hidden_states=emb.to(self.dtype),
            return_dict=False,
        )[0].float()
        return self.guide(*out.chunk(2)) if cfg else out

    def image_tokens(self) -> int:
        _, f, h, w = self.latent_shape
        pt, ph, pw = self.denoiser.config.patch_size
        return (f // pt) * (h // ph) * (w // pw)

    def flop_formula(self) -> Formula:
        from .flops_models import wan_flops

        return wan_flops

    def _vae_in(self, latents: Tensor) -> Tensor:
        c = self.pipe.vae.config
        shape = (1, -1, 1, 1, 1)
        mean = torch.tensor(c.latents_mean, device=latents.device).view(shape)
        std = torch.tensor(c.latents_std, device=latents.device).view(shape)
        return latents * std + mean

    def describe(self) -> dict:
        return {**super().describe(), "frames": self.frames, "max_sequence_length": self.max_sequence_length()}


def raise_frames(frames: int, stride: int, name: str) -> None:
    from ..errors import ConfigError

    raise ConfigError(f"policy.frames {frames} must be 1 more than a multiple of {stride} for {name} (e.g. 33, 81)")

"""Stable Diffusion 3 / 3.5 through diffusers' StableDiffusion3Pipeline.

* Denoiser: SD3Transformer2DModel (MMDiT) predicting the flow velocity, called with timestep
  sigma * 1000 as the pipeline does.
* True classifier-free guidance (4.5 by default, Flow-GRPO / TreeGRPO): the conditional and the
  empty-prompt rows go through the transformer in one batch, in sampling and in the training
  forward alike, and the guided velocity v_u + w (v_c - v_u) is the policy whose log-probs are
  trained (2 model evaluations per row), its gradient through both halves; `policy.cfg_uncond = "detach"`
  stops it at the unconditional half, as Flow-GRPO's released code does.
* Text: CLIP-L and CLIP-G (penultimate hidden states, concatenated and zero-padded to the T5 width)
  followed by T5-XXL tokens [77 + L, 4096], and the two pooled projections [2048], as
  StableDiffusion3Pipeline.encode_prompt returns them; the empty prompt gives the negative embeddings.
* Time grid: diffusers' FlowMatchEuler grid with the scheduler's own shift (3.0 for SD3.5), set
  through the adapter's config defaults (models/hub.py adapter_defaults), FlowSDE.
* Latents [16, H/8, W/8]; decode: vae.decode(latent / scaling_factor + shift_factor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .base import Conditions
from .diffusers_base import DiffusersPolicy, LoraDefaults
from .flops import Formula

# flow_grpo scripts/train_sd3.py: r 32, alpha 64, Gaussian init, the joint attention projections
SD3_LORA = LoraDefaults(
    32,
    64.0,
    (
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "attn.to_k",
        "attn.to_out.0",
        "attn.to_q",
        "attn.to_v",
    ),
)


class SD3Policy(DiffusersPolicy):
    adapter = "sd3"
    denoiser_attr = "transformer"
    text_encoder_attrs = ("text_encoder", "text_encoder_2", "text_encoder_3")
    lora_defaults = SD3_LORA
    default_guidance = 4.5
    default_resolution = 512
    uses_negative = True
    default_text_tokens = 256

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor)
        side = self._check_resolution(sf * int(self.denoiser.config.patch_size)) // sf
        return (self.denoiser.config.in_channels, side, side)

    def flop_formula(self) -> Formula:
        """With true CFG a latent row is two network rows in one batched forward; `cfg_uncond = "detach"` zeroes
        the unconditional half's gradient but the batched backward's products keep their size: the same cost."""
        from .flops import sd3_flops

        return sd3_flops

    def flop_tokens(self) -> tuple[int, int]:
        """The latent's patches and 77 CLIP + max_sequence_length T5 tokens."""
        p = int(self.denoiser.config.patch_size)
        return (self.latent_shape[1] // p) * (self.latent_shape[2] // p), 77 + self.max_sequence_length()

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length(),
        )
        return {"prompt_embeds": embeds, "pooled": pooled}  # [n, 77 + L, 4096], [n, 2048]

    def model_output(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> guided velocity [B, C, h, w] fp32."""
        B, dt = x.shape[0], self.dtype
        emb, pooled = cond["prompt_embeds"], cond["pooled"]
        if self.guidance == 1.0:
            return net(
                hidden_states=x.to(dt),
                timestep=sigma.float() * 1000,
                encoder_hidden_states=emb.to(dt),
                pooled_projections=pooled.to(dt),
                return_dict=False,
            )[0].float()
        neg = self.negative(B)
        out = net(
            hidden_states=torch.cat([x, x]).to(dt),
            timestep=torch.cat([sigma, sigma]).float() * 1000,
            encoder_hidden_states=torch.cat([emb, neg["prompt_embeds"]]).to(dt),
            pooled_projections=torch.cat([pooled, neg["pooled"]]).to(dt),
            return_dict=False,
        )[0]
        v_c, v_u = out.float().chunk(2)  # [B, C, h, w] each
        return self.guide(v_c, v_u)

    def _vae_in(self, latents: Tensor) -> Tensor:
        cfg = self.pipe.vae.config
        return latents / cfg.scaling_factor + cfg.shift_factor

    def describe(self) -> dict:
        return {**super().describe(), "max_sequence_length": self.max_sequence_length()}

"""Stable Diffusion 1.x through diffusers' StableDiffusionPipeline: the diffusion (epsilon-prediction)
case, trained as DDPO does (Black et al. 2023, arXiv 2305.13301).

* Denoiser: UNet2DConditionModel predicting the noise eps at an integer timestep t in [0, 1000).
* Kernel: engine.sde.DDIMKernel, the DDIM step with eta (policy.ddim_eta, 1.0 as in DDPO) and its
  Gaussian log-prob; timesteps from diffusers' DDIMScheduler built from the model's scheduler config
  (SD1.5 ships a PNDM config: same betas, steps_offset 1, set_alpha_to_one false). The tree's sigma
  column holds t/1000, which velocity() turns back into t. sampler.grid, shift and noise are flow
  settings and do not apply; sampler.steps, decode and log_prob_reduction do.
* True classifier-free guidance (5.0 by default, DDPO) with the empty prompt, both halves in one batch.
* Text: CLIP-L last hidden states [77, 768].
* Latents [4, H/8, W/8]; decode: vae.decode(latent / scaling_factor) (0.18215).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..engine.sde import DDIMKernel, SamplerConfig
from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .lora import LoraDefaults
from .releases import ReleaseSpec

# TRL's DDPO Stable Diffusion pipeline (use_lora): r 4, alpha 4, Gaussian init, the attention projections
SD_LORA = LoraDefaults(4, 4.0, ("to_k", "to_q", "to_v", "to_out.0"))


class SDPolicy(DiffusersPolicy):
    card = AdapterCard(
        name="sd",
        family="SD1.5",
        pipelines=("StableDiffusionPipeline",),
        releases={"sd1.5": "stable-diffusion-v1-5/stable-diffusion-v1-5"},
        defaults={"rollout.max_batch": 16},
        predicts="noise (epsilon)",
        sampling="DDIMKernel, eta `policy.ddim_eta` (1.0, DDPO)",
    )
    # the safety checker is never loaded (nor its feature extractor)
    load_options = {"safety_checker": None, "feature_extractor": None, "requires_safety_checker": False}
    denoiser_attr = "unet"
    text_encoder_attrs = ("text_encoder",)
    lora_defaults = SD_LORA
    default_guidance = 5.0
    default_resolution = 512
    uses_negative = True

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor)
        side = self._check_resolution(sf) // sf
        return (self.denoiser.config.in_channels, side, side)

    @property
    def num_train_timesteps(self) -> int:
        return int(self.pipe.scheduler.config.num_train_timesteps)

    def kernel(self, cfg: SamplerConfig) -> DDIMKernel:
        """DDIM on the model's noise schedule, T = sampler.steps, eta = policy.ddim_eta."""
        from diffusers import DDIMScheduler

        ddim = DDIMScheduler.from_config(self.pipe.scheduler.config)
        ddim.set_timesteps(cfg.steps)
        clip = float(ddim.config.clip_sample_range) if ddim.config.clip_sample else None
        return DDIMKernel(
            cfg,
            ddim.alphas_cumprod,
            ddim.timesteps,
            self.num_train_timesteps,
            float(ddim.final_alpha_cumprod),
            self.opts.ddim_eta,
            ddim.config.prediction_type,
            clip,
        )

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"prompt_embeds": embeds}  # [n, 77, 768]

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] = t/1000 -> noise prediction [B, C, h, w] fp32."""
        t = (sigma.double() * self.num_train_timesteps).round().long()  # [B]
        emb = cond["prompt_embeds"].to(self.dtype)
        return net(x.to(self.dtype), t, encoder_hidden_states=emb, return_dict=False)[0].float()

    def _vae_in(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor

    def _lora_layers(self, peft_state: dict[str, Tensor]) -> dict[str, Tensor]:
        from diffusers.utils import convert_state_dict_to_diffusers

        return convert_state_dict_to_diffusers(peft_state)  # as diffusers' train_text_to_image_lora.py

    def describe(self) -> dict:
        return {**super().describe(), "kernel": "ddim", "ddim_eta": self.opts.ddim_eta}


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
# the scheduler config SD1.5 ships (PNDM; the adapter samples with DDIM on its betas)
_PNDM = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
}
_SD15 = ReleaseSpec(
    transformer="UNet2DConditionModel",
    config={
        "sample_size": 64,
        "in_channels": 4,
        "out_channels": 4,
        "layers_per_block": 2,
        "block_out_channels": [320, 640, 1280, 1280],
        "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
        "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
        "cross_attention_dim": 768,
        "attention_head_dim": 8,
    },
    tiny={
        "block_out_channels": [8, 16],
        "layers_per_block": 1,
        "sample_size": 8,
        "in_channels": 4,
        "out_channels": 4,
        "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
        "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
        "cross_attention_dim": 32,
        "norm_num_groups": 4,
        "attention_head_dim": 4,
    },
    embeds={"prompt_embeds": [77, 768]},
    text_fixed=True,  # CLIP's 77 tokens, whatever max_sequence_length
    resolution=512,
    guidance="true CFG 5.0",
    text_encoders={"CLIP-L": 0.12},
    pipeline="StableDiffusionPipeline",
    vae={
        "class": "AutoencoderKL",
        "config": {
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4,
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "act_fn": "silu",
            "norm_num_groups": 32,
            "latent_channels": 4,
            "sample_size": 512,
            "scaling_factor": 0.18215,
        },
        "tiny": {
            "down_block_types": ["DownEncoderBlock2D"] * 2,
            "up_block_types": ["UpDecoderBlock2D"] * 2,
            "block_out_channels": [8, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "latent_channels": 4,
            "sample_size": 32,
            "scaling_factor": 0.18215,
        },
    },
    scheduler={"class": "PNDMScheduler", "config": {"num_train_timesteps": 1000, **_PNDM}},
    denoiser_b=0.86,
)
RELEASES = {"sd1.5": _SD15}


# -- the tests' tiny pipeline (models/tiny.py; tests/tinypipes.py collects it) -----------------------------------
def tiny_sd() -> Any:
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    ct = tiny.clip_tokenizer()
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=tiny.H,
        norm_num_groups=4,
        attention_head_dim=4,
    )
    return StableDiffusionPipeline(
        vae=tiny.vae(0.18215, None),
        text_encoder=CLIPTextModel(tiny.clip_config(ct)),
        tokenizer=ct,
        unet=unet,
        scheduler=PNDMScheduler(**_PNDM),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


TINY_PIPELINES = {"sd": tiny_sd}

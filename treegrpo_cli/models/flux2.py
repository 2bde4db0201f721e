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

from dataclasses import replace
from functools import partial
from typing import Any

import torch
from torch import Tensor

from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import Formula, Ledger, formula
from .lora import LoraDefaults
from .releases import ReleaseSpec

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
    card = AdapterCard(
        name="flux2",
        family="FLUX.2",
        pipelines=("Flux2Pipeline", "Flux2KleinPipeline"),
        releases={
            "flux2-dev": "black-forest-labs/FLUX.2-dev",
            "flux2-klein-4b": "black-forest-labs/FLUX.2-klein-4B",
            "flux2-klein-9b": "black-forest-labs/FLUX.2-klein-9B",
            "flux2-klein-base-4b": "black-forest-labs/FLUX.2-klein-base-4B",
            "flux2-klein-base-9b": "black-forest-labs/FLUX.2-klein-base-9B",
        },
        defaults={"rollout.max_batch": 8, "policy.gradient_checkpointing": True},
        grid="model",
        # the FLUX non-commercial license's releases are gated on the hub; [klein] 4B (Apache 2.0) is open
        gated=("flux2-dev", "flux2-klein-9b", "flux2-klein-base-9b"),
        sampling='FlowSDE on FLUX.2\'s empirical-shift grid (`sampler.grid = "model"`)',
    )
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
        return flux2_flops

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length()
        )
        return {"prompt_embeds": embeds}  # [n, L, 3 x width]

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32."""
        B, _, h, w = x.shape
        emb = cond["prompt_embeds"]
        img_ids, txt_ids = positions(B, h, w, emb.shape[1], x.device)
        guidance = torch.full((B,), self.guidance, device=x.device) if self.distilled_guidance else None
        out = net(
            hidden_states=flatten(x).to(self.dtype),
            timestep=sigma.to(self.dtype),
            guidance=guidance,
            encoder_hidden_states=emb.to(self.dtype),
            txt_ids=txt_ids,
            img_ids=img_ids,
            return_dict=False,
        )[0]
        return unflatten(out.float(), h, w)

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


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
FLUX2_DEFAULTS: dict[str, Any] = {  # Flux2Transformer2DModel's constructor defaults (FLUX.2 [dev])
    "patch_size": 1,
    "in_channels": 128,
    "out_channels": None,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "guidance_embeds": True,
}


def _flux2(led: Ledger, cfg: dict[str, Any], N: int, T: int) -> int:
    """Flux2Transformer2DModel (FLUX.2 [dev], [klein]): N patchified latent tokens, T text tokens."""
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    M, F = int(D * cfg["mlp_ratio"]), cfg["timestep_guidance_channels"]  # SwiGLU width; time features
    img = led.linear("x_embedder", N, cfg["in_channels"], D, x_grad=False)
    txt = led.linear("context_embedder", T, cfg["joint_attention_dim"], D, x_grad=False)
    pre = "time_guidance_embed."
    temb = led.linear(
        pre + "timestep_embedder.linear_2", 1, D, D, led.linear(pre + "timestep_embedder.linear_1", 1, F, D, False)
    )
    if cfg["guidance_embeds"]:
        g = led.linear(pre + "guidance_embedder.linear_1", 1, F, D, x_grad=False)
        temb = led.linear(pre + "guidance_embedder.linear_2", 1, D, D, g) or temb
    # the modulations are computed once and shared by every block of a kind
    mod_img = led.linear("double_stream_modulation_img.linear", 1, D, 6 * D, temb)
    mod_txt = led.linear("double_stream_modulation_txt.linear", 1, D, 6 * D, temb)
    mod_single = led.linear("single_stream_modulation.linear", 1, D, 3 * D, temb)
    start = led.fwd
    for i in range(cfg["num_layers"]):
        pre = f"transformer_blocks.{i}."
        x, y = img or mod_img, txt or mod_txt
        qkv = [led.linear(pre + f"attn.to_{n}", N, D, D, x) for n in "qkv"]
        qkv += [led.linear(pre + f"attn.add_{n}_proj", T, D, D, y) for n in "qkv"]
        led.attention(T + N, D, any(qkv))
        img = led.linear(pre + "attn.to_out.0", N, D, D, any(qkv)) or x
        txt = led.linear(pre + "attn.to_add_out", T, D, D, any(qkv)) or y
        img = led.linear(pre + "ff.linear_out", N, M, D, led.linear(pre + "ff.linear_in", N, D, 2 * M, img)) or img
        ctx = led.linear(pre + "ff_context.linear_in", T, D, 2 * M, txt)
        txt = led.linear(pre + "ff_context.linear_out", T, M, D, ctx) or txt
    h = img or txt
    for i in range(cfg["num_single_layers"]):  # over cat(text, image) [T + N, D]
        pre = f"single_transformer_blocks.{i}.attn."
        x = h or mod_single
        fused = led.linear(pre + "to_qkv_mlp_proj", T + N, D, 3 * D + 2 * M, x)  # q, k, v and the SwiGLU input
        led.attention(T + N, D, fused)
        h = led.linear(pre + "to_out", T + N, D + M, D, fused) or x
    blocks = led.fwd - start
    led.linear("norm_out.linear", 1, D, 2 * D, temb)
    led.linear("proj_out", N, D, cfg["patch_size"] ** 2 * (cfg["out_channels"] or cfg["in_channels"]), h)
    return blocks


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward) of one
# row of FLUX.2 ([dev], [klein]); LoRA on FLUX2_LORA's targets unless told
flux2_flops = formula(FLUX2_DEFAULTS, FLUX2_LORA.targets, _flux2)


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
_DEV = ReleaseSpec(
    transformer="Flux2Transformer2DModel",
    config={
        "patch_size": 1,
        "in_channels": 128,
        "num_layers": 8,
        "num_single_layers": 48,
        "attention_head_dim": 128,
        "num_attention_heads": 48,
        "joint_attention_dim": 15360,
        "timestep_guidance_channels": 256,
        "mlp_ratio": 3.0,
        "axes_dims_rope": [32, 32, 32, 32],
        "guidance_embeds": True,
    },
    tiny={
        "patch_size": 1,
        "in_channels": 128,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 48,
        "timestep_guidance_channels": 16,
        "mlp_ratio": 3.0,
        "axes_dims_rope": [4, 4, 4, 4],
        "guidance_embeds": True,
    },
    embeds={"prompt_embeds": [512, 15360]},  # three of the text encoder's layers, concatenated per token
    resolution=1024,
    guidance="embedded 4.0",
    text_encoders={"Mistral-Small-3.1-24B": 24.0},
    pipeline="Flux2Pipeline",
    vae={
        "class": "AutoencoderKLFlux2",
        "config": {},
        "tiny": {
            "down_block_types": ["DownEncoderBlock2D"] * 2,
            "up_block_types": ["UpDecoderBlock2D"] * 2,
            "block_out_channels": [8, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "latent_channels": 32,
            "sample_size": 32,
        },
    },
    scheduler={
        "class": "FlowMatchEulerDiscreteScheduler",
        "config": {
            "num_train_timesteps": 1000,
            "shift": 3.0,
            "use_dynamic_shifting": True,
            "base_shift": 0.5,
            "max_shift": 1.15,
            "base_image_seq_len": 256,
            "max_image_seq_len": 4096,
            "time_shift_type": "exponential",
        },
    },
    denoiser_b=32.22,
)
_KLEIN_4B = replace(  # Qwen3-4B's text, no guidance embedding, step-distilled
    _DEV,
    config={
        **_DEV.config,
        "num_layers": 5,
        "num_single_layers": 20,
        "num_attention_heads": 24,
        "joint_attention_dim": 7680,
        "guidance_embeds": False,
    },
    tiny={**_DEV.tiny, "guidance_embeds": False},
    embeds={"prompt_embeds": [512, 7680]},
    guidance="none (4-step distilled)",
    text_encoders={"Qwen3-4B": 4.02},
    pipeline="Flux2KleinPipeline",
    pipeline_config={"is_distilled": True},
    denoiser_b=3.88,
)
_KLEIN_9B = replace(  # Qwen3-8B's text
    _KLEIN_4B,
    config={
        **_KLEIN_4B.config,
        "num_layers": 8,
        "num_single_layers": 24,
        "num_attention_heads": 32,
        "joint_attention_dim": 12288,
    },
    embeds={"prompt_embeds": [512, 12288]},
    text_encoders={"Qwen3-8B": 8.19},
    denoiser_b=9.08,
)
RELEASES = {
    "flux2-dev": _DEV,
    "flux2-klein-4b": _KLEIN_4B,
    "flux2-klein-9b": _KLEIN_9B,
    # the undistilled [klein] bases: true CFG
    "flux2-klein-base-4b": replace(_KLEIN_4B, guidance="true CFG 4.0", pipeline_config={"is_distilled": False}),
    "flux2-klein-base-9b": replace(_KLEIN_9B, guidance="true CFG 4.0", pipeline_config={"is_distilled": False}),
}


# -- the tests' tiny pipelines (models/tiny.py; tests/tinypipes.py collects them) --------------------------------
def flux2_vae() -> Any:
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(**tiny.VAE_BLOCKS)
    g = torch.Generator().manual_seed(8)  # batch-norm statistics that are not the identity
    vae.bn.running_mean.copy_(torch.randn(16, generator=g) * 0.3)
    vae.bn.running_var.copy_(1 + torch.rand(16, generator=g))
    return vae


def flux2_transformer(text_dim: int, guidance: bool) -> Any:
    from diffusers import Flux2Transformer2DModel

    shape = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16)
    width = dict(num_attention_heads=2, joint_attention_dim=text_dim, timestep_guidance_channels=16)
    return Flux2Transformer2DModel(**shape, **width, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance)


def tiny_flux2_klein(distilled: bool = False) -> Any:
    """Qwen3 with 28 layers: [klein] reads its hidden layers 9, 18 and 27."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = tiny.qwen_tokenizer()
    te = Qwen3ForCausalLM(Qwen3Config(**tiny.lm(tok, 28)))
    return Flux2KleinPipeline(
        scheduler=tiny.flow_scheduler(),
        vae=flux2_vae(),
        text_encoder=te,
        tokenizer=tok,
        transformer=flux2_transformer(3 * tiny.W, guidance=False),
        is_distilled=distilled,
    )


def tiny_flux2_dev() -> Any:
    """Mistral with 30 layers: [dev] reads its hidden layers 10, 20 and 30."""
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tok = tiny.plain_tokenizer()
    vision = dict(
        model_type="pixtral", hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    cfg = Mistral3Config(text_config=tiny.lm(tok, 30, model_type="mistral"), vision_config=vision)
    return Flux2Pipeline(
        scheduler=tiny.flow_scheduler(),
        vae=flux2_vae(),
        text_encoder=Mistral3ForConditionalGeneration(cfg),
        tokenizer=tok,
        transformer=flux2_transformer(3 * tiny.W, guidance=True),
    )


TINY_PIPELINES = {
    "flux2-dev": tiny_flux2_dev,
    "flux2-klein": tiny_flux2_klein,
    "flux2-klein-distilled": partial(tiny_flux2_klein, distilled=True),
}

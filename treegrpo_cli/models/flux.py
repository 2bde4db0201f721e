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

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import TIME_FEATURES, Formula, Ledger, formula
from .lora import LoraDefaults
from .releases import ReleaseSpec

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
    card = AdapterCard(
        name="flux",
        family="FLUX.1",
        pipelines=("FluxPipeline",),
        releases={"flux-dev": "black-forest-labs/FLUX.1-dev", "flux-schnell": "black-forest-labs/FLUX.1-schnell"},
        gated=("flux-dev",),  # FLUX.1 [dev] non-commercial license: accepted on the hub; schnell (Apache 2.0) is open
        defaults={"rollout.max_batch": 8, "policy.gradient_checkpointing": True},
        sampling="FlowSDE on the presets' shifted grid (s = 3)",
    )
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
        return flux_flops

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=self.device, max_sequence_length=self.max_sequence_length()
        )
        return {"prompt_embeds": embeds, "pooled": pooled}  # [n, L, 4096], [n, 768]

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32 (distilled guidance: no negative rows)."""
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


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
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


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward) of one
# row of FLUX.1 (dev, schnell); LoRA on FLUX_LORA's targets unless told
flux_flops = formula(FLUX_DEFAULTS, FLUX_LORA.targets, _flux)


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
_BLOCKS = {"down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4}
_TINY_BLOCKS = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}
_FACTORS = {"scaling_factor": 0.3611, "shift_factor": 0.1159, "use_quant_conv": False, "use_post_quant_conv": False}
_FLUX_DEV = ReleaseSpec(
    transformer="FluxTransformer2DModel",
    config={
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 19,
        "num_single_layers": 38,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "guidance_embeds": True,
        "axes_dims_rope": [16, 56, 56],
    },
    tiny={
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 32,
        "guidance_embeds": True,
        "axes_dims_rope": [4, 4, 8],
    },
    embeds={"prompt_embeds": [512, 4096], "pooled": [768]},
    resolution=720,
    guidance="embedded 3.5",
    text_encoders={"T5-XXL": 4.76, "CLIP-L": 0.12},
    pipeline="FluxPipeline",
    vae={
        "class": "AutoencoderKL",
        "config": {
            "in_channels": 3,
            "out_channels": 3,
            **_BLOCKS,
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "act_fn": "silu",
            "norm_num_groups": 32,
            "latent_channels": 16,
            "sample_size": 1024,
            **_FACTORS,
            "force_upcast": True,
        },
        "tiny": {
            **_TINY_BLOCKS,
            "block_out_channels": [8, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "latent_channels": 16,
            "sample_size": 32,
            **_FACTORS,
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
        },
    },
    denoiser_b=11.9,
)
RELEASES = {
    "flux-dev": _FLUX_DEV,
    "flux-schnell": replace(  # no guidance embedding, 256 T5 tokens, a fixed shift of 1
        _FLUX_DEV,
        config={**_FLUX_DEV.config, "guidance_embeds": False},
        tiny={**_FLUX_DEV.tiny, "guidance_embeds": False},
        embeds={"prompt_embeds": [256, 4096], "pooled": [768]},
        guidance="none (4-step distilled)",
        scheduler={
            "class": "FlowMatchEulerDiscreteScheduler",
            "config": {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False},
        },
        denoiser_b=11.89,
    ),
}


# -- the tests' tiny pipeline (models/tiny.py; tests/tinypipes.py collects it) -----------------------------------
def tiny_flux() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    ct, tt = tiny.clip_tokenizer(), tiny.t5_tokenizer()
    tr = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=tiny.H,
        pooled_projection_dim=tiny.H,
        guidance_embeds=True,
        axes_dims_rope=[4, 4, 8],
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
        vae=tiny.vae(1.5035, 0.0609),
        text_encoder=CLIPTextModel(tiny.clip_config(ct)),
        tokenizer=ct,
        text_encoder_2=tiny.t5(tt, tiny.H),
        tokenizer_2=tt,
        transformer=tr,
    )


TINY_PIPELINES = {"flux": tiny_flux}

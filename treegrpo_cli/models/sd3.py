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
  through the adapter's card (its grid and scheduler settings; models/hub.py adapter_defaults), FlowSDE.
* Latents [16, H/8, W/8]; decode: vae.decode(latent / scaling_factor + shift_factor).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from torch import Tensor

from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import TIME_FEATURES, Formula, Ledger, formula
from .lora import LoraDefaults
from .releases import ReleaseSpec

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
    card = AdapterCard(
        name="sd3",
        family="SD3.5",
        pipelines=("StableDiffusion3Pipeline",),
        releases={
            "sd3.5-medium": "stabilityai/stable-diffusion-3.5-medium",
            "sd3.5-large": "stabilityai/stable-diffusion-3.5-large",
        },
        defaults={"rollout.max_batch": 8, "policy.gradient_checkpointing": True},
        grid="flow-match-euler",
        scheduler={"sampler.shift": ("shift", 3.0), "sampler.num_train_timesteps": ("num_train_timesteps", 1000)},
        # SD3.5 Large's model card samples at guidance 3.5 (Medium 4.5, the adapter's default, as Flow-GRPO trains it)
        release_defaults={"sd3.5-large": {"policy.guidance": 3.5}},
        gated=("sd3.5-medium", "sd3.5-large"),  # the Stability AI Community License, accepted on the hub
        sampling="FlowSDE on diffusers' FlowMatchEuler grid at the scheduler's shift (3.0)",
    )
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

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32."""
        dt = self.dtype
        return net(
            hidden_states=x.to(dt),
            timestep=sigma.float() * 1000,
            encoder_hidden_states=cond["prompt_embeds"].to(dt),
            pooled_projections=cond["pooled"].to(dt),
            return_dict=False,
        )[0].float()

    def _vae_in(self, latents: Tensor) -> Tensor:
        cfg = self.pipe.vae.config
        return latents / cfg.scaling_factor + cfg.shift_factor

    def describe(self) -> dict:
        return {**super().describe(), "max_sequence_length": self.max_sequence_length()}


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
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


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward) of one
# row of SD3 / SD3.5; LoRA on SD3_LORA's targets unless told
sd3_flops = formula(SD3_DEFAULTS, SD3_LORA.targets, _sd3)


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
_BLOCKS = {"down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4}
_TINY_BLOCKS = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}
_FACTORS = {"scaling_factor": 1.5305, "shift_factor": 0.0609, "use_quant_conv": False, "use_post_quant_conv": False}
_MEDIUM = ReleaseSpec(
    transformer="SD3Transformer2DModel",
    config={
        "sample_size": 128,
        "patch_size": 2,
        "in_channels": 16,
        "num_layers": 24,
        "attention_head_dim": 64,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "caption_projection_dim": 1536,
        "pooled_projection_dim": 2048,
        "out_channels": 16,
        "pos_embed_max_size": 384,
        "dual_attention_layers": list(range(13)),
        "qk_norm": "rms_norm",
    },
    tiny={
        "sample_size": 8,
        "patch_size": 2,
        "in_channels": 16,
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "caption_projection_dim": 16,
        "pooled_projection_dim": 32,
        "out_channels": 16,
        "pos_embed_max_size": 16,
        "dual_attention_layers": [0],
        "qk_norm": "rms_norm",
    },
    embeds={"prompt_embeds": [333, 4096], "pooled": [2048]},  # 77 CLIP tokens, then 256 T5 ones
    text_prefix=77,  # max_sequence_length counts the T5 tokens
    resolution=512,
    guidance="true CFG 4.5",
    text_encoders={"T5-XXL": 4.76, "CLIP-L": 0.12, "CLIP-G": 0.69},
    pipeline="StableDiffusion3Pipeline",
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
    scheduler={"class": "FlowMatchEulerDiscreteScheduler", "config": {"num_train_timesteps": 1000, "shift": 3.0}},
    denoiser_b=2.24,
)
_LARGE = {"num_layers": 38, "num_attention_heads": 38, "caption_projection_dim": 2432, "pos_embed_max_size": 192}
RELEASES = {
    "sd3.5-medium": _MEDIUM,
    "sd3.5-large": replace(  # 38 blocks, no dual attention
        _MEDIUM,
        config={**_MEDIUM.config, **_LARGE, "dual_attention_layers": []},
        tiny={**_MEDIUM.tiny, "dual_attention_layers": []},
        guidance="true CFG 3.5",
        denoiser_b=8.06,
    ),
}


# -- the tests' tiny pipelines (models/tiny.py; tests/tinypipes.py collects them) --------------------------------
def tiny_sd3() -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    ct, tt = tiny.clip_tokenizer(), tiny.t5_tokenizer()
    # two CLIPs of width 32 concatenate to 64 = the T5 width = joint_attention_dim; pooled 2 x 32
    tr = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=2 * tiny.H,
        caption_projection_dim=16,
        pooled_projection_dim=2 * tiny.H,
        out_channels=4,
        pos_embed_max_size=16,
    )
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny.vae(1.5035, 0.0609),
        transformer=tr,
        text_encoder=CLIPTextModelWithProjection(tiny.clip_config(ct)),
        tokenizer=ct,
        text_encoder_2=CLIPTextModelWithProjection(tiny.clip_config(ct)),
        tokenizer_2=tiny.clip_tokenizer(),
        text_encoder_3=tiny.t5(tt, 2 * tiny.H),
        tokenizer_3=tt,
    )


def tiny_sd3_transformer(dual: tuple[int, ...]) -> Any:
    """An SD3 transformer of tiny_sd3's widths, two blocks with RMS-normed q and k: `dual` (0,) has SD3.5
    Medium's dual-attention block first, () is SD3.5 Large's layout."""
    from diffusers import SD3Transformer2DModel

    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=2 * tiny.H,
        caption_projection_dim=16,
        pooled_projection_dim=2 * tiny.H,
        out_channels=4,
        pos_embed_max_size=16,
        qk_norm="rms_norm",
        dual_attention_layers=dual,
    )


def sd3_large_shaped() -> Any:
    pipe = tiny_sd3()
    pipe.transformer = tiny_sd3_transformer(())
    return pipe


TINY_PIPELINES = {"sd3": tiny_sd3, "sd3-large": sd3_large_shaped}

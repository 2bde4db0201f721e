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

from typing import Any

from torch import Tensor

from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import TIME_FEATURES, Formula, Ledger, formula
from .lora import LoraDefaults

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

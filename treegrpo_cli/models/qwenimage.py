"""Qwen-Image through diffusers' QwenImagePipeline.

* Denoiser: QwenImageTransformer2DModel (MMDiT, 60 blocks, 20B parameters) predicting the flow velocity,
  called with timestep = sigma and the packed latent's (1, h/2, w/2) shape for its 3-axis RoPE.
* Latents: the policy's latent is the unpacked, normalised VAE latent [16, H/8, W/8]; velocity() packs 2x2
  patches into tokens [(H/16)(W/16), 64] as FLUX does (models/flux.py pack/unpack).
* True classifier-free guidance (true_cfg_scale 4.0, the pipeline's and the model card's): the prompt's and
  the negative prompt's rows in one batched forward, then QwenImagePipeline's renormalisation: the guided
  velocity is rescaled per token to the conditional velocity's norm, v = c' ||v_c|| / ||c'|| with
  c' = v_u + w (v_c - v_u). The negative prompt is " " (the model card's). 2 model evaluations per row.
* Text: Qwen2.5-VL-7B's last hidden states [L, 3584] under the pipeline's system template (its first 34
  tokens dropped), L the prompt's own length: rows of a batch are zero-padded to the longest and masked.
* Time grid: the scheduler's own (sampler.grid = "model"): dynamic shift mu linear in the token count, the
  exponential time shift and shift_terminal, as the pipeline samples.
* Decode: latent * latents_std + latents_mean (the VAE config's per-channel statistics), then the video
  VAE on a single frame.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..errors import TreegrpoError
from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import TIME_FEATURES, Formula, Ledger, formula
from .flux import pack, unpack
from .lora import LoraDefaults
from .releases import ReleaseSpec

# VeRL's Qwen-Image Flow-GRPO recipe (examples/flowgrpo_trainer): r 64, alpha 128, the joint attention's
# projections and both streams' feed-forward layers
QWEN_LORA = LoraDefaults(
    64,
    128.0,
    (
        "attn.to_q",
        "attn.to_k",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_q_proj",
        "attn.add_k_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "img_mlp.net.0.proj",
        "img_mlp.net.2",
        "txt_mlp.net.0.proj",
        "txt_mlp.net.2",
    ),
)


def pad_rows(embeds: list[Tensor]) -> tuple[Tensor, Tensor]:
    """[1, L_i, D] each -> ([n, L, D] zero-padded to the longest, [n, L] mask of the real tokens)."""
    L = max(e.shape[1] for e in embeds)
    out = torch.cat([torch.nn.functional.pad(e, (0, 0, 0, L - e.shape[1])) for e in embeds])
    mask = torch.stack([torch.arange(L) < e.shape[1] for e in embeds]).long()
    return out, mask


class QwenImagePolicy(DiffusersPolicy):
    card = AdapterCard(
        name="qwenimage",
        family="Qwen-Image",
        pipelines=("QwenImagePipeline",),
        releases={"qwen-image": "Qwen/Qwen-Image"},
        defaults={"rollout.max_batch": 8, "policy.gradient_checkpointing": True},
        grid="model",
        sampling='FlowSDE on the pipeline\'s dynamic-shift grid (`sampler.grid = "model"`)',
    )
    uses_negative = True  # true CFG against the model card's negative prompt
    negative_prompt = " "
    default_guidance = 4.0
    text_encoder_attrs = ("text_encoder",)
    lora_defaults = QWEN_LORA
    default_resolution = 1024

    def _latent_shape(self) -> tuple[int, ...]:
        sf = int(self.pipe.vae_scale_factor)
        side = self._check_resolution(sf * 2) // sf
        return (self.denoiser.config.in_channels // 4, side, side)

    def flop_formula(self) -> Formula:
        return qwen_image_flops

    def flop_tokens(self) -> tuple[int, int]:
        """The packed 2x2 tokens and the text at the longest cached prompt's length (a batch's padded length at
        most; prompts keep their own lengths here, so a row's cost follows its prompts)."""
        text = max((e["prompt_embeds"].shape[1] for e in self._cache.values()), default=self.max_sequence_length())
        return self.image_tokens(), text

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, max_sequence_length=self.max_sequence_length()
        )  # [n, L, 3584], [n, L] or None (all real)
        lengths = mask.sum(1).tolist() if mask is not None else [embeds.shape[1]] * len(prompts)
        # the cache holds each prompt at its own length (no padding); encode() pads a batch
        return {"prompt_embeds": embeds, "length": torch.tensor(lengths)}

    def put_cached(self, prompt: str, tensors: dict[str, Tensor]) -> None:
        if "length" in tensors:
            n = int(tensors.pop("length").reshape(-1)[0])
            tensors = {"prompt_embeds": tensors["prompt_embeds"][:, :n]}
        super().put_cached(prompt, tensors)

    def encode(self, prompts: list[str]) -> Conditions:
        """{"prompt_embeds": [P, L, D], "prompt_mask": [P, L]}, L the longest prompt of the batch."""
        if not prompts:
            raise TreegrpoError("no prompts to encode")
        self._fill_cache(list(prompts) + [self.negative_prompt])
        embeds, mask = pad_rows([self._cache[p]["prompt_embeds"] for p in prompts])
        return {"prompt_embeds": embeds.to(self.device), "prompt_mask": mask.to(self.device)}

    def negative(self, rows: int) -> Conditions:
        e = self._cache[self.negative_prompt]["prompt_embeds"].to(self.device)  # [1, L, D]
        return {"prompt_embeds": e.expand(rows, *e.shape[1:]), "prompt_mask": torch.ones(rows, e.shape[1]).long()}

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, h, w] fp32, sigma [B] -> velocity [B, C, h, w] fp32."""
        B, _, h, w = x.shape
        emb, mask = cond["prompt_embeds"], cond["prompt_mask"]
        out = net(
            hidden_states=pack(x).to(self.dtype),
            timestep=sigma.to(self.dtype),
            encoder_hidden_states=emb.to(self.dtype),
            encoder_hidden_states_mask=None if bool(mask.all()) else mask.to(x.device),
            img_shapes=[[(1, h // 2, w // 2)]] * B,
            return_dict=False,
        )[0].float()  # [B, (h/2)(w/2), 4C]
        return unpack(out, h, w)

    def with_negative(self, cond: Conditions, neg: Conditions) -> Conditions:
        """The conditional rows then the negative prompt's, padded to a common text length."""
        emb, mask = _join(cond["prompt_embeds"], cond["prompt_mask"], neg)
        return {"prompt_embeds": emb, "prompt_mask": mask}

    def guide(self, cond_out: Tensor, uncond_out: Tensor) -> Tensor:
        """True CFG, then QwenImagePipeline's renormalisation: each packed token's guided velocity rescaled to
        the conditional velocity's norm ([B, C, h, w] in and out)."""
        h, w = cond_out.shape[-2:]
        guided, c = pack(super().guide(cond_out, uncond_out)), pack(cond_out)  # [B, (h/2)(w/2), 4C]
        return unpack(guided * (c.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True)), h, w)

    def _vae_in(self, latents: Tensor) -> Tensor:
        c = self.pipe.vae.config
        mean = torch.tensor(c.latents_mean, device=latents.device).view(1, -1, 1, 1)
        std = torch.tensor(c.latents_std, device=latents.device).view(1, -1, 1, 1)
        return latents * std + mean

    def _vae_decode(self, z: Tensor) -> Tensor:
        return self.pipe.vae.decode(z.unsqueeze(2), return_dict=False)[0][:, :, 0]  # one frame

    def describe(self) -> dict:
        return {**super().describe(), "max_sequence_length": self.max_sequence_length()}


def _join(emb: Tensor, mask: Tensor, neg: Conditions) -> tuple[Tensor, Tensor]:
    """The conditional rows then the negative ones, padded to a common length: [2B, L, D], [2B, L]."""
    ne, nm = neg["prompt_embeds"], neg["prompt_mask"].to(mask.device)
    L = max(emb.shape[1], ne.shape[1])
    pad = lambda t, n: torch.nn.functional.pad(t, (0, 0, 0, n - t.shape[1]) if t.dim() == 3 else (0, n - t.shape[1]))  # noqa: E731
    return torch.cat([pad(emb, L), pad(ne, L)]), torch.cat([pad(mask, L), pad(nm, L)])


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
QWEN_DEFAULTS: dict[str, Any] = {  # QwenImageTransformer2DModel's constructor defaults (Qwen-Image)
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
}


def _qwen(led: Ledger, cfg: dict[str, Any], N: int, T: int) -> int:
    """QwenImageTransformer2DModel: N packed 2x2 patches, T Qwen2.5-VL tokens."""
    D, L = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["num_layers"]
    img = led.linear("img_in", N, cfg["in_channels"], D, x_grad=False)  # packed latents [N, 4C] -> [N, D]
    t = led.linear("time_text_embed.timestep_embedder.linear_1", 1, TIME_FEATURES, D, x_grad=False)
    temb = led.linear("time_text_embed.timestep_embedder.linear_2", 1, D, D, t)  # [1, D]
    # the text [T, 3584] through txt_norm (an RMSNorm whose weight full fine-tuning trains) -> [T, D]
    txt = led.linear("txt_in", T, cfg["joint_attention_dim"], D, x_grad=led.rank is None)
    start = led.fwd
    for i in range(L):
        pre = f"transformer_blocks.{i}."
        x = led.linear(pre + "img_mod.1", 1, D, 6 * D, temb) or img  # adaLN-zero of each stream
        y = led.linear(pre + "txt_mod.1", 1, D, 6 * D, temb) or txt
        qkv = [led.linear(pre + f"attn.to_{n}", N, D, D, x) for n in "qkv"]
        qkv += [led.linear(pre + f"attn.add_{n}_proj", T, D, D, y) for n in "qkv"]
        led.attention(T + N, D, any(qkv))  # joint attention over [T + N, D]
        img = led.linear(pre + "attn.to_out.0", N, D, D, any(qkv)) or x
        img = led.linear(pre + "img_mlp.net.2", N, 4 * D, D, led.linear(pre + "img_mlp.net.0.proj", N, D, 4 * D, img))
        img = img or x
        if i == L - 1:  # the last block's text stream feeds nothing: forward only
            for name, k, n in (
                ("attn.to_add_out", D, D),
                ("txt_mlp.net.0.proj", D, 4 * D),
                ("txt_mlp.net.2", 4 * D, D),
            ):
                led.dead(pre + name, T, k, n)
            continue
        txt = led.linear(pre + "attn.to_add_out", T, D, D, any(qkv)) or y
        txt = led.linear(pre + "txt_mlp.net.2", T, 4 * D, D, led.linear(pre + "txt_mlp.net.0.proj", T, D, 4 * D, txt))
        txt = txt or y
    blocks = led.fwd - start
    led.linear("norm_out.linear", 1, D, 2 * D, temb)  # AdaLayerNormContinuous: [1, D] -> scale, shift
    led.linear("proj_out", N, D, cfg["patch_size"] ** 2 * cfg["out_channels"], img)
    return blocks


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward) of one
# row of Qwen-Image; LoRA on QWEN_LORA's targets unless told
qwen_image_flops = formula(QWEN_DEFAULTS, QWEN_LORA.targets, _qwen)


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
RELEASES = {
    "qwen-image": ReleaseSpec(
        transformer="QwenImageTransformer2DModel",
        config={
            "patch_size": 2,
            "in_channels": 64,
            "out_channels": 16,
            "num_layers": 60,
            "attention_head_dim": 128,
            "num_attention_heads": 24,
            "joint_attention_dim": 3584,
            "axes_dims_rope": [16, 56, 56],
        },
        tiny={
            "patch_size": 2,
            "in_channels": 64,
            "out_channels": 16,
            "num_layers": 2,
            "attention_head_dim": 16,
            "num_attention_heads": 2,
            "joint_attention_dim": 32,
            "axes_dims_rope": [4, 6, 6],
        },
        embeds={"prompt_embeds": [64, 3584]},
        resolution=1024,
        guidance="true CFG 4.0, renormalised",
        text_encoders={"Qwen2.5-VL-7B": 8.29},
        pipeline="QwenImagePipeline",
        vae={
            "class": "AutoencoderKLQwenImage",
            "config": {},
            "tiny": {
                "base_dim": 8,
                "z_dim": 16,
                "dim_mult": [1, 2],
                "num_res_blocks": 1,
                "temperal_downsample": [False],
            },
        },
        scheduler={
            "class": "FlowMatchEulerDiscreteScheduler",
            "config": {
                "num_train_timesteps": 1000,
                "shift": 1.0,
                "use_dynamic_shifting": True,
                "base_shift": 0.5,
                "max_shift": 0.9,
                "base_image_seq_len": 256,
                "max_image_seq_len": 8192,
                "shift_terminal": 0.02,
                "time_shift_type": "exponential",
            },
        },
        denoiser_b=20.43,
    )
}


# -- the tests' tiny pipeline (models/tiny.py; tests/tinypipes.py collects it) -----------------------------------
def tiny_qwen_image() -> Any:
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = tiny.qwen_tokenizer()
    mrope = {"type": "mrope", "mrope_section": [1, 1, 2]}
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=tiny.W)
    text = Qwen2_5_VLConfig(text_config=tiny.lm(tok, 2, rope_scaling=mrope), vision_config=vision)
    z = 4
    g = torch.Generator().manual_seed(7)
    shape = dict(
        patch_size=2, in_channels=4 * z, out_channels=z, num_layers=2, attention_head_dim=16, num_attention_heads=2
    )
    return QwenImagePipeline(
        scheduler=tiny.flow_scheduler(base_shift=0.5, max_shift=0.9, max_image_seq_len=8192, shift_terminal=0.02),
        vae=AutoencoderKLQwenImage(
            base_dim=8,
            z_dim=z,
            dim_mult=[1, 2],
            num_res_blocks=1,
            temperal_downsample=[False],
            latents_mean=(torch.randn(z, generator=g) * 0.3).tolist(),
            latents_std=(1 + torch.rand(z, generator=g)).tolist(),
        ),
        text_encoder=Qwen2_5_VLForConditionalGeneration(text),
        tokenizer=tok,
        transformer=QwenImageTransformer2DModel(**shape, joint_attention_dim=tiny.W, axes_dims_rope=(4, 6, 6)),
    )


TINY_PIPELINES = {"qwenimage": tiny_qwen_image}

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
  3.0 for 480p, 5.0 for 720p; the card's scheduler settings, models/hub.py adapter_defaults), FlowSDE; Wan's own
  UniPC multistep sampler is not a one-step kernel, so the grid is the flow-matching Euler one DanceGRPO and
  BranchGRPO train Wan with.
* Decode: z * latents_std + latents_mean (the VAE config's per-channel statistics), the causal video VAE:
  videos [B, 3, frames, H, W] in [0, 1].
* Image-to-video (WanImageToVideoPipeline, Wan2.1 I2V): each prompt's first frame (policy.images: a .jsonl of
  {"prompt", "image"} rows) gives the CLIP image tokens the cross-attention also reads [257, 1280] and the
  condition latent [4 + 16, F, h, w] (a mask of the given frames, then the VAE latent of the image followed by
  black frames) concatenated to the sampler latent on channels; both encoded once per prompt, shared by every
  node of its tree and by both CFG halves (only the text is negated, as the pipeline does).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, TreegrpoError
from ..preflight import check_image
from ..store.safeio import contained, loads_json, read_text
from . import tiny
from .base import Conditions
from .catalog import AdapterCard
from .diffusers_base import DiffusersPolicy
from .flops import Formula, Ledger, formula
from .lora import LoraDefaults
from .releases import ReleaseSpec

# DiffSynth-Studio's Wan LoRA recipe (q, k, v, o and the feed-forward of every block): rank 32, alpha = rank,
# the self- and cross-attention projections and both feed-forward layers
WAN_LORA = LoraDefaults(32, 32.0, ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"))


class WanPolicy(DiffusersPolicy):
    card = AdapterCard(
        name="wan",
        family="Wan2.1",
        pipelines=("WanPipeline",),
        releases={
            "wan2.1-t2v-1.3b": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
            "wan2.1-t2v-14b": "Wan-AI/Wan2.1-T2V-14B-Diffusers",
        },
        defaults={"rollout.max_batch": 4, "policy.gradient_checkpointing": True},
        # the presets' shifted grid at the model's flow shift (UniPC's flow_shift, else shift)
        scheduler={"sampler.shift": ("flow_shift", "shift", 3.0)},
        video=True,
        sampling="FlowSDE on the presets' shifted grid at the scheduler's flow shift (3.0 at 480p)",
    )
    uses_negative = True
    default_guidance = 5.0
    text_encoder_attrs: tuple[str, ...] = ("text_encoder",)
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
            raise ConfigError(f"{self.name}: Wan2.2's two-expert and TI2V pipelines are not supported yet (Wan2.1 is)")
        vae = self.pipe.vae.config
        st, ss = int(vae.scale_factor_temporal), int(vae.scale_factor_spatial)
        if (self.frames - 1) % st:
            raise_frames(self.frames, st, self.name)
        side = self._check_resolution(ss * int(self.denoiser.config.patch_size[-1])) // ss
        c = self.denoiser.config  # out_channels: I2V's in_channels add the condition's
        return (int(c.out_channels or c.in_channels), (self.frames - 1) // st + 1, side, side)

    def _encode_text(self, prompts: list[str]) -> dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length(),
            device=self.device,
        )
        return {"prompt_embeds": embeds}  # [n, L, 4096]

    def denoise(self, net: Any, x: Tensor, sigma: Tensor, cond: Conditions) -> Tensor:
        """x [B, C, F, h, w] fp32, sigma [B] -> velocity [B, C, F, h, w] fp32. Under CFG the negative prompt's
        rows share everything but the text (model_output repeats the other conditions)."""
        x, extra = self._conditioned(x, cond)
        return net(
            hidden_states=x.to(self.dtype),
            timestep=sigma.float() * 1000,
            encoder_hidden_states=cond["prompt_embeds"].to(self.dtype),
            return_dict=False,
            **{k: v.to(self.dtype) for k, v in extra.items()},
        )[0].float()

    def _conditioned(self, x: Tensor, cond: Conditions) -> tuple[Tensor, dict[str, Tensor]]:
        """The transformer's input latent and its other conditioning (text-to-video: x itself, nothing)."""
        return x, {}

    def image_tokens(self) -> int:
        _, f, h, w = self.latent_shape
        pt, ph, pw = self.denoiser.config.patch_size
        return (f // pt) * (h // ph) * (w // pw)

    def flop_formula(self) -> Formula:
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
    raise ConfigError(f"policy.frames {frames} must be 1 more than a multiple of {stride} for {name} (e.g. 33, 81)")


class WanI2VPolicy(WanPolicy):
    """Wan2.1 image-to-video: WanImageToVideoPipeline's conditioning on each prompt's first frame."""

    card = AdapterCard(
        name="wan-i2v",
        family="Wan2.1",
        pipelines=("WanImageToVideoPipeline",),
        releases={
            "wan2.1-i2v-14b-480p": "Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
            "wan2.1-i2v-14b-720p": "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers",
        },
        defaults={"rollout.max_batch": 4, "policy.gradient_checkpointing": True},
        scheduler={"sampler.shift": ("flow_shift", "shift", 3.0)},
        release_defaults={"wan2.1-i2v-14b-720p": {"policy.resolution": 720}},
        video=True,
        sampling="FlowSDE on the presets' shifted grid at the scheduler's flow shift (3.0 at 480p)",
    )
    no_random_weights = (
        "is image-to-video: it conditions on its image encoder's features of real first frames, which random "
        "weights do not provide; use a text-to-video release (wan2.1-t2v-1.3b, wan2.1-t2v-14b)"
    )
    text_encoder_attrs = ("text_encoder", "image_encoder")
    default_text_tokens = 512  # the I2V transformer tells image from text tokens by counting 512 text ones

    def __init__(self, pipe: Any, opts: Any, name: str, source: str = "", device: str | torch.device = "cpu"):
        if opts.max_sequence_length not in (None, 512):
            raise ConfigError(f"policy.max_sequence_length must be 512 for {name} (its transformer expects 512)")
        self._images: dict[str, Path] | None = None  # read at the first prompt (export needs no frames)
        self._frames_cache: dict[str, dict[str, Tensor]] = {}  # prompt -> {image_embeds, condition} [1, ...]
        super().__init__(pipe, opts, name, source, device)

    @property
    def images(self) -> dict[str, Path]:
        if self._images is None:
            self._images = first_frames(self.opts.images, self.name)
        return self._images

    def encode(self, prompts: list[str]) -> Conditions:
        """The text embeddings and, per prompt, its image's CLIP tokens and condition latent."""
        out = super().encode(prompts)
        for p in dict.fromkeys(prompts):
            self._encode_frame(p)
        for key in ("image_embeds", "condition"):
            out[key] = torch.cat([self._frames_cache[p][key] for p in prompts]).to(self.device)
        return out

    def cache_prompts(self, prompts: list[str]) -> None:
        for p in dict.fromkeys(prompts):
            self._encode_frame(p)
        super().cache_prompts(prompts)

    def _encode_frame(self, prompt: str) -> None:
        if prompt in self._frames_cache:
            return
        if prompt not in self.images:
            raise TreegrpoError(f"prompt {prompt!r} has no first frame in policy.images ({self.opts.images})")
        if self.pipe.image_encoder is None:
            raise TreegrpoError(f"prompt {prompt!r} has no cached first frame and the image encoder was freed")
        from PIL import Image

        try:
            with Image.open(self.images[prompt]) as f:
                image = f.convert("RGB")
        except OSError as e:
            raise TreegrpoError(f"{self.images[prompt]}: not an image ({e.__class__.__name__})") from None
        pipe, side = self.pipe, self.resolution
        with torch.no_grad():
            tokens = pipe.encode_image(image, self.device)  # [1, 257, 1280] CLIP's penultimate layer
            pixels = pipe.video_processor.preprocess(image, height=side, width=side).to(self.device, torch.float32)
            zeros = torch.zeros(1, *self.latent_shape, device=self.device)
            _, condition = pipe.prepare_latents(
                pixels, 1, self.latent_shape[0], side, side, self.frames, torch.float32, self.device, None, zeros
            )  # [1, 4 + C, F, h, w]: which frames are given, then the latent of the image and black frames
        self._frames_cache[prompt] = {"image_embeds": tokens.float().cpu(), "condition": condition.float().cpu()}

    def _conditioned(self, x: Tensor, cond: Conditions) -> tuple[Tensor, dict[str, Tensor]]:
        x = torch.cat([x, cond["condition"].to(x)], dim=1)  # [B, C + 4 + C, F, h, w]
        return x, {"encoder_hidden_states_image": cond["image_embeds"]}

    def flop_formula(self) -> Formula:
        vision = self.pipe.image_encoder.config if self.pipe.image_encoder is not None else None
        tokens = (vision.image_size // vision.patch_size) ** 2 + 1 if vision else 257  # CLIP's patches + class

        def count(config: Any, *args: Any, **kwargs: Any) -> tuple[int, int]:
            return wan_flops({**dict(config), "image_context_tokens": tokens}, *args, **kwargs)

        return count

    def describe(self) -> dict:
        return {**super().describe(), "images": self.opts.images}


def first_frames(path: str, name: str) -> dict[str, Path]:
    """prompt -> image file, from a .jsonl of {"prompt", "image"} rows (image paths relative to the file)."""
    if not path:
        raise ConfigError(
            f"{name} is image-to-video: give each prompt its first frame with --set policy.images=FILE.jsonl "
            '(rows {"prompt": ..., "image": PATH}; a --prompts file of such rows works)'
        )
    file = Path(path).expanduser()
    if not file.exists():
        raise TreegrpoError(f"policy.images: no file at {file}")
    out: dict[str, Path] = {}
    for n, line in enumerate(read_text(file, "policy.images file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = loads_json(line)
            prompt, image = row["prompt"].strip(), Path(row["image"]).expanduser()
        except (ValueError, KeyError, TypeError, AttributeError):
            raise TreegrpoError(f'{file}:{n}: expected an object with "prompt" and "image" strings') from None
        if not image.is_absolute():  # a relative path (or a link on it) stays in the file's folder
            image = file.parent / image
            if image.exists():
                contained(file.parent, image, f"{file}:{n}")
        if out.get(prompt, image) != image:
            raise TreegrpoError(f"{file}:{n}: prompt {prompt!r} has two images; an I2V prompt must be unique")
        if not image.is_file():
            raise TreegrpoError(f"{file}:{n}: no image at {image}")
        check_image(image)  # its size from its header, before any is decoded
        out[prompt] = image
    return out


# -- FLOPs (models/flops.py) ---------------------------------------------------------------------
WAN_DEFAULTS: dict[str, Any] = {  # WanTransformer3DModel's constructor defaults (Wan2.1 14B)
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "image_dim": None,  # Wan2.1 I2V: 1280, CLIP ViT-H's width
    "added_kv_proj_dim": None,
    "image_context_tokens": 257,  # not a config field: CLIP's tokens of the first frame (the I2V adapter's)
}


def _wan(led: Ledger, cfg: dict[str, Any], N: int, T: int) -> int:
    """WanTransformer3DModel (text- and image-to-video): N patches of the video latent, T UMT5 tokens. Full
    fine-tuning trains the blocks' modulation tables and the cross-attention norm, so every block's input requires
    grad there."""
    D, Ff, full = cfg["num_attention_heads"] * cfg["attention_head_dim"], cfg["ffn_dim"], led.rank is None
    pt, ph, pw = cfg["patch_size"]
    x = led.linear("patch_embedding", N, cfg["in_channels"] * pt * ph * pw, D, x_grad=False)  # a conv as patches
    pre = "condition_embedder."
    t = led.linear(pre + "time_embedder.linear_1", 1, cfg["freq_dim"], D, x_grad=False)
    temb = led.linear(pre + "time_embedder.linear_2", 1, D, D, t)
    mod = led.linear(pre + "time_proj", 1, D, 6 * D, temb) or full  # + each block's scale_shift_table
    txt = led.linear(
        pre + "text_embedder.linear_2",
        T,
        D,
        D,
        led.linear(pre + "text_embedder.linear_1", T, cfg["text_dim"], D, False),
    )
    img = _wan_image_tokens(led, cfg, D, full)
    start = led.fwd
    for i in range(cfg["num_layers"]):
        b = f"blocks.{i}."
        h = x or mod  # adaLN-modulated input of the self-attention
        qkv = [led.linear(b + f"attn1.to_{n}", N, D, D, h) for n in "qkv"]
        led.attention(N, D, any(qkv))
        x = led.linear(b + "attn1.to_out.0", N, D, D, any(qkv)) or h
        h = x or (full and cfg["cross_attn_norm"])  # norm2's affine weights
        q = led.linear(b + "attn2.to_q", N, D, D, h)
        kv = [led.linear(b + f"attn2.to_{n}", T, D, D, txt) for n in "kv"]
        led.attention(N, D, q or any(kv), keys=T)
        if img is not None:  # I2V: the same queries attend to the image tokens too; the two outputs add
            kv += [led.linear(b + f"attn2.add_{n}_proj", cfg["image_context_tokens"], D, D, img) for n in "kv"]
            led.attention(N, D, q or any(kv[2:]), keys=cfg["image_context_tokens"])
        x = led.linear(b + "attn2.to_out.0", N, D, D, q or any(kv)) or x
        h = x or mod
        x = led.linear(b + "ffn.net.2", N, Ff, D, led.linear(b + "ffn.net.0.proj", N, D, Ff, h)) or h
    blocks = led.fwd - start
    out = cfg["out_channels"] * pt * ph * pw
    led.linear("proj_out", N, D, out, x or full)  # norm_out modulated by temb and the model's scale_shift_table
    return blocks


def _wan_image_tokens(led: Ledger, cfg: dict[str, Any], D: int, full: bool) -> bool | None:
    """I2V's image embedder (LayerNorm, a GELU MLP of width image_dim, LayerNorm) on the CLIP tokens: whether its
    output requires grad (full fine-tuning trains it), or None for text-to-video."""
    if cfg["image_dim"] is None:
        return None
    n, d, pre = cfg["image_context_tokens"], cfg["image_dim"], "condition_embedder.image_embedder.ff.net."
    return led.linear(pre + "2", n, d, D, led.linear(pre + "0.proj", n, d, d, full)) or full


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward) of one
# row of Wan2.1 (text- and image-to-video); LoRA on WAN_LORA's targets unless told
wan_flops = formula(WAN_DEFAULTS, WAN_LORA.targets, _wan)


# -- releases (models/releases.py: policy.weights = "random"; bench/model_memory.py: the memory table) -------------
_T2V_1_3B = ReleaseSpec(
    transformer="WanTransformer3DModel",
    config={
        "patch_size": [1, 2, 2],
        "num_attention_heads": 12,
        "attention_head_dim": 128,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": 8960,
        "num_layers": 30,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-06,
        "rope_max_seq_len": 1024,
    },
    tiny={
        "patch_size": [1, 2, 2],
        "num_attention_heads": 2,
        "attention_head_dim": 8,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 32,
        "freq_dim": 16,
        "ffn_dim": 32,
        "num_layers": 1,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-06,
        "rope_max_seq_len": 32,
    },
    embeds={"prompt_embeds": [226, 4096]},
    resolution=480,
    guidance="true CFG 5.0",
    text_encoders={"UMT5-XXL": 5.68},
    pipeline="WanPipeline",
    vae={
        "class": "AutoencoderKLWan",
        "config": {},
        "tiny": {"base_dim": 4, "z_dim": 16, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1},
    },
    scheduler={
        "class": "UniPCMultistepScheduler",
        "config": {
            "num_train_timesteps": 1000,
            "prediction_type": "flow_prediction",
            "use_flow_sigmas": True,
            "flow_shift": 3.0,
        },
    },
    denoiser_b=1.42,
)
_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
_I2V_480P = replace(  # CLIP image tokens beside the text, the condition latent on channels; no tiny size
    _T2V_1_3B,
    config={**_T2V_1_3B.config, **_14B, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120},
    tiny={},
    embeds={"prompt_embeds": [512, 4096], "image_embeds": [257, 1280]},
    text_encoders={"UMT5-XXL": 5.68, "CLIP ViT-H/14 vision tower": 0.63},
    pipeline="WanImageToVideoPipeline",
    denoiser_b=16.39,
)
RELEASES = {
    "wan2.1-t2v-1.3b": _T2V_1_3B,
    "wan2.1-t2v-14b": replace(_T2V_1_3B, config={**_T2V_1_3B.config, **_14B}, denoiser_b=14.29),
    "wan2.1-i2v-14b-480p": _I2V_480P,
    "wan2.1-i2v-14b-720p": replace(_I2V_480P, resolution=720),
}


# -- the tests' tiny pipelines (models/tiny.py; tests/tinypipes.py collects them) --------------------------------
_ATTN = dict(num_attention_heads=2, attention_head_dim=8, qk_norm="rms_norm_across_heads", cross_attn_norm=True)


def tiny_wan() -> Any:
    """Wan2.1-shaped: UMT5 text encoder, the causal video VAE (8x spatial, 4x temporal), a one-block
    WanTransformer3DModel; the pipeline sampled with FlowMatchEuler at shift 3 (the engine's Euler grid)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tok, z, w = tiny.t5_tokenizer(), 4, tiny.W
    text = UMT5Config(vocab_size=len(tok), d_model=w, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    g = torch.Generator().manual_seed(9)
    stats = dict(
        latents_mean=(torch.randn(z, generator=g) * 0.3).tolist(), latents_std=(1 + torch.rand(z, generator=g)).tolist()
    )
    vae = AutoencoderKLWan(base_dim=4, z_dim=z, dim_mult=[1, 1, 1, 1], num_res_blocks=1, **stats)
    net = WanTransformer3DModel(
        **_ATTN, in_channels=z, out_channels=z, text_dim=w, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32
    )
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return WanPipeline(tokenizer=tok, text_encoder=UMT5EncoderModel(text), vae=vae, scheduler=sched, transformer=net)


def tiny_wan_i2v() -> Any:
    """Wan2.1 I2V-shaped: tiny_wan's text encoder and VAE, a 2-layer CLIP vision tower on 28 px crops (5 image
    tokens of width 16), a one-block transformer on [latent 4 + mask 4 + condition 4] channels whose
    cross-attention also reads the image tokens (added K/V projections)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    t2v, z, w = tiny_wan(), 4, tiny.W
    vision = CLIPVisionConfig(
        hidden_size=w, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14
    )
    prep = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    net = WanTransformer3DModel(
        **_ATTN, in_channels=3 * z, out_channels=z, text_dim=w, freq_dim=16, ffn_dim=32, num_layers=1,
        rope_max_seq_len=32, image_dim=w, added_kv_proj_dim=16,
    )  # fmt: skip
    return WanImageToVideoPipeline(
        tokenizer=t2v.tokenizer,
        text_encoder=t2v.text_encoder,
        vae=t2v.vae,
        scheduler=t2v.scheduler,
        transformer=net,
        image_processor=prep,
        image_encoder=CLIPVisionModel(vision),
    )


TINY_PIPELINES = {"wan": tiny_wan, "wan-i2v": tiny_wan_i2v}

"""Denoiser FLOPs of one network row of Qwen-Image, FLUX.2 and Wan2.1 from their configs (models/flops.py's rules:
FlopCounterMode's matmul and attention counts, gradients where autograd takes them)."""

from __future__ import annotations

from typing import Any

from .flops import TIME_FEATURES, Ledger, Targets, formula

QWEN_DEFAULTS: dict[str, Any] = {  # QwenImageTransformer2DModel's constructor defaults (Qwen-Image)
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
}
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


def _qwen_targets() -> Targets:
    from .qwenimage import QWEN_LORA

    return QWEN_LORA.targets


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


def _flux2_targets() -> Targets:
    from .flux2 import FLUX2_LORA

    return FLUX2_LORA.targets


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


def _wan_targets() -> Targets:
    from .wan import WAN_LORA

    return WAN_LORA.targets


# count(config, image_tokens, text_tokens, rank=None, targets=None, recompute=False) -> (forward, backward);
# the LoRA defaults are the adapters' QWEN_LORA and FLUX2_LORA
qwen_image_flops = formula(QWEN_DEFAULTS, _qwen_targets, _qwen)
flux2_flops = formula(FLUX2_DEFAULTS, _flux2_targets, _flux2)
wan_flops = formula(WAN_DEFAULTS, _wan_targets, _wan)

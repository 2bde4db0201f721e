"""Tiny Qwen-Image and FLUX.2 pipelines built from config (no files from any hub): random weights, in-memory
byte-level tokenizers with the chat templates the pipelines apply, the text encoders' widths and layer
counts just large enough for the hidden layers each pipeline reads (FLUX.2 [dev]: 10, 20, 30; [klein]:
9, 18, 27). 16 px images: 8 x 8 VAE latents."""

import torch
from tokenizers.pre_tokenizers import ByteLevel
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    T5Config,
    T5EncoderModel,
)

W = 16  # text width of the tiny encoders
# 2 blocks of an image VAE (vae_scale_factor 2: 16 px images have 8 x 8 latents of 4 channels)
VAE_BLOCKS = dict(
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    block_out_channels=(8, 16),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=4,
    sample_size=16,
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "<unk>", "<pad>"]
# enough of a chat template for the pipelines' calls: role and text of each message, then the generation prompt
CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}{{ c['text'] }}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_vocab() -> dict[str, int]:
    vocab: dict[str, int] = {}
    for s in [*SPECIAL, *sorted(ByteLevel.alphabet())]:
        vocab.setdefault(s, len(vocab))
    return vocab


def qwen_tokenizer():
    from transformers import Qwen2TokenizerFast

    tok = Qwen2TokenizerFast(vocab=byte_vocab(), merges=[], model_max_length=2048)
    tok.chat_template = CHAT
    return tok


def plain_tokenizer():
    """A tokenizer with Mistral's special tokens and the chat template (FLUX.2 [dev]'s processor stand-in)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    t = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[], unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=t, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    tok.chat_template = CHAT
    return tok


def lm(tok, layers: int, **kw) -> dict:
    """The fields of a tiny decoder-only text model: width W, 2 heads of 8, one key-value head."""
    fields = dict(vocab_size=len(tok), hidden_size=W, intermediate_size=32, num_attention_heads=2)
    return dict(fields, num_key_value_heads=1, head_dim=8, num_hidden_layers=layers, **kw)


def t5_tokenizer():
    from transformers import T5TokenizerFast

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)] + [
        (c, -2.0) for c in "abcdefghijklmnopqrstuvwxyz"
    ]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=512)


def scheduler(**kw):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential", **kw)


def tiny_qwen_image():
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = qwen_tokenizer()
    mrope = {"type": "mrope", "mrope_section": [1, 1, 2]}
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=W)
    text = Qwen2_5_VLConfig(text_config=lm(tok, 2, rope_scaling=mrope), vision_config=vision)
    z = 4
    g = torch.Generator().manual_seed(7)
    shape = dict(
        patch_size=2, in_channels=4 * z, out_channels=z, num_layers=2, attention_head_dim=16, num_attention_heads=2
    )
    return QwenImagePipeline(
        scheduler=scheduler(base_shift=0.5, max_shift=0.9, max_image_seq_len=8192, shift_terminal=0.02),
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
        transformer=QwenImageTransformer2DModel(**shape, joint_attention_dim=W, axes_dims_rope=(4, 6, 6)),
    )


def flux2_vae():
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(**VAE_BLOCKS)
    g = torch.Generator().manual_seed(8)  # batch-norm statistics that are not the identity
    vae.bn.running_mean.copy_(torch.randn(16, generator=g) * 0.3)
    vae.bn.running_var.copy_(1 + torch.rand(16, generator=g))
    return vae


def flux2_transformer(text_dim: int, guidance: bool):
    from diffusers import Flux2Transformer2DModel

    shape = dict(patch_size=1, in_channels=16, num_layers=1, num_single_layers=2, attention_head_dim=16)
    width = dict(num_attention_heads=2, joint_attention_dim=text_dim, timestep_guidance_channels=16)
    return Flux2Transformer2DModel(**shape, **width, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance)


def tiny_flux2_klein(distilled: bool = False):
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen_tokenizer()
    te = Qwen3ForCausalLM(Qwen3Config(**lm(tok, 28)))
    return Flux2KleinPipeline(
        scheduler=scheduler(),
        vae=flux2_vae(),
        text_encoder=te,
        tokenizer=tok,
        transformer=flux2_transformer(3 * W, guidance=False),
        is_distilled=distilled,
    )


def tiny_flux2_dev():
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tok = plain_tokenizer()
    vision = dict(
        model_type="pixtral", hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
    )
    cfg = Mistral3Config(text_config=lm(tok, 30, model_type="mistral"), vision_config=vision)
    return Flux2Pipeline(
        scheduler=scheduler(),
        vae=flux2_vae(),
        text_encoder=Mistral3ForConditionalGeneration(cfg),
        tokenizer=tok,
        transformer=flux2_transformer(3 * W, guidance=True),
    )


BUILDERS = {  # the image models
    "qwenimage": tiny_qwen_image,
    "flux2-dev": tiny_flux2_dev,
    "flux2-klein": tiny_flux2_klein,
    "flux2-klein-distilled": lambda: tiny_flux2_klein(distilled=True),
}


def tiny_wan():
    """Wan2.1-shaped: UMT5 text encoder, the causal video VAE (8x spatial, 4x temporal), a one-block
    WanTransformer3DModel; the pipeline sampled with FlowMatchEuler at shift 3 (the engine's Euler grid)."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tok, z = t5_tokenizer(), 4
    text = UMT5Config(vocab_size=len(tok), d_model=W, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    g = torch.Generator().manual_seed(9)
    stats = dict(
        latents_mean=(torch.randn(z, generator=g) * 0.3).tolist(), latents_std=(1 + torch.rand(z, generator=g)).tolist()
    )
    vae = AutoencoderKLWan(base_dim=4, z_dim=z, dim_mult=[1, 1, 1, 1], num_res_blocks=1, **stats)
    attn = dict(num_attention_heads=2, attention_head_dim=8, qk_norm="rms_norm_across_heads", cross_attn_norm=True)
    net = WanTransformer3DModel(
        **attn, in_channels=z, out_channels=z, text_dim=W, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32
    )
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return WanPipeline(tokenizer=tok, text_encoder=UMT5EncoderModel(text), vae=vae, scheduler=sched, transformer=net)


def tiny_wan_i2v():
    """Wan2.1 I2V-shaped: tiny_wan's text encoder and VAE, a 2-layer CLIP vision tower on 28 px crops (5 image
    tokens of width 16), a one-block transformer on [latent 4 + mask 4 + condition 4] channels whose
    cross-attention also reads the image tokens (added K/V projections)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    t2v, z = tiny_wan(), 4
    vision = CLIPVisionConfig(
        hidden_size=W, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14
    )
    prep = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    attn = dict(num_attention_heads=2, attention_head_dim=8, qk_norm="rms_norm_across_heads", cross_attn_norm=True)
    net = WanTransformer3DModel(
        **attn, in_channels=3 * z, out_channels=z, text_dim=W, freq_dim=16, ffn_dim=32, num_layers=1,
        rope_max_seq_len=32, image_dim=W, added_kv_proj_dim=16,
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


# --- FLUX.1, SD3 and SD1.5 -------------------------------------------------------------------------

H = 32  # text width of their tiny encoders


def clip_tokenizer():
    syms, vocab = sorted(ByteLevel.alphabet()), {}
    for s in syms:
        vocab.setdefault(s, len(vocab))
    for s in syms:
        vocab.setdefault(s + "</w>", len(vocab))
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def clip_config(tok, projection: bool = False):
    return CLIPTextConfig(
        vocab_size=len(tok),
        hidden_size=H,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        projection_dim=H,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def t5(tok, width: int):
    return T5EncoderModel(
        T5Config(
            vocab_size=len(tok),
            d_model=width,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )


def vae(scaling: float, shift: float | None):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        **VAE_BLOCKS,
        use_quant_conv=False,
        use_post_quant_conv=False,
        scaling_factor=scaling,
        shift_factor=shift,
    )


def tiny_flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    ct, tt = clip_tokenizer(), t5_tokenizer()
    tr = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=H,
        pooled_projection_dim=H,
        guidance_embeds=True,
        axes_dims_rope=[4, 4, 8],
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
        vae=vae(1.5035, 0.0609),
        text_encoder=CLIPTextModel(clip_config(ct)),
        tokenizer=ct,
        text_encoder_2=t5(tt, H),
        tokenizer_2=tt,
        transformer=tr,
    )


def tiny_sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    ct, tt = clip_tokenizer(), t5_tokenizer()
    # two CLIPs of width 32 concatenate to 64 = the T5 width = joint_attention_dim; pooled 2 x 32
    tr = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=2 * H,
        caption_projection_dim=16,
        pooled_projection_dim=2 * H,
        out_channels=4,
        pos_embed_max_size=16,
    )
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae(1.5035, 0.0609),
        transformer=tr,
        text_encoder=CLIPTextModelWithProjection(clip_config(ct)),
        tokenizer=ct,
        text_encoder_2=CLIPTextModelWithProjection(clip_config(ct)),
        tokenizer_2=clip_tokenizer(),
        text_encoder_3=t5(tt, 2 * H),
        tokenizer_3=tt,
    )


def tiny_sd():
    from diffusers import PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    ct = clip_tokenizer()
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=H,
        norm_num_groups=4,
        attention_head_dim=4,
    )
    # the scheduler config SD1.5 ships (PNDM; the adapter samples with DDIM on its betas)
    sched = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        vae=vae(0.18215, None),
        text_encoder=CLIPTextModel(clip_config(ct)),
        tokenizer=ct,
        unet=unet,
        scheduler=sched,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def saved(tmp_path_factory, builders) -> dict:
    """{name: folder} of tiny pipelines, each built after seeding 0 and saved with save_pretrained."""
    out = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        out[name] = tmp_path_factory.mktemp("models") / name
        build().save_pretrained(out[name])
    return out


def policy_of(folder, **policy):
    from treegrpo_cli.models.base import PolicyConfig
    from treegrpo_cli.models.registry import load_policy

    return load_policy(str(folder), "cpu", PolicyConfig(dtype="fp32", resolution=16, max_sequence_length=8, **policy))


def outputs(policy, net, prompt="a red cat", seed=0):
    """The adapter's model output with `net` as the denoiser, on fixed inputs [1, C, h, w]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, *policy.latent_shape, generator=g)
    sigma = torch.tensor([0.501])  # t/1000 = 0.501 for SD, sigma 0.501 for the flows
    with torch.no_grad():
        return policy.model_output(net, x, sigma, policy.encode([prompt]))


def load_pipe(folder):
    from diffusers import DiffusionPipeline

    return DiffusionPipeline.from_pretrained(folder, local_files_only=True)


def tiny_sd3_transformer(dual: tuple[int, ...]):
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
        joint_attention_dim=2 * H,
        caption_projection_dim=16,
        pooled_projection_dim=2 * H,
        out_channels=4,
        pos_embed_max_size=16,
        qk_norm="rms_norm",
        dual_attention_layers=dual,
    )


def sd3_large_shaped():
    pipe = tiny_sd3()
    pipe.transformer = tiny_sd3_transformer(())
    return pipe

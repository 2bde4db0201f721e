"""The released models' denoiser configs, text-embedding shapes and text encoders, for the GPU iteration benchmark
(flux_iteration.py --model NAME) and the memory table (model_memory.py). No weights: each transformer is built
from its config, on the meta device or with random weights.

The configs are the `transformer/config.json` (or `unet/`) of each model's hub release; the text encoders'
parameter counts are their model cards'. A tiny variant of each (`tiny`) runs the same code on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FLUX1_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
SD35_MEDIUM = dict(
    sample_size=128,
    patch_size=2,
    in_channels=16,
    num_layers=24,
    attention_head_dim=64,
    num_attention_heads=24,
    joint_attention_dim=4096,
    caption_projection_dim=1536,
    pooled_projection_dim=2048,
    out_channels=16,
    pos_embed_max_size=384,
    dual_attention_layers=tuple(range(13)),
    qk_norm="rms_norm",
)
SD35_LARGE = dict(
    SD35_MEDIUM,
    num_layers=38,
    num_attention_heads=38,
    caption_projection_dim=2432,
    pos_embed_max_size=192,
    dual_attention_layers=(),
)
QWEN_IMAGE = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    axes_dims_rope=(16, 56, 56),
)
FLUX2_DEV = dict(
    patch_size=1,
    in_channels=128,
    num_layers=8,
    num_single_layers=48,
    attention_head_dim=128,
    num_attention_heads=48,
    joint_attention_dim=15360,
    timestep_guidance_channels=256,
    mlp_ratio=3.0,
    axes_dims_rope=(32, 32, 32, 32),
    guidance_embeds=True,
)
FLUX2_KLEIN_4B = dict(FLUX2_DEV, num_layers=5, num_single_layers=20, num_attention_heads=24, joint_attention_dim=7680)
FLUX2_KLEIN_9B = dict(FLUX2_DEV, num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288)
for _klein in (FLUX2_KLEIN_4B, FLUX2_KLEIN_9B):
    _klein["guidance_embeds"] = False


@dataclass(frozen=True)
class Spec:
    hub_id: str
    adapter: str  # models/<adapter>.py
    transformer: str  # the diffusers class
    config: dict[str, Any]
    tiny: dict[str, Any]  # the same architecture at CPU sizes
    embeds: dict[str, tuple[int, ...]]  # one prompt's cached embeddings, [1, ...] dropped
    resolution: int  # the references' training resolution
    guidance: str  # how the model is guided
    text_encoders: dict[str, float] = field(default_factory=dict)  # name -> parameters (billions)
    pipe: dict[str, Any] = field(default_factory=dict)  # extra attributes of the stand-in pipeline


TINY_FLUX1 = dict(
    FLUX1_DEV,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=(4, 4, 8),
)
TINY_SD3 = dict(
    SD35_MEDIUM,
    sample_size=8,
    num_layers=2,
    attention_head_dim=8,
    num_attention_heads=2,
    joint_attention_dim=32,
    caption_projection_dim=16,
    pooled_projection_dim=32,
    pos_embed_max_size=16,
    dual_attention_layers=(0,),
)
TINY_QWEN = dict(
    QWEN_IMAGE,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    axes_dims_rope=(4, 6, 6),
)
TINY_FLUX2 = dict(
    FLUX2_DEV,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=48,
    timestep_guidance_channels=16,
    axes_dims_rope=(4, 4, 4, 4),
)
SD15_UNET = dict(
    sample_size=64,
    in_channels=4,
    out_channels=4,
    layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    cross_attention_dim=768,
    attention_head_dim=8,
)
T5, CLIP_L, CLIP_G = 4.76, 0.12, 0.69  # T5-XXL encoder, CLIP ViT-L/14 and OpenCLIP bigG/14 text towers

MODELS: dict[str, Spec] = {
    "flux-dev": Spec(
        "black-forest-labs/FLUX.1-dev",
        "flux",
        "FluxTransformer2DModel",
        FLUX1_DEV,
        TINY_FLUX1,
        {"prompt_embeds": (512, 4096), "pooled": (768,)},
        720,
        "embedded 3.5",
        {"T5-XXL": T5, "CLIP-L": CLIP_L},
    ),
    "flux-schnell": Spec(
        "black-forest-labs/FLUX.1-schnell",
        "flux",
        "FluxTransformer2DModel",
        dict(FLUX1_DEV, guidance_embeds=False),
        dict(TINY_FLUX1, guidance_embeds=False),
        {"prompt_embeds": (256, 4096), "pooled": (768,)},
        720,
        "none (4-step distilled)",
        {"T5-XXL": T5, "CLIP-L": CLIP_L},
    ),
    "sd3.5-medium": Spec(
        "stabilityai/stable-diffusion-3.5-medium",
        "sd3",
        "SD3Transformer2DModel",
        SD35_MEDIUM,
        TINY_SD3,
        {"prompt_embeds": (333, 4096), "pooled": (2048,)},
        512,
        "true CFG 4.5",
        {"T5-XXL": T5, "CLIP-L": CLIP_L, "CLIP-G": CLIP_G},
    ),
    "sd3.5-large": Spec(
        "stabilityai/stable-diffusion-3.5-large",
        "sd3",
        "SD3Transformer2DModel",
        SD35_LARGE,
        dict(TINY_SD3, dual_attention_layers=()),
        {"prompt_embeds": (333, 4096), "pooled": (2048,)},
        512,
        "true CFG 3.5",
        {"T5-XXL": T5, "CLIP-L": CLIP_L, "CLIP-G": CLIP_G},
    ),
    "qwen-image": Spec(
        "Qwen/Qwen-Image",
        "qwenimage",
        "QwenImageTransformer2DModel",
        QWEN_IMAGE,
        TINY_QWEN,
        {"prompt_embeds": (64, 3584)},  # a prompt of about 60 tokens: Qwen-Image keeps each prompt's own length
        1024,
        "true CFG 4.0, renormalised",
        {"Qwen2.5-VL-7B": 8.29},
    ),
    "flux2-dev": Spec(
        "black-forest-labs/FLUX.2-dev",
        "flux2",
        "Flux2Transformer2DModel",
        FLUX2_DEV,
        TINY_FLUX2,
        {"prompt_embeds": (512, 15360)},
        1024,
        "embedded 4.0",
        {"Mistral-Small-3.1-24B": 24.0},
        {"config": {"is_distilled": False}},
    ),
    "flux2-klein-4b": Spec(
        "black-forest-labs/FLUX.2-klein-4B",
        "flux2",
        "Flux2Transformer2DModel",
        FLUX2_KLEIN_4B,
        dict(TINY_FLUX2, guidance_embeds=False),
        {"prompt_embeds": (512, 7680)},
        1024,
        "none (4-step distilled)",
        {"Qwen3-4B": 4.02},
        {"config": {"is_distilled": True}},
    ),
    "flux2-klein-9b": Spec(
        "black-forest-labs/FLUX.2-klein-9B",
        "flux2",
        "Flux2Transformer2DModel",
        FLUX2_KLEIN_9B,
        dict(TINY_FLUX2, guidance_embeds=False),
        {"prompt_embeds": (512, 12288)},
        1024,
        "none (4-step distilled)",
        {"Qwen3-8B": 8.19},
        {"config": {"is_distilled": True}},
    ),
    "flux2-klein-base-4b": Spec(
        "black-forest-labs/FLUX.2-klein-base-4B",
        "flux2",
        "Flux2Transformer2DModel",
        FLUX2_KLEIN_4B,
        dict(TINY_FLUX2, guidance_embeds=False),
        {"prompt_embeds": (512, 7680)},
        1024,
        "true CFG 4.0",
        {"Qwen3-4B": 4.02},
        {"config": {"is_distilled": False}},
    ),
    "flux2-klein-base-9b": Spec(
        "black-forest-labs/FLUX.2-klein-base-9B",
        "flux2",
        "Flux2Transformer2DModel",
        FLUX2_KLEIN_9B,
        dict(TINY_FLUX2, guidance_embeds=False),
        {"prompt_embeds": (512, 12288)},
        1024,
        "true CFG 4.0",
        {"Qwen3-8B": 8.19},
        {"config": {"is_distilled": False}},
    ),
    "sd1.5": Spec(  # a UNet: in the memory table, not in flux_iteration.py (a transformer benchmark)
        "stable-diffusion-v1-5/stable-diffusion-v1-5",
        "sd",
        "UNet2DConditionModel",
        SD15_UNET,
        {},
        {"prompt_embeds": (77, 768)},
        512,
        "true CFG 5.0",
        {"CLIP-L": CLIP_L},
    ),
}
TRANSFORMERS = [k for k, v in MODELS.items() if v.tiny]  # what flux_iteration.py runs


def build(spec: Spec, tiny: bool, device: Any, dtype: Any, seed: int = 0) -> Any:
    """The spec's transformer with its parameters on the meta device (accelerate's init_empty_weights; buffers
    such as RoPE tables are built for real), then seeded-normal weights allocated on `device` (no download)."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        net = getattr(diffusers, spec.transformer)(**(spec.tiny if tiny else spec.config))
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in net.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            w = torch.empty(p.shape, device=device, dtype=dtype).normal_(0.0, 0.02, generator=gen)
            setattr(module, name, torch.nn.Parameter(w, requires_grad=p.requires_grad))
    return net.to(device).eval()


def embed_shapes(spec: Spec, tiny: bool) -> dict[str, tuple[int, ...]]:
    """The cached embeddings' shapes; tiny: 8 text tokens of the tiny transformer's width."""
    if not tiny:
        return spec.embeds
    width = spec.tiny.get("joint_attention_dim", 32)
    pooled = spec.tiny.get("pooled_projection_dim", 32)
    text = 8 + (77 if spec.adapter == "sd3" else 0)  # SD3: 77 CLIP tokens before the T5 ones
    return {k: ((text, width) if k == "prompt_embeds" else (pooled,)) for k in spec.embeds}

"""CLIP score: the cosine of open_clip image and text features (prompt alignment).

The raw cosine (about 0.2-0.4 for matching pairs), as the TreeGRPO and MixGRPO tables report it; the
CLIPScore of Hessel et al. (2021) is 2.5 * max(cosine, 0), which clip.form=clipscore gives.

    clip.checkpoint   an open_clip checkpoint of clip.arch; $TREEGRPO_CLIP_CHECKPOINT (ViT-B-32 also
                      $TREEGRPO_CLIP, the file of the diversity `clip` features); hub cache: the OpenAI
                      or LAION open_clip repositories listed in HUB
    clip.arch         ViT-B-32 (default), ViT-L-14, ViT-H-14, ... (any open_clip config)
    clip.quick_gelu   OpenAI weights were trained with QuickGELU; default: true when the file comes
                      from an `.openai` hub repository or its path contains "openai", else false
    clip.form         cosine (default) | clipscore
    clip.batch_size   images per forward (32)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from .base import register
from .vision import ModelReward, as_bool, as_choice, as_int, build_open_clip
from .weights import CACHE, Needed, resolve

OPEN_CLIP_FILES = ("open_clip_pytorch_model.bin", "open_clip_model.safetensors")
HUB = {
    "ViT-B-32": ("timm/vit_base_patch32_clip_224.openai", "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"),
    "ViT-L-14": ("timm/vit_large_patch14_clip_224.openai", "laion/CLIP-ViT-L-14-laion2B-s32B-b82K"),
    "ViT-H-14": ("laion/CLIP-ViT-H-14-laion2B-s32B-b79K",),
}


def checkpoint_file(arch: str, option: str, env: tuple[str, ...]) -> Needed:
    hub = tuple((repo, f) for repo in HUB.get(arch, ()) for f in OPEN_CLIP_FILES)
    places = (CACHE / "open_clip_vit_b_32.bin",) if arch == "ViT-B-32" else ()
    return Needed(f"open_clip {arch} checkpoint", option, env, hub=hub, places=places)


def is_openai(path: Path) -> bool:
    return "openai" in str(path).lower()


class CLIPScore(ModelReward):
    """Cosine of open_clip image and text features."""

    name = "clip"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        checkpoint: str | None = None,
        arch: str = "ViT-B-32",
        quick_gelu: str | bool | None = None,
        form: str = "cosine",
        batch_size: int | str = 32,
    ):
        super().__init__(device, dtype, as_int(batch_size, "clip.batch_size"))
        self.form = as_choice(form, "clip.form", ("cosine", "clipscore"))
        env = ("TREEGRPO_CLIP_CHECKPOINT",) + (("TREEGRPO_CLIP",) if arch == "ViT-B-32" else ())
        (path,) = resolve("clip", [(checkpoint_file(arch, "clip.checkpoint", env), checkpoint)])
        quick = is_openai(path) if quick_gelu is None else as_bool(quick_gelu, "clip.quick_gelu")
        self.clip = build_open_clip("clip", arch, path, quick, self.device, dtype)
        self.source = str(path)

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        cos = (self.clip.image_features(images, self.dtype) * self.clip.text_features(prompts, self.device)).sum(-1)
        return 2.5 * cos.clamp(min=0) if self.form == "clipscore" else cos  # [b]


register(
    "clip",
    CLIPScore,
    options=("checkpoint", "arch", "quick_gelu", "form", "batch_size"),
    on_device=True,
    summary="CLIP score (open_clip, ViT-B-32 by default): image-text cosine",
)

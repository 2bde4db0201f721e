"""LAION aesthetic predictor v2 (christophschuhmann/improved-aesthetic-predictor): image-only.

The released MLP head (768 -> 1024 -> 128 -> 64 -> 16 -> 1, `sac+logos+ava1-l14-linearMSE.pth`) on
the L2-normalised image embedding of OpenAI CLIP ViT-L/14 (open_clip ViT-L-14 with QuickGELU).
Scores are on the AVA 1-10 scale (about 5-7 for typical generations); the prompt is ignored.

    aesthetic.head        sac+logos+ava1-l14-linearMSE.pth; $TREEGRPO_AESTHETIC_HEAD; also looked for in
                          ~/.cache/treegrpo/ and ~/.cache/ImageReward/ (where ImageReward's load_score puts it)
    aesthetic.clip        the OpenAI ViT-L-14 open_clip checkpoint; $TREEGRPO_AESTHETIC_CLIP; hub cache
                          timm/vit_large_patch14_clip_224.openai
    aesthetic.arch        ViT-L-14 (tests register tiny ones)
    aesthetic.quick_gelu  true (the OpenAI weights)
    aesthetic.batch_size  images per forward (32)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from .base import register
from .clip import checkpoint_file
from .vision import MLPHead, ModelReward, as_bool, as_int, build_open_clip
from .weights import CACHE, Needed, load_state_dict, load_strict, resolve

HEAD_FILE = "sac+logos+ava1-l14-linearMSE.pth"
HEAD = Needed(
    "LAION aesthetic head",
    "aesthetic.head",
    ("TREEGRPO_AESTHETIC_HEAD",),
    places=(CACHE / HEAD_FILE, Path.home() / ".cache" / "ImageReward" / HEAD_FILE),
)


class AestheticScore(ModelReward):
    """LAION aesthetic score of the image (1-10 scale)."""

    name = "aesthetic"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        head: str | None = None,
        clip: str | None = None,
        arch: str = "ViT-L-14",
        quick_gelu: str | bool = True,
        batch_size: int | str = 32,
    ):
        super().__init__(device, dtype, as_int(batch_size, "aesthetic.batch_size"))
        backbone = checkpoint_file(arch, "aesthetic.clip", ("TREEGRPO_AESTHETIC_CLIP",))
        head_path, clip_path = resolve("aesthetic", [(HEAD, head), (backbone, clip)])
        self.clip = build_open_clip(
            "aesthetic", arch, clip_path, as_bool(quick_gelu, "aesthetic.quick_gelu"), self.device, dtype
        )
        dim = int(self.clip.model.visual.output_dim)  # 768 for ViT-L-14
        self.head = MLPHead(dim)
        load_strict(self.head, load_state_dict(head_path), head_path, f"aesthetic MLP head for {dim}-d embeddings")
        self.head = self.head.eval().to(self.device, dtype)
        self.source = f"{head_path} + {clip_path}"

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        emb = self.clip.image_features(images, self.dtype)  # [b, D], unit norm
        return self.head(emb.to(self.dtype)).squeeze(-1)  # [b]


register(
    "aesthetic",
    AestheticScore,
    options=("head", "clip", "arch", "quick_gelu", "batch_size"),
    on_device=True,
    summary="LAION aesthetic predictor v2 on CLIP ViT-L/14 (1-10 scale, ~5-7)",
)

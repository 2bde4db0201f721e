"""HPS v2 / v2.1 (Wu et al. 2023, arXiv 2306.09341): human preference score.

An open_clip ViT-H-14 whose weights are the official checkpoint's `state_dict`; the score is the
cosine of the L2-normalised image and text features, with no logit scale, as the `hpsv2` package
computes it (typically 0.25-0.40 on natural images; methods.md 1.4). Preprocessing is open_clip's
ViT-H-14 val transform (224 px shortest edge, bicubic, centre crop, CLIP mean/std) on tensors.

    hps.checkpoint   HPS_v2.1_compressed.pt (or HPS_v2_compressed.pt with hps.version=v2.0); hub xswu/HPSv2
                     $TREEGRPO_HPS_CHECKPOINT
    hps.version      v2.1 (default) | v2.0
    hps.arch         the open_clip architecture (ViT-H-14; tests register tiny ones)
    hps.batch_size   images per forward (16)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import register
from .vision import ModelReward, as_choice, as_int, build_open_clip
from .weights import CACHE, Needed, resolve

FILES = {"v2.1": "HPS_v2.1_compressed.pt", "v2.0": "HPS_v2_compressed.pt"}


def checkpoint_file(version: str) -> Needed:
    name = FILES[version]
    return Needed(
        f"HPS {version} checkpoint",
        "hps.checkpoint",
        ("TREEGRPO_HPS_CHECKPOINT",),
        hub=(("xswu/HPSv2", name),),
        places=(CACHE / name,),
    )


class HPSReward(ModelReward):
    """HPS v2.x: cosine of open_clip ViT-H-14 image and text features with the HPS weights."""

    name = "hps"

    def __init__(
        self,
        device: torch.device,
        dtype: torch.dtype,
        checkpoint: str | None = None,
        version: str = "v2.1",
        arch: str = "ViT-H-14",
        batch_size: int | str = 16,
    ):
        super().__init__(device, dtype, as_int(batch_size, "hps.batch_size"))
        self.version = as_choice(version, "hps.version", tuple(FILES))
        (path,) = resolve("hps", [(checkpoint_file(self.version), checkpoint)])
        self.clip = build_open_clip("hps", arch, path, False, self.device, dtype)
        self.source = str(path)

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        img = self.clip.image_features(images, self.dtype)  # [b, D]
        txt = self.clip.text_features(prompts, self.device)  # [b, D]
        return (img * txt).sum(-1)  # [b] cosine


register(
    "hps",
    HPSReward,
    options=("checkpoint", "version", "arch", "batch_size"),
    on_device=True,
    summary="HPS v2.1 human preference (open_clip ViT-H-14), cosine ~0.25-0.40",
    needs=lambda checkpoint=None, version="v2.1", **_: [
        (checkpoint_file(as_choice(version, "hps.version", tuple(FILES))), checkpoint)
    ],
)

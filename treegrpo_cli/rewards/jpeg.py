"""JPEG compressibility rewards (DDPO): minus / plus the JPEG size of the image in kB."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from .base import register


def to_uint8(images: Tensor) -> np.ndarray:
    """[B, 3, H, W] float in [0, 1] -> [B, H, W, 3] uint8."""
    x = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


def jpeg_kb(images: Tensor, quality: int = 95) -> Tensor:
    sizes = []
    for arr in to_uint8(images):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegCompressibility:
    name = "jpeg-compressibility"

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        return -jpeg_kb(images)


class JpegIncompressibility:
    name = "jpeg-incompressibility"

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        return jpeg_kb(images)


register(JpegCompressibility.name, JpegCompressibility)
register(JpegIncompressibility.name, JpegIncompressibility)

"""Shared plumbing of the reward models: batching, devices and dtypes, CLIP-style preprocessing on
tensors, the 5-layer MLP head, and building an open_clip model from a local checkpoint.

Preprocessing works on batched tensors on the reward's device (no PIL round trip). Two flavours:
    float  torchvision's tensor semantics, as open_clip's val transform applied to a float tensor:
           resize the shortest edge (bicubic, antialiased), centre crop (offsets rounded), normalise
    uint8  transformers' CLIPImageProcessor: quantise to uint8, resize with uint8 rounding (on the
           CPU the native uint8 kernel, elsewhere float then clamp and round), crop (offsets floored),
           then rescale by 1/255 and normalise
Images that the reference tools read as PIL files are resampled there with PIL's bicubic filter;
on a float tensor the kernel differs slightly, so scores can differ in the third decimal.
"""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..compat import ensure_torchvision
from ..errors import ConfigError, TreegrpoError
from .weights import load_state_dict, load_strict

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


# --- options ---------------------------------------------------------------------------------


def as_int(value: Any, option: str, low: int = 1) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{option} must be an integer, got {value!r}") from None
    if v < low:
        raise ConfigError(f"{option} must be >= {low}, got {v}")
    return v


def as_bool(value: Any, option: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{option} must be true or false, got {value!r}")


def as_choice(value: Any, option: str, choices: tuple[str, ...]) -> str:
    if str(value) not in choices:
        raise ConfigError(f"{option} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


@contextmanager
def quiet() -> Iterator[None]:
    """Silence the warnings and progress bars model libraries emit while loading (open_clip warns that
    a model was "initialized randomly" before we load its weights; transformers draws a bar)."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    hf = sys.modules.get("transformers.utils.logging")
    bar = hf if hf is not None and hf.is_progress_bar_enabled() else None  # the module, when its bar is on
    if bar is not None:
        bar.disable_progress_bar()
    try:
        yield
    finally:
        logging.disable(previous)
        if bar is not None:
            bar.enable_progress_bar()


# --- the base class --------------------------------------------------------------------------


class ModelReward(ABC):
    """A reward computed by a network: scores images in chunks of batch_size on one device and
    dtype, without gradients, and returns float32 scores on the CPU."""

    name = ""
    video = False  # True: scores clips [B, 3, F, H, W] whole (score_leaves does not split them into frames)

    def __init__(self, device: torch.device, dtype: torch.dtype, batch_size: int = 16):
        self.device, self.dtype, self.batch_size = torch.device(device), dtype, batch_size

    @abstractmethod
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [b, 3, H, W] float32 in [0, 1] on self.device, b <= batch_size -> [b] scores."""

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [B, 3, H, W] (a video reward: clips [B, 3, F, H, W]) float in [0, 1] (uint8 accepted), prompts
        [B] -> scores [B] float32 (CPU)."""
        kind = "clips [B, 3, F, H, W]" if self.video else "images [B, 3, H, W]"
        if images.ndim != (5 if self.video else 4) or images.shape[1] != 3:
            raise TreegrpoError(f"{self.name} needs RGB {kind}, got {tuple(images.shape)}")
        if len(images) != len(prompts):
            raise TreegrpoError(f"{self.name}: {len(images)} {kind.split()[0]} but {len(prompts)} prompts")
        out = []
        for a in range(0, len(prompts), self.batch_size):
            x = images[a : a + self.batch_size].to(self.device)
            x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
            out.append(self.score(x, list(prompts[a : a + self.batch_size])).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)


# --- preprocessing ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ImagePrep:
    """Resize the shortest edge to `size`, centre-crop `crop` x `crop`, normalise (see the module docstring)."""

    size: int
    crop: int
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD
    interpolation: str = "bicubic"
    uint8: bool = False

    def __call__(self, x: Tensor) -> Tensor:
        """x [B, 3, H, W] float in [0, 1] -> [B, 3, crop, crop] float32, normalised."""
        if self.uint8:
            x = (x.float() * 255).round().clamp(0, 255).to(torch.uint8)  # [B, 3, H, W] uint8
        x = self._crop(self._resize(x))  # [B, 3, crop, crop]
        mean = torch.tensor(self.mean, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, 3, 1, 1)
        x = x.float() / 255.0 if self.uint8 else x.float()
        return (x - mean) / std

    def _resize(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        short, long = min(h, w), max(h, w)
        new_long = int(self.size * long / short)
        size = (self.size, new_long) if h <= w else (new_long, self.size)
        if size == (h, w):
            return x
        if x.dtype == torch.uint8 and x.device.type == "cpu":
            return F.interpolate(x, size=size, mode=self.interpolation, align_corners=False, antialias=True)
        y = F.interpolate(x.float(), size=size, mode=self.interpolation, align_corners=False, antialias=True)
        return y.clamp(0, 255).round().to(torch.uint8) if x.dtype == torch.uint8 else y

    def _crop(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        c = self.crop
        if h < c or w < c:
            raise TreegrpoError(f"image {h}x{w} is smaller than the {c}x{c} crop after resizing")
        if self.uint8:
            top, left = int((h - c) / 2.0), int((w - c) / 2.0)
        else:
            top, left = int(round((h - c) / 2.0)), int(round((w - c) / 2.0))
        return x[..., top : top + c, left : left + c]


# --- the MLP head of ImageReward and of the LAION aesthetic predictor ------------------------


class MLPHead(nn.Module):
    """dim -> 1024 -> 128 -> 64 -> 16 -> 1 with no activations (as released); the dropouts sit at
    indices 1, 3, 5, so the weights are layers.{0,2,4,6,7}.{weight,bias}."""

    def __init__(self, dim: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x [B, dim] -> [B, 1]."""
        return self.layers(x)


# --- open_clip -------------------------------------------------------------------------------


def import_open_clip(reward: str):
    """open_clip, after making a CUDA-built torchvision importable on CPU torch (see compat.py)."""
    how = "pip install open_clip_torch 'torchvision==X' with X the torchvision of your torch (0.28.0 for torch 2.13)"
    try:
        ensure_torchvision()
        import open_clip
    except (ImportError, RuntimeError) as e:
        why = " ".join(str(e).split())[:120]
        raise TreegrpoError(f"the {reward} reward needs a working open_clip ({why}): {how}") from None
    return open_clip


@dataclass
class OpenClip:
    """An open_clip model with its tokenizer and tensor preprocessing."""

    model: Any  # an open_clip CLIP (an nn.Module; open_clip ships no type hints)
    tokenizer: Any
    prep: ImagePrep

    def image_features(self, images: Tensor, dtype: torch.dtype) -> Tensor:
        """images [b, 3, H, W] in [0, 1] -> L2-normalised features [b, D] float32."""
        return self.model.encode_image(self.prep(images).to(dtype), normalize=True).float()

    def text_features(self, prompts: list[str], device: torch.device) -> Tensor:
        """prompts [b] -> L2-normalised features [b, D] float32."""
        return self.model.encode_text(self.tokenizer(prompts).to(device), normalize=True).float()


def build_open_clip(
    reward: str, arch: str, path: Path, quick_gelu: bool, device: torch.device, dtype: torch.dtype
) -> OpenClip:
    """open_clip `arch` (a built-in or registered config, random init) with every tensor of `path` (strict)."""
    open_clip = import_open_clip(reward)
    if arch not in open_clip.list_models():
        raise ConfigError(f"{reward}: unknown open_clip architecture {arch!r} (e.g. ViT-B-32, ViT-L-14, ViT-H-14)")
    with quiet():
        model = open_clip.create_model(arch, pretrained=None, force_quick_gelu=quick_gelu)
    load_strict(model, load_state_dict(path), path, f"open_clip {arch} checkpoint")
    model = model.eval().to(device=device, dtype=dtype)
    cfg = open_clip.get_model_preprocess_cfg(model)
    size = cfg.get("size", 224)
    size = size[0] if isinstance(size, (tuple, list)) else size
    if cfg.get("resize_mode", "shortest") != "shortest":
        raise ConfigError(f"{reward}: {arch} uses resize_mode {cfg['resize_mode']!r}; only 'shortest' is supported")
    prep = ImagePrep(
        int(size),
        int(size),
        tuple(cfg.get("mean", CLIP_MEAN)),
        tuple(cfg.get("std", CLIP_STD)),
        "bilinear" if cfg.get("interpolation") == "bilinear" else "bicubic",
    )
    return OpenClip(model, open_clip.get_tokenizer(arch), prep)

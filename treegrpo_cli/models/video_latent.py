"""The moving-shapes world's video model: the image world's autoencoder on every frame, and a latent DiT whose
tokens are the 2x2 patches of the latent grid with every frame of the clip in their channels.

A clip [3, F, 32, 32] encodes frame by frame into F latents [4, 8, 8]; the policy's latent stacks them frame-major
into [F x 4, 8, 8]. Folding time into channels keeps a clip at the image model's 16 tokens (8 frames as 128
space-time tokens would make every step about 8 times dearer in the blocks and 64 times in attention), so RL on
the world runs in minutes on a CPU; the motion the world asks for (2 px a frame, 3.5 latent px over a clip)
crosses patches, which global attention over the 16 tokens covers. decode() gives videos [B, 3, F, 32, 32].
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from .dit import VOCAB, DiTConfig, TinyDiT
from .latent import AEConfig, LatentDiTPolicy, ShapesAE, latent_dit_config

MOTION_WORDS = ("moving", "up", "down")  # "left" and "right" are in the image world's vocabulary
# frames per autoencoder call, in channels-last layout: about 3x faster on a CPU than all of a rollout's frames in
# one call (decoding 8 frames a clip is most of an RL iteration's cost on this world)
AE_CHUNK = 64
VIDEO_VOCAB = VOCAB + MOTION_WORDS


def video_dit_config(ae: AEConfig, frames: int, **kw) -> DiTConfig:
    """The image world's latent DiT with the clip's frames in its channels and the motion words."""
    return latent_dit_config(ae, **{"channels": ae.latent_channels * frames, "vocab": VIDEO_VOCAB, **kw})


class VideoLatentPolicy(LatentDiTPolicy):
    """Policy adapter for the moving-shapes model (LatentDiTPolicy's arguments): the DiT is trained, the per-frame
    autoencoder stays frozen; the frame count is the DiT's channels over the autoencoder's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        c, h, w = self.ae.latent_shape
        if self.cfg.channels % c:
            raise ValueError(f"a DiT of {self.cfg.channels} channels does not hold whole frames of {c}")
        self.frames = self.cfg.channels // c
        self.latent_shape = (self.cfg.channels, h, w)
        self.ae.to(memory_format=torch.channels_last)  # the same weights, laid out for faster CPU convolutions

    def decode(self, latents: Tensor) -> Tensor:
        """[B, F C, h, w] -> videos [B, 3, F, H, W] in [0, 1]."""
        B, (F, c) = latents.shape[0], (self.frames, self.ae.latent_shape[0])
        flat = latents.reshape(B * F, c, *latents.shape[2:]).contiguous(memory_format=torch.channels_last)
        frames = torch.cat([super(VideoLatentPolicy, self).decode(z) for z in flat.split(AE_CHUNK)])  # [B F, 3, H, W]
        return frames.reshape(B, F, *frames.shape[1:]).transpose(1, 2)

    def encode_images(self, images: Tensor) -> Tensor:
        """videos [B, 3, F, H, W] in [0, 1] -> the latents the DiT denoises [B, F C, h, w]."""
        B, F = images.shape[0], images.shape[2]
        flat = images.transpose(1, 2).reshape(B * F, *images.shape[1:2], *images.shape[3:])  # [B F, 3, H, W]
        flat = flat.contiguous(memory_format=torch.channels_last)
        z = torch.cat([super(VideoLatentPolicy, self).encode_images(x) for x in flat.split(AE_CHUNK)])
        return z.reshape(B, F * z.shape[1], *z.shape[2:])

    def reference(self) -> VideoLatentPolicy:
        frozen = copy.deepcopy(self.net).requires_grad_(False)
        return VideoLatentPolicy(self.cfg, frozen, self.ae, f"{self.name}-reference", self.source, self.guidance)

    def describe(self) -> dict:
        return {**super().describe(), "adapter": "video-latent-dit", "frames": self.frames}


def new_video_model(ae: ShapesAE, frames: int, seed: int = 0, **kw) -> VideoLatentPolicy:
    """A freshly initialised video DiT on a trained image autoencoder (pretraining starts here)."""
    torch.manual_seed(seed)
    cfg = video_dit_config(ae.cfg, frames, **kw)
    return VideoLatentPolicy(cfg, TinyDiT(cfg), ae, "tiny-shapes-video")

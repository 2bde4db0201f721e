"""The latent shapes model: a small autoencoder for 32x32 scenes and a DiT on its 8x8x4 latents.

As FLUX and SD3 do at scale, the denoiser works in the latent space of a frozen autoencoder:

    image [3, 32, 32] in [-1, 1] --encoder--> z [4, 8, 8] --(z - shift) / scale--> latent
    latent --decoder--> image

The DiT sees 2x2 latent patches (16 image tokens instead of the pixel model's 64, no refiner), so a
forward costs several times less and the policy's noise lives in 256 dimensions instead of 3072.
Flat-coloured shapes reconstruct almost exactly. The decoder is trained on slightly noisy latents so
that it draws clean shapes from the sampler's imperfect ones.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dit import DiTConfig, DiTPolicy, TinyDiT


@dataclass(frozen=True)
class AEConfig:
    image_size: int = 32
    latent_channels: int = 4
    width: int = 64  # channels at the latent resolution (half of it at full resolution)
    downs: int = 2  # stride-2 stages: 32 -> 8


class ShapesAE(nn.Module):
    """Convolutional autoencoder; latents are normalised by per-channel (shift, scale) buffers fitted on data."""

    shift: Tensor  # [c] buffers
    scale: Tensor

    def __init__(self, cfg: AEConfig):
        super().__init__()
        self.cfg = cfg
        w, c = cfg.width, cfg.latent_channels
        enc: list[nn.Module] = [nn.Conv2d(3, w // 2, 3, padding=1), nn.GELU()]
        ch = w // 2
        for _ in range(cfg.downs):
            enc += [nn.Conv2d(ch, w, 4, stride=2, padding=1), nn.GELU(), nn.Conv2d(w, w, 3, padding=1), nn.GELU()]
            ch = w
        enc += [nn.Conv2d(w, c, 1)]
        dec: list[nn.Module] = [nn.Conv2d(c, w, 3, padding=1), nn.GELU(), nn.Conv2d(w, w, 3, padding=1), nn.GELU()]
        for i in range(cfg.downs):
            out = w if i < cfg.downs - 1 else w // 2  # full resolution: half the channels
            dec += [nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(w, out, 3, padding=1), nn.GELU()]
        dec += [nn.Conv2d(w // 2, 3, 3, padding=1)]
        self.encoder, self.decoder = nn.Sequential(*enc), nn.Sequential(*dec)
        self.register_buffer("shift", torch.zeros(c))
        self.register_buffer("scale", torch.ones(c))

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        side = self.cfg.image_size // 2**self.cfg.downs
        return (self.cfg.latent_channels, side, side)

    def encode(self, images: Tensor) -> Tensor:
        # images [B, 3, H, W] in [0, 1] -> normalised latents [B, c, h, w]
        z = self.encoder(images * 2 - 1)
        return (z - self.shift[:, None, None]) / self.scale[:, None, None]

    def decode(self, latents: Tensor) -> Tensor:
        # normalised latents [B, c, h, w] -> images [B, 3, H, W] in [0, 1]
        z = latents * self.scale[:, None, None] + self.shift[:, None, None]
        return (self.decoder(z).clamp(-1, 1) + 1) / 2

    def reconstruction_loss(self, images: Tensor, g: torch.Generator, latent_noise: float = 0.1) -> Tensor:
        """MSE of decode(encode(x) + noise) in [-1, 1] units, plus a small penalty on the latent's size."""
        z = self.encoder(images * 2 - 1)
        noise = torch.randn(z.shape, generator=g) * latent_noise * z.detach().std()
        x = self.decoder(z + noise)
        return F.mse_loss(x, images * 2 - 1) + 1e-4 * z.pow(2).mean()

    @torch.no_grad()
    def fit_normaliser(self, images: Tensor) -> None:
        """Per-channel mean and std of the raw latents of these images become (shift, scale)."""
        z = self.encoder(images * 2 - 1)
        self.shift.copy_(z.mean(dim=(0, 2, 3)))
        self.scale.copy_(z.std(dim=(0, 2, 3)).clamp(min=1e-4))


def latent_dit_config(ae: AEConfig, **kw) -> DiTConfig:
    """The DiT that denoises ShapesAE latents: 2x2 patches, the prompt in adaLN, no pixel refiner."""
    c, side = ae.latent_channels, ae.image_size // 2**ae.downs
    base = dict(
        image_size=side,
        channels=c,
        patch=2,
        dim=128,
        depth=4,
        heads=4,
        mlp_ratio=3.0,
        max_words=10,
        text_ada=True,
        refine=0,
    )
    return DiTConfig(**{**base, **kw})


class LatentDiTPolicy(DiTPolicy):
    """Policy adapter for the latent shapes model: the DiT is trained, the autoencoder stays frozen."""

    def __init__(
        self,
        cfg: DiTConfig,
        net: TinyDiT,
        ae: ShapesAE,
        name: str = "tiny-shapes",
        source: str = "",
        guidance: float = 1.0,
    ):
        super().__init__(cfg, net, name, source, guidance)
        self.ae = ae.requires_grad_(False).eval()
        self.latent_shape = ae.latent_shape

    def decode(self, latents: Tensor) -> Tensor:
        ae_device = next(self.ae.parameters()).device
        with torch.no_grad():
            return self.ae.decode(latents.float().to(ae_device)).to(latents.device)

    def encode_images(self, images: Tensor) -> Tensor:
        """images [B, 3, 32, 32] in [0, 1] -> the latents the DiT denoises."""
        with torch.no_grad():
            return self.ae.encode(images)

    def reference(self) -> LatentDiTPolicy:
        return LatentDiTPolicy(
            self.cfg,
            copy.deepcopy(self.net).requires_grad_(False),
            self.ae,
            f"{self.name}-reference",
            self.source,
            self.guidance,
        )

    def describe(self) -> dict:
        out = super().describe()
        out.update(adapter="latent-dit", autoencoder=asdict(self.ae.cfg))
        return out

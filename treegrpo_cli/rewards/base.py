"""The Reward protocol and registry: images and prompts in, one score each.

Rewards know nothing of trees. Several rewards combine with weights, either as a weighted sum of
scores or as a weighted sum of per-reward advantages (see engine.advantages.combine).

Registered rewards (see docs/rewards.md for weights, environment variables and score ranges):

    shapes, jpeg-compressibility, jpeg-incompressibility   no weights, no options
    hps, pick, imagereward, clip, aesthetic                 reward models from local weights files
    motion-shapes, videoalign                               video rewards (`video = True`: whole clips)
    ocr                                                     text rendering (RapidOCR, the `ocr` extra)

Plugins (rewards/plugins.py): an entry point of the group `treegrpo.rewards` by its name, FILE.py:FUNCTION and
MODULE:FUNCTION; `register()` adds a reward in-process.

A model reward's factory takes `device`, `dtype` and its own options (e.g. `checkpoint`); the
registry imports the modules of every reward at once, but those modules import open_clip or
transformers only inside their factories, so nothing heavy loads until such a reward is requested.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from ..store.trees import to_uint8


@runtime_checkable
class Reward(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [B, 3, H, W] float in [0, 1], prompts [B] -> scores [B] float32."""


@dataclass(frozen=True)
class RewardSpec:
    """How to build one named reward."""

    name: str
    factory: Callable[..., Reward]
    options: tuple[str, ...] = ()  # keyword options the factory takes (besides device and dtype)
    on_device: bool = False  # the factory takes device= and dtype= (a model reward)
    summary: str = ""
    # options -> the (Needed, given path) items of weights.resolve: the files a model reward needs, found
    # without loading anything (check_weights); None: nothing to find
    needs: Callable[..., list[Any]] | None = None


_REGISTRY: dict[str, RewardSpec] = {}
# the modules of rewards/ that register the built-in rewards
BUILTINS = ("jpeg", "shapes", "motion", "hps", "pick", "imagereward", "clip", "aesthetic", "videoalign", "ocr")
DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def register(
    name: str,
    factory: Callable[..., Reward],
    *,
    options: tuple[str, ...] = (),
    on_device: bool = False,
    summary: str = "",
    needs: Callable[..., list[Any]] | None = None,
) -> None:
    _REGISTRY[name] = RewardSpec(name, factory, tuple(options), on_device, summary, needs)


def available() -> list[str]:
    """The built-in and registered rewards, and the installed plugins' (their entry points, none loaded)."""
    from .plugins import entry_points

    _load_builtins()
    return sorted({*_REGISTRY, *entry_points()})


def spec(name: str) -> RewardSpec:
    """The registry entry of a reward name; a ConfigError naming the closest name when unknown."""
    _load_builtins()
    if name.startswith(("http://", "https://")):  # a `treegrpo serve-reward` server (rewards/remote.py)
        from .remote import RemoteReward

        return RewardSpec(name, lambda: RemoteReward(name), summary="a reward served over HTTP")
    from . import plugins  # FILE.py:FN, MODULE:FN and the entry points of treegrpo.rewards (rewards/plugins.py)

    if name in _REGISTRY:
        if (clash := plugins.clash(name)) is not None:
            raise ConfigError(clash)
        return _REGISTRY[name]
    found = plugins.plugin_spec(name)
    if found is None:
        names = [*_REGISTRY, *plugins.entry_points()]
        low = name.lower()  # HPS -> hps: any case, then the closest spelling
        close = [n for n in names if n.lower() == low] or difflib.get_close_matches(low, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        hint += "; a file's reward is named FILE.py:FUNCTION" if name.endswith(".py") else ""
        raise ConfigError(f"unknown reward {shown(name)} (available: {', '.join(sorted(names))}){hint}")
    return found


def check_rewards(names: list[str] | tuple[str, ...], options: dict[str, dict[str, str]]) -> None:
    """Every name and option of a reward list, checked before any reward model loads (a typo in the second name
    is reported before the first one's missing weights)."""
    for name in names:
        s = spec(name)
        bad = sorted(set(options.get(name, {})) - set(s.options))
        if bad:
            raise ConfigError(
                f"reward {shown(name)} has no option {shown(bad[0])} (its options: {', '.join(s.options) or 'none'})"
            )
    stray = sorted(set(options) - set(names))
    if stray:
        raise ConfigError(f"reward options for {shown(stray[0])}, which the reward list does not name")


def check_weights(names: list[str] | tuple[str, ...], options: dict[str, dict[str, str]]) -> None:
    """Every reward model's weight files are where the loader looks (options, environment, caches): one line
    naming the missing ones and how to supply them, before any model loads."""
    from .weights import resolve

    for name in names:
        s = spec(name)
        if s.needs is not None:
            resolve(name, s.needs(**options.get(name, {})))


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {shown(dtype)} (use one of {', '.join(DTYPES)})")
    return DTYPES[dtype]


def get_reward(
    name: str, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None, **options: Any
) -> Reward:
    """Build the reward `name`; model rewards go to `device` in `dtype` (default cpu, float32).

    Options are the factory's own (see RewardSpec.options); an unknown one is a ConfigError.
    """
    s = spec(name)
    bad = sorted(set(options) - set(s.options))
    if bad:
        valid = ", ".join(s.options) or "none"
        raise ConfigError(f"reward {shown(name)} has no option {shown(bad[0])} (its options: {valid})")
    if s.on_device:
        return s.factory(device=torch.device(device or "cpu"), dtype=parse_dtype(dtype) or torch.float32, **options)
    return s.factory(**options)


def parse_reward_options(items: list[str] | tuple[str, ...]) -> dict[str, dict[str, str]]:
    """['hps.checkpoint=/w.pt', 'pick.form=logit'] -> {'hps': {'checkpoint': '/w.pt'}, 'pick': {'form': 'logit'}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        name, dot, opt = key.strip().rpartition(".")  # the last dot: a plugin's name may hold dots (my.py:fn)
        if not sep or not dot or not name or not opt:
            raise ConfigError(f"reward options look like NAME.KEY=VALUE (e.g. hps.checkpoint=/path); got {shown(item)}")
        allowed = spec(name).options
        if opt not in allowed:
            raise ConfigError(
                f"reward {shown(name)} has no option {shown(opt)} (its options: {', '.join(allowed) or 'none'})"
            )
        out.setdefault(name, {})[opt] = value.strip()
    return out


def parse_rewards(names: str, weights: str | None = None) -> dict[str, float]:
    """'a,b' and '0.8,0.2' -> {'a': 0.8, 'b': 0.2}; weights default to 1 each."""
    keys = [n.strip() for n in names.split(",") if n.strip()]
    if not keys:
        raise ConfigError("no reward named; pass --reward NAME[,NAME]")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"reward named twice in {shown(names)}")
    for k in keys:
        spec(k)  # fail early on an unknown name, without building a model
    if weights is None:
        return {k: 1.0 for k in keys}
    try:
        w = [float(x) for x in weights.split(",")]
    except ValueError:
        raise ConfigError(f"--weights must be numbers separated by commas, got {shown(weights)}") from None
    if len(w) != len(keys):
        raise ConfigError(f"{len(keys)} rewards but {len(w)} weights")
    return dict(zip(keys, w, strict=True))


def weighted_sum(scores: dict[str, Tensor], weights: dict[str, float]) -> Tensor:
    """The sum over the weights of w * scores[name], in the weights' order (Python's sum, bit for bit)."""
    total = sum(w * scores[n] for n, w in weights.items())
    if not isinstance(total, Tensor):
        raise ConfigError("at least one reward weight is needed")
    return total


def score_leaves(
    rewards: dict[str, Reward],
    images: Tensor,
    prompts: list[str],
    batch: int = 64,
    progress: Callable[[str, int, int], None] | None = None,
    frame_stride: int = 1,
) -> dict[str, Tensor]:
    """{name: [L] float32} for images [L, 3, H, W] or videos [L, 3, F, H, W] (float in [0, 1] or uint8), scored in
    batches through score_batch (reward_images: every reward sees the uint8 image as float). A video meets an image
    reward frame by frame: every frame_stride-th frame from the first is scored with the clip's prompt and the
    clip's score is their mean; a reward with `video = True` takes the clips."""
    if frame_stride < 1:
        raise ConfigError(f"frame_stride must be >= 1, got {frame_stride}")
    out = {}
    for name, fn in rewards.items():
        vals = []
        for a in range(0, len(prompts), batch):
            vals.append(score_batch(fn, images[a : a + batch], prompts[a : a + batch], frame_stride).float().cpu())
            if progress:
                progress(f"score {name}", min(a + batch, len(prompts)), len(prompts))
        out[name] = torch.cat(vals) if vals else torch.zeros(0)
    return out


def reward_images(images: Tensor) -> Tensor:
    """The one encoding every reward is handed (training online and staged, held-out evaluation, sample grids,
    `treegrpo eval`, the reward server): the picture as the uint8 a tree folder stores, as float32 in [0, 1]
    (uint8 / 255). Float images (a decode) are clamped and rounded to uint8 first (store.trees.to_uint8), so a
    picture scores the same whether it is scored as decoded or after it was stored."""
    return (images if images.dtype == torch.uint8 else to_uint8(images)).float() / 255.0


def score_batch(fn: Reward, x: Tensor, prompts: list[str], stride: int = 1) -> Tensor:
    """fn on images [B, 3, H, W] (float in [0, 1] or uint8), encoded by reward_images; on videos [B, 3, F, H, W]
    the mean over frames 0, stride, 2 stride, ... Every path that scores with a reward calls it through here."""
    x = reward_images(x)
    if x.dim() == 4 or getattr(fn, "video", False):
        return fn(x, prompts)
    return frame_mean(fn, x, prompts, stride)


def frame_mean(fn: Reward, videos: Tensor, prompts: list[str], stride: int = 1) -> Tensor:
    """[B] the mean of an image reward over the frames 0, stride, 2 stride, ... of videos [B, 3, F, H, W]."""
    frames = videos[:, :, ::stride]  # [B, 3, F', H, W]
    B, F = frames.shape[0], frames.shape[2]
    flat = frames.transpose(1, 2).reshape(B * F, *frames.shape[1:2], *frames.shape[3:])  # [B F', 3, H, W]
    return fn(flat, [p for p in prompts for _ in range(F)]).float().view(B, F).mean(1)


@dataclass
class FrameStrided:
    """An image reward on videos at a frame stride (reward.frame_stride); images pass through."""

    reward: Reward
    stride: int
    video = True

    @property
    def name(self) -> str:
        return self.reward.name

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        if images.dim() == 4 or getattr(self.reward, "video", False):
            return self.reward(images, prompts)
        return frame_mean(self.reward, images, prompts, self.stride)


def _load_builtins() -> None:
    """Import the reward modules (each registers itself; the model ones import no model library yet)."""
    for module in BUILTINS:
        importlib.import_module(f"{__package__}.{module}")

"""The Reward protocol and registry: images and prompts in, one score each.

Rewards know nothing of trees. Several rewards combine with weights, either as a weighted sum of
scores or as a weighted sum of per-reward advantages (see engine.advantages.combine).
"""

from __future__ import annotations

import difflib
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..errors import ConfigError


@runtime_checkable
class Reward(Protocol):
    name: str

    def __call__(self, images: Tensor, prompts: list[str]) -> Tensor:
        """images [B, 3, H, W] float in [0, 1], prompts [B] -> scores [B] float32."""


_REGISTRY: dict[str, Callable[[], Reward]] = {}


def register(name: str, factory: Callable[[], Reward]) -> None:
    _REGISTRY[name] = factory


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_reward(name: str) -> Reward:
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown reward {name!r} (available: {', '.join(sorted(_REGISTRY))}){hint}")
    return _REGISTRY[name]()


def parse_rewards(names: str, weights: str | None = None) -> dict[str, float]:
    """'a,b' and '0.8,0.2' -> {'a': 0.8, 'b': 0.2}; weights default to 1 each."""
    keys = [n.strip() for n in names.split(",") if n.strip()]
    if not keys:
        raise ConfigError("no reward named; pass --reward NAME[,NAME]")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"reward named twice in {names!r}")
    if weights is None:
        return {k: 1.0 for k in keys}
    try:
        w = [float(x) for x in weights.split(",")]
    except ValueError:
        raise ConfigError(f"--weights must be numbers separated by commas, got {weights!r}") from None
    if len(w) != len(keys):
        raise ConfigError(f"{len(keys)} rewards but {len(w)} weights")
    for k in keys:
        get_reward(k)  # fail early on an unknown name
    return dict(zip(keys, w))


def score_leaves(rewards: dict[str, Reward], images: Tensor, prompts: list[str], batch: int = 64,
                 progress: Callable[[str, int, int], None] | None = None) -> dict[str, Tensor]:
    """{name: [L] float32} for images [L, 3, H, W] (float in [0, 1] or uint8), scored in batches."""
    out = {}
    for name, fn in rewards.items():
        vals = []
        for a in range(0, len(prompts), batch):
            x = images[a:a + batch]
            x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
            vals.append(fn(x, prompts[a:a + batch]).float().cpu())
            if progress:
                progress(f"score {name}", min(a + batch, len(prompts)), len(prompts))
        out[name] = torch.cat(vals) if vals else torch.zeros(0)
    return out


def _load_builtins() -> None:
    from . import jpeg  # noqa: F401  (registers on import)
    from . import shapes  # noqa: F401

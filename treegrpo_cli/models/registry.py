"""Model names -> Policy adapters."""

from __future__ import annotations

import difflib

import torch

from ..errors import ConfigError
from .base import Policy
from .pixel import PixelConfig, PixelPolicy

MODELS = {
    "pixel": "a small pixel-space flow network with seeded random weights (engine tests and benchmarks)",
}


def load_policy(name: str, device: str | torch.device = "cpu") -> Policy:
    if name == "pixel":
        policy = PixelPolicy(PixelConfig(), name="pixel")
        policy.net.to(device)
        return policy
    close = difflib.get_close_matches(name, MODELS, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown model {name!r} (available: {', '.join(MODELS)}){hint}")

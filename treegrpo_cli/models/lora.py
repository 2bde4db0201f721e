"""LoRA on a diffusers denoiser through peft: an adapter's defaults (rank, alpha, target modules, declared on the
adapter class as `lora_defaults`), the peft config of a run's [policy] settings over them, and the denoiser with
its adapter switched off (the KL reference)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from .base import PolicyConfig


@dataclass(frozen=True)
class LoraDefaults:
    rank: int
    alpha: float
    targets: tuple[str, ...] | str  # module names (peft matches their suffixes) or one regex of full names


def lora_config(defaults: LoraDefaults, opts: PolicyConfig) -> Any:
    """peft's LoraConfig: policy.lora_rank, lora_alpha and lora_targets where set, else the adapter's defaults;
    Gaussian init (B = 0, so the policy starts as the model)."""
    from peft import LoraConfig

    d, o = defaults, opts
    alpha = float(o.lora_alpha or d.alpha)
    return LoraConfig(
        r=int(o.lora_rank or d.rank),
        # peft annotates lora_alpha as int but scales by lora_alpha / r: a float alpha is honoured
        lora_alpha=int(alpha) if alpha.is_integer() else alpha,  # type: ignore[arg-type]
        init_lora_weights="gaussian",
        target_modules=list(o.lora_targets) if o.lora_targets else _names(d.targets),
    )


def _names(targets: tuple[str, ...] | str) -> list[str] | str:
    return targets if isinstance(targets, str) else list(targets)


def config_targets(config: Any) -> tuple[str, ...] | str:
    """A peft LoraConfig's target_modules as the FLOP formulas take them: a regex string or a tuple of names."""
    t = config.target_modules
    return t if isinstance(t, str) else tuple(t)


class _WithAdapters(Protocol):
    """A diffusers model with peft's adapter mixin."""

    def disable_adapters(self) -> None: ...

    def enable_adapters(self) -> None: ...


@contextmanager
def adapters_disabled(net: _WithAdapters) -> Iterator[None]:
    """The denoiser without its LoRA adapter for the duration (peft layers bypassed, nothing copied)."""
    net.disable_adapters()
    try:
        yield
    finally:
        net.enable_adapters()

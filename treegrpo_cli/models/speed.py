"""How fast a diffusers denoiser runs, apart from what it computes: its attention kernel, torch.compile and
selective activation checkpointing.

All three are `[policy]` options, off by default until a GPU measurement shows that they pay
(bench/flux_iteration.py --set, bench/gpu_check.sh --variants):

- policy.attention: the diffusers attention backend of every attention layer ("default" leaves the model's own,
  torch's SDPA). "_native_flash" and "_native_cudnn" are torch's own kernels; "flash" and "_flash_3" need the
  flash-attn packages (FlashAttention-2 and -3), "sage" sageattention, "xformers" xformers.
- policy.compile = "blocks": torch.compile on each repeated transformer block (the model's `_repeated_blocks`,
  else the blocks of its `transformer_blocks` lists), not on the whole denoiser. A tree's forwards change batch
  size from step to step; one compiled block with automatic dynamic shapes recompiles once for the second size
  and then serves every batch, where a whole-model graph would be retraced around every LoRA and checkpoint
  boundary. Compilation happens on the first forward (a minute or more at release sizes).
- policy.checkpoint_blocks: with gradient checkpointing, the share of those blocks whose activations are
  recomputed (1: all of them, diffusers' own; 0.5: every second block keeps its activations).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import ConfigError

ATTENTION_DEFAULT = "default"


def attention_backends() -> tuple[str, ...]:
    """The backend names this diffusers knows, "default" first."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return (ATTENTION_DEFAULT, *(b.value for b in AttentionBackendName))


def set_attention(net: Any, backend: str) -> None:
    """Every attention layer of `net` on `backend`; one line when diffusers refuses (unknown, or its package or
    GPU is missing)."""
    if backend == ATTENTION_DEFAULT:
        return
    if not hasattr(net, "set_attention_backend"):
        raise ConfigError(f"policy.attention = {backend!r}: this model's denoiser has no attention backends to set")
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry as registry

    before = registry.get_active_backend()[0]
    try:
        net.set_attention_backend(backend)
    except (RuntimeError, ValueError, ImportError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"policy.attention = {backend!r} cannot run here: {first}") from None
    finally:  # diffusers also makes it every model's default, process-wide: this model's processors keep it
        registry.set_active_backend(before)


def repeated_blocks(net: nn.Module) -> list[nn.Module]:
    """The denoiser's repeated blocks: instances of its `_repeated_blocks` classes, or else the members of its
    ModuleLists named *transformer_blocks (SD3 declares none)."""
    names = set(getattr(net, "_repeated_blocks", None) or ())
    found = [m for m in net.modules() if type(m).__name__ in names]
    if found:
        return found
    return [
        block
        for name, module in net.named_modules()
        if name.rsplit(".", 1)[-1].endswith("transformer_blocks") and isinstance(module, nn.ModuleList)
        for block in module
    ]


def compile_blocks(net: nn.Module) -> int:
    """torch.compile each repeated block in place (nn.Module.compile); the number compiled."""
    blocks = repeated_blocks(net)
    if not blocks:
        raise ConfigError(f'policy.compile = "blocks": found no repeated blocks in {type(net).__name__}')
    for block in blocks:
        block.compile()
    return len(blocks)


def checkpoint_share(net: nn.Module, share: float) -> list[int]:
    """Selective activation checkpointing: recompute in the backward the activations of `share` of the repeated
    blocks, spread evenly (block i when floor((i + 1) share) > floor(i share)), and keep the others' (memory for
    speed: with every block recomputed an update runs about three forwards' work for two). Returns the indices."""
    import torch.utils.checkpoint

    blocks = repeated_blocks(net)
    chosen = [i for i in range(len(blocks)) if int((i + 1) * share + 1e-9) > int(i * share + 1e-9)]
    for i in chosen:
        block, forward = blocks[i], blocks[i].forward

        def recomputed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
    return chosen

"""Memory per process of training each released model, from arithmetic: weights and optimizer state only.

    python bench/model_memory.py        # writes bench/results/model_memory.json and model_memory.md

Each denoiser is built from its release's config with its parameters on the meta device (bench/model_specs.py;
nothing is allocated or downloaded) to count its parameters P and, with the adapter's default LoRA rank r and
targets, the adapter's parameters A = sum of r x (in + out) over the targeted linear layers. Bytes (GB = 1e9):

    LoRA:  2P (frozen bf16 weights) + 16A (fp32 adapters, their gradients, Adam's two moments) + 4A (EMA)
    full:  16P (fp32 master weights, gradients, Adam) + 4P (EMA, when the preset keeps one)
           + 2P (the bf16 KL reference, when train.kl_beta > 0)
    full, FSDP over 8 processes: 20P / 8 + 2P (the KL reference stays whole on every process)

plus the text encoders in bf16 (2 bytes a parameter, their model cards' sizes) until `policy.free_text_encoders`
drops them after the prompts are embedded. Activations come on top: they grow with the resolution and
rollout.max_batch, and gradient checkpointing (the adapters' default) cuts them; bench/flux_iteration.py
measures the peak on a GPU.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_specs import MODELS, Spec  # noqa: E402  (bench/ is not a package)

OUT = Path(__file__).parent / "results"


def lora_defaults(spec: Spec):
    from treegrpo_cli.models.registry import adapter_class

    return adapter_class(spec.adapter).lora_defaults


def counts(spec: Spec) -> dict[str, float]:
    """Parameters of the denoiser and of its default LoRA adapter, in billions."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    with init_empty_weights():
        net = getattr(diffusers, spec.transformer)(**spec.config)
    lora = lora_defaults(spec)

    def targeted(name: str) -> bool:
        if isinstance(lora.targets, str):
            return re.fullmatch(lora.targets, name) is not None
        return any(name == t or name.endswith("." + t) for t in lora.targets)

    linears = [(n, m) for n, m in net.named_modules() if isinstance(m, torch.nn.Linear)]
    adapter = sum(lora.rank * (m.in_features + m.out_features) for n, m in linears if targeted(n))
    return {
        "params_b": sum(p.numel() for p in net.parameters()) / 1e9,
        "lora_rank": lora.rank,
        "lora_params_b": adapter / 1e9,
        "text_encoders_b": sum(spec.text_encoders.values()),
    }


def memory(c: dict[str, float]) -> dict[str, float]:
    P, A, T = c["params_b"], c["lora_params_b"], c["text_encoders_b"]
    return {
        "lora_gb": 2 * P + 20 * A,
        "full_gb": 16 * P,
        "full_ema_ref_gb": 22 * P,
        "fsdp8_gb": 20 * P / 8,
        "fsdp8_ref_gb": 20 * P / 8 + 2 * P,
        "text_encoders_gb": 2 * T,
    }


def _gb(x: float) -> str:
    return f"{x:.0f}" if x >= 1 else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    head = (
        "| `--model` | hub id | denoiser | guidance | compute dtype | LoRA (rank) | text encoders | LoRA | full "
        "| full, FSDP x 8 |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| `{r['model']}` | {r['hub_id']} | {r['params_b']:.1f}B | {r['guidance']} | bf16, fp32 sampler "
        f"| {1e3 * r['lora_params_b']:.0f}M ({r['lora_rank']}) | {_gb(r['text_encoders_gb'])} GB "
        f"| {_gb(r['lora_gb'])} GB "
        f"| {r['full_gb']:.0f}-{r['full_ema_ref_gb']:.0f} GB | {r['fsdp8_gb']:.0f}-{r['fsdp8_ref_gb']:.0f} GB |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> int:
    from treegrpo_cli.models.diffusers_base import quiet_diffusers

    quiet_diffusers()  # the torchvision guard before transformers and peft import it (compat.py)
    rows = []
    for name, spec in MODELS.items():
        c = counts(spec)
        rows.append({"model": name, "hub_id": spec.hub_id, "guidance": spec.guidance, **c, **memory(c)})
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "model_memory.json").write_text(
        json.dumps({"command": "python bench/model_memory.py", "models": rows}, indent=1) + "\n"
    )
    (OUT / "model_memory.md").write_text(table(rows))
    print(table(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

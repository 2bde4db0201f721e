"""Memory per process of training each released model, from arithmetic: weights and optimizer state only; and the
two tables of docs/models.md (the adapters, the releases' memory), generated from what each adapter file declares.

    python bench/model_memory.py           # counts every release's parameters: writes bench/results/model_memory.json
                                           # and model_memory.md, and both tables of docs/models.md
    python bench/model_memory.py --docs    # docs/models.md's tables only, from model_memory.json's counts; a release
                                           # it has none of (a new model) is counted from its configs
    python bench/model_memory.py --check   # exit 1 when docs/models.md's tables are not what --docs writes

Each denoiser is built from its release's configs (its adapter file's RELEASES, models/releases.py) with its
parameters on the meta device (nothing is allocated or downloaded) to count its parameters P and, with the
adapter's default LoRA rank r and targets, the adapter's parameters A = sum of r x (in + out) over the targeted
linear layers. Bytes (GB = 1e9):

    LoRA:  2P (frozen bf16 weights) + 16A (fp32 adapters, their gradients, Adam's two moments) + 4A (EMA)
    full:  16P (fp32 master weights, gradients, Adam) + 4P (EMA, when the preset keeps one)
           + 2P (the bf16 KL reference, when train.kl_beta > 0)
    full, FSDP over 8 processes: 20P / 8 + 2P (the KL reference stays whole on every process)

plus the text encoders in bf16 (2 bytes a parameter, their model cards' sizes, the release's spec) until
`policy.free_text_encoders` drops them after the prompts are embedded. Activations come on top: they grow with the
resolution and rollout.max_batch, and gradient checkpointing (the adapters' default) cuts them;
bench/flux_iteration.py measures the peak on a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_specs import MODELS, Spec  # noqa: E402  (bench/ is not a package)

OUT = Path(__file__).parent / "results"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "models.md"
COMMAND = "python bench/model_memory.py"


def lora_defaults(spec: Spec) -> Any:
    from treegrpo_cli.models.registry import adapter_class

    return adapter_class(spec.adapter).lora_defaults


def counts(spec: Spec) -> dict[str, float]:
    """Parameters of the denoiser and of its default LoRA adapter, in billions (a meta-device build)."""
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


def row(name: str, spec: Spec, c: dict[str, float]) -> dict[str, Any]:
    return {"model": name, "hub_id": spec.hub_id, "guidance": spec.guidance, **c, **memory(c)}


def rows(measured: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """A row per release, in the cards' order: with `measured` (model_memory.json's rows by name) a release's
    parameter counts are the recorded ones where its LoRA rank is still the adapter's, else counted from its
    configs; the memory is arithmetic on them, its labels and text encoders from its spec."""
    out = []
    for name, spec in MODELS.items():
        known = (measured or {}).get(name)
        if known is not None and known.get("lora_rank") == lora_defaults(spec).rank:
            c = {k: known[k] for k in ("params_b", "lora_rank", "lora_params_b")}
            c["text_encoders_b"] = sum(spec.text_encoders.values())
        else:
            c = counts(spec)
        out.append(row(name, spec, c))
    return out


def recorded() -> dict[str, dict]:
    path = OUT / "model_memory.json"
    return {r["model"]: r for r in json.loads(path.read_text())["models"]} if path.is_file() else {}


def _gb(x: float) -> str:
    return f"{x:.0f}" if x >= 1 else f"{x:.1f}"


def table(rows: list[dict]) -> str:
    """The memory table: a row per release."""
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


def adapters_table() -> str:
    """The adapters' table: a row per adapter card, from the card, its class and its releases' specs."""
    from treegrpo_cli.models import catalog

    head = (
        "| family | `--model` | pipeline | adapter | denoiser | sampling | default resolution |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name, entry in catalog.entries().items():
        card, cls = entry.card, catalog.adapter_class(name)
        denoisers = dict.fromkeys(MODELS[r].transformer for r in card.releases if r in MODELS)
        resolution = f"{cls.default_resolution}" + "".join(
            f", `{r}` {v['policy.resolution']}" for r, v in card.release_defaults.items() if "policy.resolution" in v
        )
        lines.append(
            f"| {card.family} | {', '.join(f'`{r}`' for r in card.releases)} "
            f"| {', '.join(f'`{p}`' for p in card.pipelines)} | `models/{entry.module}.py` `{entry.cls}` "
            f"| {', '.join(denoisers) or '-'}, predicting the {card.predicts} | {card.sampling or '-'} | {resolution} |"
        )
    return head + "\n".join(lines) + "\n"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}: generated by `{COMMAND} --docs` -->\n", f"<!-- end of the {name} -->"


def splice(text: str, name: str, block: str) -> str:
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise SystemExit(f"{DOCS.name} has no {begin.strip()} ... {end} markers")
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + block + text[stop:]


def page(text: str, memory_rows: list[dict]) -> str:
    """docs/models.md's text with both generated tables in place."""
    return splice(splice(text, "adapters table", adapters_table()), "memory table", table(memory_rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", action="store_true", help="write docs/models.md's tables only, from the recorded counts")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/models.md's tables are not current")
    args = ap.parse_args()
    from treegrpo_cli.models.diffusers_base import quiet_diffusers

    quiet_diffusers()  # the torchvision guard before transformers and peft import it (compat.py)
    text = DOCS.read_text()
    if args.docs or args.check:
        new = page(text, rows(recorded()))
        if args.check:
            return 0 if new == text else 1
        DOCS.write_text(new)
        return 0
    measured = rows()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "model_memory.json").write_text(json.dumps({"command": COMMAND, "models": measured}, indent=1) + "\n")
    (OUT / "model_memory.md").write_text(table(measured))
    DOCS.write_text(page(text, measured))
    print(table(measured), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seconds per GRPO iteration (rollout and training) and peak GPU memory with a FLUX.1-dev-sized model.

    python bench/flux_iteration.py [--presets dance-grpo,branch,branch-mix,tree-grpo] [--modes lora,full]
        [--resolution 720] [--prompts 1] [--max-batch 8] [--iterations 2] [--no-gradient-checkpointing]
        [--out bench/results/flux_iteration.json]
    python bench/flux_iteration.py --tiny [...]     # the same code path on the CPU, tiny sizes

The model is a FluxTransformer2DModel with FLUX.1-dev's architecture (19 double and 38 single blocks,
24 heads of 128, T5 width 4096, pooled 768, the guidance embedding; 11.9 B parameters) and random bf16
weights: built on the meta device, then materialised on the GPU and filled from a seeded normal
(no download). Prompt embeddings are random tensors of the real shapes (T5 [512, 4096], CLIP pooled
[768]) put into the policy's prompt cache, so no text encoder is loaded. The VAE and the reward are
left out: images are never decoded and random leaf rewards drive the advantages, which changes
nothing in what the GPU does per node. Each case is one preset x one fine-tuning mode (LoRA with the
FLUX defaults r 64 / alpha 128, or full fine-tuning with AdamW on every weight); each iteration runs
the library's rollout (engine/rollout.py) and GRPO update (engine/grpo.py) and records seconds and
torch.cuda.max_memory_allocated per phase. A case that runs out of memory is recorded as such.
The last iteration is the steady-state number (the first includes CUDA warm-up).

Model FLOP utilisation (MFU) of each phase: model FLOPs / (seconds x the GPU's dense bf16 peak,
--peak-tflops, by default from the device name: H100 and H200 989, A100 312). Model FLOPs of one
forward (forward_flops): 2 x (weight-matrix entries) x (tokens that pass through them) -- image
tokens for the image stream of the double blocks, text tokens for the text stream, all tokens in the
single blocks, one per sample for the adaLN and embedding MLPs -- plus 4 x tokens^2 x width for each
block's joint attention; checked against torch's FlopCounterMode in the tests. A rollout is
rollout_evals forwards; training counts 3 forwards per trained parent (forward and backward; the
recomputation of gradient checkpointing is not model FLOPs).

On a machine without CUDA it refuses (exit 2) unless --tiny is given.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.credit import assign_credit
from treegrpo_cli.engine.grpo import Batch, grpo_update, make_optimizer
from treegrpo_cli.engine.rollout import mix_seed, rollout
from treegrpo_cli.engine.schedules import tree_for_iteration
from treegrpo_cli.engine.sde import make_kernel
from treegrpo_cli.models.base import PolicyConfig
from treegrpo_cli.models.diffusers_base import quiet_diffusers

PRESETS = ("dance-grpo", "branch", "branch-mix", "tree-grpo")
FLUX_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
TINY = dict(
    FLUX_DEV,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=(4, 4, 8),
)
VAE_SCALE = 8  # FLUX's VAE: 720 px -> 90 x 90 latents -> 45 x 45 = 2025 packed tokens
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}  # dense bf16


def forward_flops(net: torch.nn.Module, image_tokens: int, text_tokens: int) -> float:
    """Model FLOPs of one FluxTransformer2DModel forward of one sample (see the module docstring)."""
    tokens = image_tokens + text_tokens
    total = 0.0
    for name, p in net.named_parameters():
        if p.dim() != 2:
            continue
        if "norm" in name or name.startswith("time_text_embed"):
            n = 1  # adaLN / embedding MLPs: per sample
        elif name.startswith("transformer_blocks."):
            n = text_tokens if ("context" in name or ".add_" in name or "to_add_out" in name) else image_tokens
        elif name.startswith("single_transformer_blocks."):
            n = tokens
        elif name.startswith("context_embedder"):
            n = text_tokens
        else:  # x_embedder, proj_out
            n = image_tokens
        total += 2.0 * p.numel() * n
    width = net.config.num_attention_heads * net.config.attention_head_dim
    blocks = net.config.num_layers + net.config.num_single_layers
    return total + 4.0 * blocks * tokens * tokens * width


def peak_flops(args: argparse.Namespace, device: torch.device) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)
    return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--modes", default="lora,full", help="lora, full or both")
    ap.add_argument("--resolution", type=int, default=None, help="pixels (default 720; --tiny 32)")
    ap.add_argument("--prompts", type=int, default=1, help="prompts per iteration")
    ap.add_argument("--max-batch", type=int, default=8, help="rows per forward (rollout.max_batch)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--text-len", type=int, default=None, help="T5 tokens (default 512; --tiny 8)")
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="tiny transformer on the CPU: a smoke test of this script")
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by GPU name)")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON results (default bench/results/flux_iteration[_tiny].json)"
    )
    args = ap.parse_args(argv)
    args.resolution = args.resolution or (32 if args.tiny else 720)
    args.text_len = args.text_len or (8 if args.tiny else 512)
    name = "flux_iteration_tiny.json" if args.tiny else "flux_iteration.json"
    args.out = args.out or Path(__file__).parent / "results" / name
    return args


def build_transformer(cfg: dict, device: torch.device, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """A FluxTransformer2DModel of the given sizes: meta device, then real random weights on `device`."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        net = FluxTransformer2DModel(**cfg)
    net = net.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    return net.eval()


def make_policy(args: argparse.Namespace, mode: str, device: torch.device, dtype: torch.dtype):
    from treegrpo_cli.models.flux import FluxPolicy

    cfg = TINY if args.tiny else FLUX_DEV
    pipe = SimpleNamespace(
        transformer=build_transformer(cfg, device, dtype),
        vae=None,
        text_encoder=None,
        text_encoder_2=None,
        vae_scale_factor=VAE_SCALE,
    )
    opts = PolicyConfig(
        finetune=mode,
        dtype="bf16" if dtype == torch.bfloat16 else "fp32",
        resolution=args.resolution,
        gradient_checkpointing=not args.no_gradient_checkpointing,
        max_sequence_length=args.text_len,
    )
    policy = FluxPolicy(pipe, opts, name="flux-dev-random", source="random weights", device=device)
    gen = torch.Generator().manual_seed(1)
    for k in range(args.prompts):  # random embeddings of the real shapes stand in for CLIP + T5
        policy.put_cached(
            f"prompt {k}",
            {
                "prompt_embeds": torch.randn(1, args.text_len, cfg["joint_attention_dim"], generator=gen).to(dtype),
                "pooled": torch.randn(1, cfg["pooled_projection_dim"], generator=gen).to(dtype),
            },
        )
    return policy


class Clock:
    """Wall time and peak allocated GPU memory of one phase."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __enter__(self) -> Clock:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.seconds = time.perf_counter() - self.t0
        self.peak_gib = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None


def iteration(policy, kernel, opt, cfg, it: int, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One rollout + GRPO update of the preset, random leaf rewards; seconds and peak memory of each."""
    prompts, ids, T = [f"prompt {k}" for k in range(args.prompts)], list(range(args.prompts)), cfg.sampler.steps
    tree_cfg = tree_for_iteration(cfg.tree, cfg.schedule, T, it, cfg.seed, cfg.sampler.decode)
    with Clock(device) as roll:
        tree, nfe = rollout(policy, prompts, ids, kernel, tree_cfg, mix_seed(cfg.seed, it), args.max_batch)
    leaves = tree.leaves()
    reward = torch.full((tree.num_nodes,), float("nan"))
    reward[leaves] = torch.rand(len(leaves), generator=torch.Generator().manual_seed(it))
    adv, trained = assign_credit(
        tree.parent,
        tree.depth,
        tree.tree,
        tree.group(),
        tree.sde,
        tree.log_prob,
        {"random": reward},
        {"random": 1.0},
        "rewards",
        cfg.advantage,
        cfg.pruning,
        T,
        cfg.sampler.decode,
        it,
        cfg.train.iterations,
    )
    batch = Batch(tree, trained, adv.edge, policy.encode([prompts[int(p)] for p in tree.tree_prompt]))
    with Clock(device) as upd:
        metrics = grpo_update(policy, opt, kernel, batch, cfg.train, torch.Generator().manual_seed(it), args.max_batch)
    flops = forward_flops(policy.denoiser, _image_tokens(policy), args.text_len)
    rollout_flops, train_flops = nfe * flops, 3 * metrics.get("train_evals", 0) * flops
    peak = peak_flops(args, device)

    def mfu(f: float, sec: float) -> float | None:
        return f / (sec * peak) if peak else None

    return {
        "iteration": it,
        "rollout_s": roll.seconds,
        "train_s": upd.seconds,
        "total_s": roll.seconds + upd.seconds,
        "rollout_peak_gib": roll.peak_gib,
        "train_peak_gib": upd.peak_gib,
        "leaves": int(len(leaves)),
        "rollout_evals": nfe,
        "trained_edges": int(trained.sum()),
        "train_evals": metrics.get("train_evals", 0),
        "ratio_first_dev": metrics.get("ratio_first_dev"),
        "forward_gflops": flops / 1e9,
        "rollout_tflops": rollout_flops / 1e12,
        "train_tflops": train_flops / 1e12,
        "rollout_mfu": mfu(rollout_flops, roll.seconds),
        "train_mfu": mfu(train_flops, upd.seconds),
    }


def _image_tokens(policy) -> int:
    c, h, w = policy.latent_shape  # FLUX packs 2x2 latent patches into one token
    return (h // 2) * (w // 2)


def run_case(preset: str, mode: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    cfg = load_config(preset, sets=[f"rollout.max_batch={args.max_batch}"])
    case: dict[str, Any] = {
        "preset": preset,
        "mode": mode,
        "steps": cfg.sampler.steps,
        "leaves_per_tree": cfg.tree.leaves(cfg.sampler.steps),
        "iterations": [],
    }
    policy = None
    try:
        policy = make_policy(args, mode, device, dtype)
        params = policy.trainable_parameters()
        case["trainable_params"] = sum(p.numel() for p in params)
        case["total_params"] = sum(p.numel() for p in policy.denoiser.parameters())
        kernel, opt = make_kernel(policy, cfg.sampler), make_optimizer(params, cfg.train)
        for it in range(args.iterations):
            case["iterations"].append(iteration(policy, kernel, opt, cfg, it, args, device))
    except torch.OutOfMemoryError as e:
        case["error"] = f"out of memory: {str(e).splitlines()[0]}"
        case["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    finally:
        del policy
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return case


def print_table(results: list[dict]) -> None:
    print(
        f"{'preset':<11} {'mode':<5} {'leaves':>6} {'evals':>6} {'edges':>6} {'rollout s':>10} {'train s':>9} "
        f"{'rollout GiB':>12} {'train GiB':>10} {'rollout MFU':>12} {'train MFU':>10}"
    )
    for c in results:
        if "error" in c:
            print(f"{c['preset']:<11} {c['mode']:<5} {c['error']}")
            continue
        r = c["iterations"][-1]

        def gib(v: float | None) -> str:
            return f"{v:.1f}" if v is not None else "-"

        def pct(v: float | None) -> str:
            return f"{100 * v:.1f}%" if v is not None else "-"

        print(
            f"{c['preset']:<11} {c['mode']:<5} {r['leaves']:>6} {r['rollout_evals']:>6} {r['trained_edges']:>6} "
            f"{r['rollout_s']:>10.2f} {r['train_s']:>9.2f} "
            f"{gib(r['rollout_peak_gib']):>12} {gib(r['train_peak_gib']):>10} "
            f"{pct(r['rollout_mfu']):>12} {pct(r['train_mfu']):>10}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not args.tiny and not torch.cuda.is_available():
        print(
            "flux_iteration.py needs a CUDA GPU for a FLUX.1-dev-sized model and found none; "
            "--tiny runs the same code on the CPU at tiny sizes",
            file=sys.stderr,
        )
        return 2
    quiet_diffusers()
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    results = [run_case(p, m, args, device, dtype) for p in args.presets.split(",") for m in args.modes.split(",")]
    out = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "tiny": args.tiny,
        "transformer": TINY if args.tiny else FLUX_DEV,
        "resolution": args.resolution,
        "prompts": args.prompts,
        "text_len": args.text_len,
        "max_batch": args.max_batch,
        "dtype": str(dtype).removeprefix("torch."),
        "gradient_checkpointing": not args.no_gradient_checkpointing,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print_table(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

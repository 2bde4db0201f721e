"""Seconds per GRPO iteration (rollout and training), peak GPU memory and MFU with a released model's denoiser.

    python bench/flux_iteration.py [--model flux-dev] [--presets dance-grpo,branch,...,branch-mix-flow]
        [--modes lora,full] [--resolution PX] [--prompts 1] [--max-batch 8] [--iterations 2]
        [--no-gradient-checkpointing] [--out bench/results/flux_iteration[-MODEL].json]
    python bench/flux_iteration.py --tiny [...]     # the same code path on the CPU, tiny sizes

--model is a release an adapter lists in its RELEASES (treegrpo_cli/models/): flux-dev (FLUX.1-dev, 11.9B; the
default), flux-schnell,
sd3.5-medium, sd3.5-large, qwen-image (20B), flux2-dev (32B), flux2-klein-4b, -9b, flux2-klein-base-4b, -9b,
sd1.5, wan2.1-t2v-1.3b, wan2.1-t2v-14b (videos of policy.frames, 33). The policy is what
`--set policy.weights="random"` builds (models/releases.py): the release's architecture from its configs with
random bf16 weights, built on the meta device and filled on the GPU from a seeded normal (no download), and
random prompt embeddings of the text encoders' real shapes, so no text encoder is loaded. Leaves are decoded
and scored by a stub reward of random scores (its own time is nil; the decode is in the score phase).
Each case is one preset x one
fine-tuning mode (LoRA with the adapter's defaults, or full fine-tuning with AdamW on every weight); each
iteration is the training path itself, `Trainer.iteration` (training/trainer.py: rollout, decode and score with a
stub reward of random scores, credit, the preset's update), and records its phases' seconds from the metrics row
and torch.cuda.max_memory_allocated over the iteration. A case that runs out of
memory is recorded as such. The last iteration is the steady-state number (the first includes CUDA warm-up).

Model FLOP utilisation (MFU) of each phase: model FLOPs / (seconds x the GPU's dense bf16 peak,
--peak-tflops, by default from the device name: H100 and H200 989, A100 312). Model FLOPs are the
adapter's flops_per_row() (its formula, built on models/flops.py: derived from the config, equal to torch's
FlopCounterMode in the tests): a rollout is its network-row evaluations times one row's forward; training
is its evaluations times one row's forward and backward, without the recomputation of gradient
checkpointing (not model FLOPs).

On a machine without CUDA it refuses (exit 2) unless --tiny is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_specs import MODELS, TRANSFORMERS  # noqa: E402  (bench/ is not a package)

from treegrpo_cli.config import Config, load_config, parse_set
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.models.base import PolicyConfig
from treegrpo_cli.models.diffusers_base import quiet_diffusers
from treegrpo_cli.rewards.base import register
from treegrpo_cli.store.shards import atomic_write
from treegrpo_cli.training.trainer import Trainer

PRESETS = ("dance-grpo", "branch", "branch-mix", "tree-grpo", "tree-grpo-mean", "branch-mix-flow")
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "A10G": 70.0}  # dense bf16


STUB = "bench-random"  # the stub reward (StubReward), registered in this process only


def peak_flops(args: argparse.Namespace, device: torch.device) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)
    return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="flux-dev", choices=TRANSFORMERS, help="the denoiser (bench/model_specs.py)")
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--modes", default="lora,full", help="lora, full or both")
    ap.add_argument("--resolution", type=int, default=None, help="pixels (default: the model's; --tiny 32)")
    ap.add_argument("--prompts", type=int, default=1, help="prompts per iteration")
    ap.add_argument("--max-batch", type=int, default=8, help="rows per forward (rollout.max_batch)")
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="policy.KEY=VALUE",
        help="a [policy] option for every case, e.g. policy.compile=blocks or policy.attention=_native_cudnn",
    )
    ap.add_argument("--tiny", action="store_true", help="tiny transformer on the CPU: a smoke test of this script")
    ap.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak for MFU (default: by GPU name)")
    ap.add_argument(
        "--out", type=Path, default=None, help="JSON results (default bench/results/flux_iteration[_tiny].json)"
    )
    args = ap.parse_args(argv)
    policy_sets(args.sets)  # a bad --set stops here, before any model is built
    args.resolution = args.resolution or (32 if args.tiny else MODELS[args.model].resolution)
    suffix = "" if args.model == "flux-dev" else f"-{args.model}"
    name = f"flux_iteration{suffix}_tiny.json" if args.tiny else f"flux_iteration{suffix}.json"
    args.out = args.out or Path(__file__).parent / "results" / name
    return args


def case_config(preset: str, mode: str, args: argparse.Namespace, dtype: torch.dtype) -> Config:
    """The preset on the release with random weights, as `--set policy.weights="random"` builds it
    (models/releases.py), its leaves scored by the stub reward, args.prompts prompts an iteration."""
    sets = [f'model="{args.model}"', 'policy.weights="random"', f'policy.size="{"tiny" if args.tiny else "full"}"']
    sets += [f'policy.finetune="{mode}"', f'policy.dtype="{"bf16" if dtype == torch.bfloat16 else "fp32"}"']
    sets += [f"policy.gradient_checkpointing={str(not args.no_gradient_checkpointing).lower()}"]
    sets += [f"policy.resolution={args.resolution}"] if args.resolution else []
    sets += [f"rollout.max_batch={args.max_batch}", f"rollout.num_prompts={args.prompts}"]
    sets += [f'reward.names=["{STUB}"]', "reward.weights=[1.0]", "train.eval_samples=0", "train.sample_every=0"]
    policy_sets(args.sets)  # checked: policy.KEY=VALUE items only
    return load_config(preset, sets=sets + list(args.sets))


def policy_sets(sets: list[str]) -> dict[str, Any]:
    """--set policy.KEY=VALUE as PolicyConfig fields, each value read as `treegrpo --set` reads it (parse_set)."""
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    out: dict[str, Any] = {}
    for item in sets:
        try:
            key, value = parse_set(item)
        except ConfigError as e:
            raise SystemExit(str(e)) from None
        if not key.startswith("policy.") or key.removeprefix("policy.") not in fields:
            raise SystemExit(f"--set {item!r}: expected policy.KEY=VALUE with KEY one of {', '.join(sorted(fields))}")
        out[key.removeprefix("policy.")] = value
    return out


def model_flops(policy) -> tuple[int, int]:
    """(forward, backward) FLOPs of one network row, the backward without checkpointing's recomputation."""
    opts = policy.opts
    policy.opts = dataclasses.replace(opts, gradient_checkpointing=False)
    try:
        return policy.flops_per_row()
    finally:
        policy.opts = opts


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


def iteration(trainer: Trainer, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """One iteration of the training path (Trainer.iteration: rollout, decode and score, credit, update) of the
    preset; seconds of each phase from its metrics row, peak memory over the iteration."""
    prompts = [f"prompt {k}" for k in range(args.prompts)]
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    row = trainer.iteration(prompts, lambda *a: None)
    sec = row["seconds"]
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    fwd, bwd = model_flops(trainer.policy)  # nfe and train_evals count network rows (2 per latent row under CFG)
    nfe, train_evals = row["rollout_evals"], row.get("train_evals", 0)
    rollout_flops, train_flops = nfe * fwd, train_evals * (fwd + bwd)
    peak = peak_flops(args, device)

    def mfu(f: float, s: float) -> float | None:
        return f / (s * peak) if peak else None

    return {
        "iteration": row["iteration"],
        "rollout_s": sec["rollout"],
        "score_s": sec["score"],
        "train_s": sec["update"],
        "total_s": sec["total"],
        "rollout_peak_gib": peak_gib,  # the iteration's peak: rollout and update share it
        "train_peak_gib": peak_gib,
        "leaves": row["leaves"],
        "rollout_evals": nfe,
        "trained_edges": row["trained_edges"],
        "train_evals": train_evals,
        "ratio_first_dev": row.get("ratio_first_dev"),
        "forward_gflops": fwd / 1e9,
        "backward_gflops": bwd / 1e9,
        "rollout_tflops": rollout_flops / 1e12,
        "train_tflops": train_flops / 1e12,
        "rollout_mfu": mfu(rollout_flops, sec["rollout"]),
        "train_mfu": mfu(train_flops, sec["update"]),
    }


class StubReward:
    """Random leaf rewards (seeded by the batch's size and first pixel): a reward that costs nothing, so the
    timings are the model's."""

    name = "bench-random"

    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        g = torch.Generator().manual_seed(len(prompts) * 7919 + int(images.flatten()[0].item() * 1e6))
        return torch.rand(len(prompts), generator=g)


def run_case(preset: str, mode: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    cfg = case_config(preset, mode, args, dtype)
    case: dict[str, Any] = {
        "preset": preset,
        "mode": mode,
        "steps": cfg.sampler.steps,
        "leaves_per_tree": cfg.tree.leaves(cfg.sampler.steps),
        "iterations": [],
    }
    trainer = None
    try:
        trainer = Trainer(cfg, str(device))
        params = trainer.policy.trainable_parameters()
        case["trainable_params"] = sum(p.numel() for p in params)
        case["total_params"] = sum(p.numel() for p in getattr(trainer.policy, "denoiser").parameters())  # noqa: B009
        for _ in range(args.iterations):
            case["iterations"].append(iteration(trainer, args, device))
    except torch.OutOfMemoryError as e:
        case["error"] = f"out of memory: {str(e).splitlines()[0]}"
        case["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    except Exception as e:  # noqa: BLE001  (one broken case is recorded; the others still run)
        case["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        traceback.print_exc()
    finally:
        del trainer
        gc.collect()
        # out of memory leaves CUDA usable (freeing the cache lets the next case run); after another error, such
        # as an illegal address, every call into CUDA raises again
        if device.type == "cuda" and case.get("error", "out of memory").startswith("out of memory"):
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
    register(STUB, StubReward, summary="random leaf rewards (bench/flux_iteration.py)")
    args = parse(argv)
    if not args.tiny and not torch.cuda.is_available():
        print(
            f"flux_iteration.py needs a CUDA GPU for a {args.model}-sized model and found none; "
            "--tiny runs the same code on the CPU at tiny sizes",
            file=sys.stderr,
        )
        return 2
    quiet_diffusers()
    device = torch.device("cpu" if args.tiny else "cuda")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    out: dict[str, Any] = {
        "command": " ".join(["python bench/flux_iteration.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "tiny": args.tiny,
        "model": args.model,
        "hub_id": MODELS[args.model].hub_id,
        "transformer": MODELS[args.model].tiny if args.tiny else MODELS[args.model].config,
        "resolution": args.resolution,
        "prompts": args.prompts,
        "max_batch": args.max_batch,
        "dtype": str(dtype).removeprefix("torch."),
        "gradient_checkpointing": not args.no_gradient_checkpointing,
        "policy_sets": policy_sets(args.sets),
        "results": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for p in args.presets.split(","):
        for m in args.modes.split(","):
            out["results"].append(run_case(p, m, args, device, dtype))
            if device.type == "cuda":  # the attention backends the adapter left on (cuDNN's is off by default)
                out["sdp_backends"] = {
                    "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                    "flash": torch.backends.cuda.flash_sdp_enabled(),
                    "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                }
            # after every case: a run cut off at its time limit keeps what finished
            atomic_write(args.out, (json.dumps(out, indent=1) + "\n").encode())
            print_table(out["results"][-1:])
    results = out["results"]
    print_table(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

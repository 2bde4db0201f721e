"""What the papers' speed-ups are made of: each table row's per-sample model evaluations priced in FLUX.1-dev FLOPs,
against the seconds per iteration the paper reports.

    python bench/paper_costs.py        # bench/results/paper_costs.{json,md}; seconds, no GPU

BranchGRPO's "4.7x faster than DanceGRPO" (BranchGRPO-Mix, 148 s against 698 s) and every other row of its table
(methods.md 6.6) are ratios of seconds per iteration: the cost of one iteration, not the time to a reward. Each
row gives the evaluations a sample costs: NFE pi_old (rollout forwards) and NFE pi_theta (trained transitions,
each a forward and a backward). Priced with models/flux.py's FLUX count (720 px, as BranchGRPO's launch script
and bench/flux_iteration.py run; 512 T5 tokens; full fine-tuning, as both codes train; gradient
checkpointing, whose backward runs each block's forward again), a row's FLOPs a sample over DanceGRPO's is the
speed-up the paper could see if every method kept the GPU equally busy. Where a reported ratio exceeds it, the
excess is in how busy the codes kept the GPU, not in the method's work.

The second table reads bench/results/flux_iteration*.json (our presets on one H100, FLUX.1-dev with LoRA):
measured seconds a sample against counted TFLOPs a sample, both as ratios to dance-grpo.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit  # noqa: E402  (bench/ is not a package)
from model_specs import MODELS, embed_shapes  # noqa: E402

from treegrpo_cli.models.flux import flux_flops

RESULTS = Path("bench/results")
# BranchGRPO's README table (FLUX.1-dev, HPDv2.1, 20 sampling steps; methods.md 6.6): NFE pi_old, NFE pi_theta
# (a sample's rollout and trained evaluations) and the reported seconds per iteration
BRANCHGRPO_TABLE = [
    ("DanceGRPO (tf = 1.0)", 20, 20, 698),
    ("DanceGRPO (tf = 0.6)", 20, 12, 469),
    ("MixGRPO (20,5)", 20, 5, 289),
    ("BranchGRPO", 13.68, 13.68, 493),
    ("BranchGRPO-WidPru", 13.68, 8.625, 314),
    ("BranchGRPO-DepPru", 13.68, 8.625, 314),
    ("BranchGRPO-Mix", 13.68, 4.25, 148),
]
FLUX = MODELS["flux-dev"]  # its release's config, T5 length and the references' resolution (model_specs.json)


def row_flops(resolution: int) -> tuple[int, int]:
    """(forward, backward with recompute) FLOPs of one FLUX.1-dev row at resolution px, every weight trained."""
    tokens = (resolution // 16) ** 2  # VAE /8, then 2x2 packing
    text = embed_shapes(FLUX, tiny=False)["prompt_embeds"][0]
    return flux_flops(FLUX.config, tokens, text, recompute=True)


def paper_rows(resolution: int) -> list[dict]:
    fwd, bwd = row_flops(resolution)
    rows: list[dict[str, Any]] = []
    for name, nfe_old, nfe_theta, seconds in BRANCHGRPO_TABLE:
        flops = nfe_old * fwd + nfe_theta * (fwd + bwd)  # one sample: its rollout, then its trained transitions
        rows.append({"method": name, "nfe_old": nfe_old, "nfe_theta": nfe_theta, "seconds": seconds, "flops": flops})
    base = rows[0]
    for r in rows:
        r["flop_ratio"] = base["flops"] / r["flops"]
        r["reported_ratio"] = base["seconds"] / r["seconds"]
        r["unexplained"] = r["reported_ratio"] / r["flop_ratio"]  # >1: faster than its FLOPs say
    return rows


def measured_rows() -> list[dict]:
    """Our presets on the H100 (bench/flux_iteration*.json, FLUX.1-dev LoRA): each preset's last iteration."""
    rows: dict[str, dict] = {}
    for path in sorted(RESULTS.glob("flux_iteration*.json")):
        res = json.loads(path.read_text())
        if res.get("model") != "flux-dev" or res.get("tiny"):
            continue
        for case in res["results"]:
            it = (case.get("iterations") or [None])[-1]
            if case.get("mode") != "lora" or not it or case["preset"] in rows:
                continue
            leaves = it["leaves"]
            rows[case["preset"]] = {
                "preset": case["preset"],
                "file": path.name,
                "leaves": leaves,
                "seconds_per_sample": it["total_s"] / leaves,
                "tflops_per_sample": (it["rollout_tflops"] + it["train_tflops"]) / leaves,
            }
    if "dance-grpo" not in rows:
        return []
    base = rows["dance-grpo"]
    for r in rows.values():
        r["flop_ratio"] = base["tflops_per_sample"] / r["tflops_per_sample"]
        r["measured_ratio"] = base["seconds_per_sample"] / r["seconds_per_sample"]
    return sorted(rows.values(), key=lambda r: (r["preset"] != "dance-grpo", -r["tflops_per_sample"]))


def markdown(result: dict) -> str:
    out = []
    for res in result["resolutions"]:
        out += [
            f"\nBranchGRPO's table priced in FLUX.1-dev FLOPs ({res} px, full fine-tuning, gradient checkpointing):\n",
            "| method | NFE pi_old | NFE pi_theta | PFLOPs / sample | FLOP ratio | reported s / iteration "
            "| reported ratio | reported / FLOP ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {r['method']} | {r['nfe_old']:g} | {r['nfe_theta']:g} | {r['flops'] / 1e15:.1f} | "
            f"{r['flop_ratio']:.2f}x | {r['seconds']} | {r['reported_ratio']:.2f}x | {r['unexplained']:.2f} |"
            for r in result["paper"][str(res)]
        ]
    if result["measured"]:
        out += [
            "\nOur presets on one H100 (FLUX.1-dev, LoRA, 720 px; bench/flux_iteration.py), ratios to dance-grpo:\n",
            "| preset | samples / iteration | s / sample | TFLOPs / sample | FLOP ratio | measured ratio |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| {r['preset']} | {r['leaves']} | {r['seconds_per_sample']:.2f} | {r['tflops_per_sample']:.0f} "
            f"| {r['flop_ratio']:.2f}x | {r['measured_ratio']:.2f}x |"
            for r in result["measured"]
        ]
    return "\n".join(out).lstrip("\n") + "\n"


def main() -> None:
    resolutions = (FLUX.resolution,)
    result = {
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "commit": commit(),
        "command": "python bench/paper_costs.py",
        "resolutions": list(resolutions),
        "paper": {str(res): paper_rows(res) for res in resolutions},
        "measured": measured_rows(),
    }
    (RESULTS / "paper_costs.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "paper_costs.md").write_text(markdown(result))
    sys.stdout.write(markdown(result))


if __name__ == "__main__":
    main()

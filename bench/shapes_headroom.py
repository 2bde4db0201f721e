"""How much of the held-out test reward can binding a held-out pair add? The headroom of the world.

    python bench/shapes_headroom.py [--model tiny-shapes] [--samples 4] [--out bench/results/shapes_headroom.json]

Every test prompt holds a (colour, kind) pair that pretraining never showed. Its *familiar analogues*
swap each held-out kind for the colour's other kinds ("three big red squares" -> "three big red
circles", "... red triangles"): the same form, counts, sizes and relation, with pairs the model was
pretrained on. The model's reward on the analogues is what it would score on the test prompts had it
learnt the missing bindings as well as pretraining taught the others; the difference from its reward
on the test prompts themselves is the part of the held-out gain that binding can supply. Both are
measured with the deterministic ODE sampler, the same root noises, per form (single, count, relation).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.evaluate import heldout_reward
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.rewards.base import get_reward
from treegrpo_cli.world.shapes import familiar_analogues, load_split, parse_prompt


def reward(policy, prompts: list[str], samples: int, steps: int, seeds: tuple[int, ...]) -> float:
    sde = FlowSDE(SamplerConfig(steps=steps))
    r = {"shapes": get_reward("shapes")}
    return sum(heldout_reward(policy, sde, prompts, r, {"shapes": 1.0}, samples, s)["reward_mean"]
               for s in seeds) / len(seeds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-shapes")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seeds", default="777,11")
    ap.add_argument("--out", type=Path, default=Path("bench/results/shapes_headroom.json"))
    args = ap.parse_args()
    seeds = tuple(int(s) for s in args.seeds.split(","))
    policy = load_policy(args.model)
    pretrain = set(load_split("pretrain"))
    forms: dict[str, dict] = {}
    for text in load_split("test"):
        form = parse_prompt(text).form
        forms.setdefault(form, {"test": [], "familiar": []})
        forms[form]["test"].append(text)
        forms[form]["familiar"] += [a for a in familiar_analogues(text) if a in pretrain]
    rows, total = {}, {"test": 0.0, "familiar": 0.0}
    n_test = sum(len(f["test"]) for f in forms.values())
    for form, f in forms.items():
        row = {k: reward(policy, v, args.samples, args.steps, seeds) for k, v in f.items()}
        row.update(prompts=len(f["test"]), familiar_prompts=len(f["familiar"]),
                   headroom=row["familiar"] - row["test"])
        rows[form] = row
        for k in total:     # weighted like the test list
            total[k] += row[k] * len(f["test"]) / n_test
    result = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "model": args.model,
              "samples_per_prompt": args.samples, "seeds": list(seeds), "steps": args.steps,
              "by_form": rows, "test": total["test"], "familiar": total["familiar"],
              "headroom": total["familiar"] - total["test"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""How well does the shipped base model draw its world, and where is its headroom?

    python bench/world_base.py [--weights treegrpo_cli/data/tiny-shapes.safetensors] [--samples 4]

ODE samples (10 steps, the `tree-grpo` sampler) of
  own:   a fixed sample of 120 pretraining captions (forms balanced, as the data draws them);
  test:  the 56 test prompts (all name orange or purple);
  clean: the own captions that name neither orange nor purple;
scored with the strict `shapes` reward, by form, plus the colour-following rate: of the asked-for
objects, the share for which a detection of the asked colour exists, split by noisy (orange, purple)
and clean colours; and, for relations, where their reward goes: the share of samples with both asked
objects drawn (colour and kind), and of those, the share whose two objects stand in the asked relation
(about 0.5 when the model knows the axis but not the order); and whether the picture depends on word
order at all: `order_sensitivity`, the mean pixel difference between the samples of "A left of B" and
"B left of A" (same noises) over that between two noises of the same prompt (0: the model reads the
prompt as a bag of words; about 1: order matters as much as the noise). Writes
bench/results/world_base-d6.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig
from treegrpo_cli.models.registry import TINY_SHAPES, load_policy
from treegrpo_cli.report.evaluate import generate
from treegrpo_cli.rewards.shapes import relation_holds, score_detections
from treegrpo_cli.training.pretrain import own_distribution_prompts
from treegrpo_cli.world.detect import detect
from treegrpo_cli.world.shapes import NOISY_COLOURS, Prompt, is_noisy, load_split, parse_prompt


def sample(policy, prompts: list[str], samples: int, seed: int) -> tuple[list[str], torch.Tensor]:
    """samples ODE draws of every prompt, as `treegrpo eval --seed seed` makes them."""
    sde = FlowSDE(SamplerConfig(steps=10))
    chunks = list(generate(policy, sde, prompts, num_images=samples, seed=seed, batch=len(prompts)))
    return [t for c in chunks for t in c.prompts], torch.cat([c.images for c in chunks])


def parsed(text: str) -> Prompt:
    """The Prompt of a text of the grammar (the own captions and the test prompts all are)."""
    p = parse_prompt(text)
    if p is None:
        raise ValueError(f"not a prompt of the shapes grammar: {text!r}")
    return p


def measure(texts: list[str], images: torch.Tensor) -> dict[str, dict[str, float | None]]:
    dets = detect(images)
    rows: dict[str, list[float]] = {"all": [], "single": [], "count": [], "relation": []}
    follow = {"noisy": [0, 0], "clean": [0, 0]}
    both: list[bool] = []  # relations: both objects drawn
    placed: list[bool] = []  # of those, the relation right
    for t, d in zip(texts, dets, strict=True):
        p = parsed(t)
        s = score_detections(p, d)
        rows["all"].append(s)
        rows[p.form].append(s)
        if p.form == "relation":
            assert p.relation is not None  # a relation prompt names its relation
            a, b = ([x for x in d if x.colour == g.colour and x.kind == g.kind] for g in p.groups)
            both.append(bool(a and b))
            if a and b:
                placed.append(any(relation_holds(x, y, p.relation) for x in a for y in b))
        for g in p.groups:
            key = "noisy" if g.colour in NOISY_COLOURS else "clean"
            follow[key][0] += any(x.colour == g.colour for x in d)
            follow[key][1] += 1
    out: dict[str, dict[str, float | None]] = {k: {"mean": sum(v) / len(v), "n": len(v)} for k, v in rows.items() if v}
    out["colour_following"] = {k: (a / b if b else None) for k, (a, b) in follow.items()}
    if both:
        out["relation_parts"] = {
            "both_drawn": sum(both) / len(both),
            "placed_given_both": sum(placed) / len(placed) if placed else None,
        }
    return out


def swap_objects(text: str) -> str:
    """'A REL B' -> 'B REL A': the same words, the objects in the other order."""
    p = parsed(text)
    a, b = p.groups
    return Prompt("relation", (b, a), p.relation).text()


def order_sensitivity(policy, prompts: list[str], samples: int, seed: int) -> float:
    """mean |x(A REL B) - x(B REL A)| over mean |x(A REL B; seed) - x(A REL B; seed + 1)|, same noises."""
    rel = [t for t in prompts if parsed(t).form == "relation"]
    x = sample(policy, rel, samples, seed)[1]
    swapped = sample(policy, [swap_objects(t) for t in rel], samples, seed)[1]
    other = sample(policy, rel, samples, seed + 1)[1]
    return float((x - swapped).abs().mean() / (x - other).abs().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", type=Path, default=TINY_SHAPES)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--seed", type=int, default=777)
    ap.add_argument("--out", type=Path, default=Path("bench/results/world_base-d6.json"))
    args = ap.parse_args()
    policy = load_policy(str(args.weights))
    own = own_distribution_prompts()
    sets = {"own": own, "test": load_split("test"), "clean": [t for t in own if not is_noisy(t)]}
    t0, result = time.perf_counter(), {"weights": str(args.weights), "samples": args.samples, "seed": args.seed}
    for name, prompts in sets.items():
        result[name] = measure(*sample(policy, prompts, args.samples, args.seed))
        print(name, json.dumps(result[name]), flush=True)
    result["order_sensitivity"] = order_sensitivity(policy, sets["clean"], args.samples, args.seed)
    print("order_sensitivity", round(result["order_sensitivity"], 4), flush=True)
    result["seconds"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

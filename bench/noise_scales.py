"""How much noise a tree's SDE steps and splits put in: the per-step std of each noise form on a preset's grid.

    python bench/noise_scales.py               # bench/results/noise_scales.{json,md}; seconds, no model

For `branch-mix`'s 20-step grid (shift 3), the std of the transition x_{i+1} | x_i at each step (g(sigma) sqrt(-d
sigma), sde.py) with the BranchGRPO paper's DanceGRPO form (g = 0.3) and with Flow-GRPO's (g = 0.7 sqrt(sigma / (1 -
sigma))), and at the split steps the std of a child's noise: the paper's correlated branching keeps each child's
marginal at the step's std (siblings share 1/17 of their variance at s = 4), the released code's scaled splits draw
it independently at 4x the step's std (tree.split_noise_scale). The ablation (docs/benchmarks.md) reads this beside
what each setting learns: how far apart a split's siblings land decides whether their rewards differ at all.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from methods import commit  # noqa: E402  (bench/ is not a package)

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.sde import FlowSDE

FORMS = {
    "dance 0.3 (paper)": ('sampler.noise="dance"', "sampler.eta=0.3"),
    "flow 0.7": ('sampler.noise="flow"', "sampler.eta=0.7"),
}


def step_stds(preset: str, sets: tuple[str, ...]) -> tuple[list[float], list[float]]:
    """The preset's grid [T+1] and the std [T] of an SDE transition at each of its steps under the given noise
    form, from the engine's own step (FlowSDE.step on a dummy state: std does not depend on x or v)."""
    sde = FlowSDE(load_config(preset, sets=list(sets)).sampler)
    T = len(sde.sigmas) - 1
    x = torch.zeros(T, 1)  # [T, 1]: one dummy state per step
    out = sde.step(x, x, torch.arange(T), torch.ones(T, dtype=torch.bool))
    return sde.sigmas.tolist(), out.std.tolist()


def main(preset: str = "branch-mix") -> None:
    cfg = load_config(preset)
    tree = cfg.tree
    sde_steps = range(cfg.sampler.steps) if tree.sde_steps is None else tree.sde_steps  # None: every step
    splits, window = list(tree.split_steps), sorted({*sde_steps, *tree.split_steps})
    scale = tree.split_noise_scale  # the released code's scaled splits: independent noise x this
    grid = {form: step_stds(preset, sets) for form, sets in FORMS.items()}
    sigmas, stds = grid["flow 0.7"][0], {form: s for form, (_, s) in grid.items()}
    rows = ["| step | sigma | " + " | ".join(f"std, {f}" for f in FORMS) + " | split child std, scaled (code) |"]
    rows.append("|---" * (3 + len(FORMS)) + "|")
    for i in window:
        scaled = f"{scale * stds['dance 0.3 (paper)'][i]:.3f}" if i in splits else ""
        cells = " | ".join(f"{stds[f][i]:.3f}" for f in FORMS)
        rows.append(f"| {i}{' (split)' if i in splits else ''} | {sigmas[i]:.3f} | {cells} | {scaled} |")
    out = Path("bench/results")
    result: dict[str, Any]
    result = {"preset": preset, "commit": commit(), "split_steps": splits, "sde_steps": window, "sigmas": sigmas}
    result |= {"step_std": stds, "scaled_split_std": {i: scale * stds["dance 0.3 (paper)"][i] for i in splits}}
    (out / "noise_scales.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "noise_scales.md").write_text(
        f"SDE steps of `{preset}` (the others are ODE steps):\n\n" + "\n".join(rows) + "\n"
    )
    print((out / "noise_scales.md").read_text(), end="")


if __name__ == "__main__":
    main()

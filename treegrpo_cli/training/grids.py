"""A run's pictures of samples: the captioned sample grids (samples/step-N.png), rolled out from the policy through
sampling.py, and before_after.png from the first and the last of them."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import Config
from ..plots import headed, image_grid, save_png, side_by_side
from ..rewards.base import weighted_sum
from .runlog import is_number, read_evals
from .runplots import reward_plot
from .sampling import sample_chunks, sample_trees, score, stream_seed


def sample_grid(
    run: Path, policy, sde, prompts: list[str], rewards: dict, *, cfg: Config, step: int, write: bool = True
) -> Path:
    """ODE samples (no noise after the root) of up to 16 eval prompts from the "grid" seed stream (sampling.py),
    captioned with their reward (write=False: the forwards only, for the other ranks of a sharded model)."""
    prompts, seed = prompts[:16], stream_seed(cfg.seed, "grid")
    batch, max_batch = max(len(prompts), 1), cfg.rollout.max_batch  # one rollout
    path = run / "samples" / f"step-{step}.png"
    if not write:
        for _ in sample_trees(policy, sde, prompts, seed, batch=batch, max_batch=max_batch):
            pass
        return path
    chunks = list(sample_chunks(policy, sde, prompts, seed, batch=batch, max_batch=max_batch))
    images = torch.cat([c.images for c in chunks])
    total = torch.cat([weighted_sum(score(rewards, c), cfg.reward.weight_map()) for c in chunks])
    captions = [f"{p} ({float(s):.3f})" for p, s in zip(prompts, total, strict=True)]
    what = "the base model" if step == 0 else f"after {step} iteration{'s' * (step != 1)} (trained weights)"
    random = str(getattr(policy, "weights", "")).startswith("random")
    lines = [f"{policy.name}: {what}"] + (["random weights, not a trained release"] if random else [])
    path.parent.mkdir(exist_ok=True)
    save_png(headed(image_grid(images, captions), lines), path)
    return path


def before_after(run: Path, step: int) -> Path | None:
    """before_after.png from samples/step-0.png and samples/step-<step>.png (None when either is missing), each
    titled with its held-out mean reward (eval.jsonl, where the run evaluated at that iteration)."""
    from PIL import Image

    paths = [run / "samples" / f"step-{k}.png" for k in (0, step)]
    if step == 0 or not all(p.is_file() for p in paths):
        return None
    before, after = (Image.open(p).convert("RGB") for p in paths)
    means = {e["iteration"]: e["reward_mean"] for e in read_evals(run) if is_number(e.get("reward_mean"))}

    def said(k: int) -> list[str]:
        return [f"held-out mean reward {means[k]:.4f}"] if k in means else []

    out = run / "before_after.png"
    sides = [
        headed(before, ["before: the base model", *said(0)]),
        headed(after, [f"after {step} iterations", *said(step)]),
    ]
    save_png(side_by_side(sides), out)
    return out


def missing_pictures(run: Path, step: int) -> Path | None:
    """reward.png and before_after.png when a finished run's last try stopped before writing them; the
    before_after.png it wrote, if any."""
    if not (run / "reward.png").is_file():
        reward_plot(run)
    return before_after(run, step) if not (run / "before_after.png").is_file() else None

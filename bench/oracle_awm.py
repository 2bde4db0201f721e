"""Oracle check of engine/awm.py against the released AWM code (scxue/advantage_weighted_matching).

    python bench/oracle_awm.py /work/.mirror/scxue+advantage_weighted_matching/repo   # its git directory
    # (the `fetch` tool's mirror; any clone's .git works) -> bench/results/oracle_awm.json; seconds, no model

The released training script (advantage_weighted_matching/scripts/train_sd3_awm.py at the mirror's HEAD) keeps its
loss in three places, each read from the file here and run as written, with stubs for what it touches (a transformer
that returns given velocities, a config namespace, an accelerator that is not the main process):

- compute_log_prob_awm: its weighted log-probability -w(l, t) per row, for each of its five weightings;
- the loss of one micro-batch inside main() (from `if not config.train.off_policy:` to the line before
  `info["clipfrac"]`): the on-policy ratio, clip, advantage clip and scale, the KL to the reference and to the EMA
  anchor; its gradient with respect to the velocity against the gradient of the mean of our awm_loss rows (the
  values differ by construction: the code's policy term is -a exp(0)), and its two KL terms against ours;
- the training timesteps of the discrete time types (the `elif config.time_type == 'discrete':` branches), from the
  same torch.rand draws as our strata, and the anchor's decay rule (kl_ema_decay_type).

Inputs are seeded fp32 tensors (`inputs`); the released code computes in float64 where it casts, ours in fp32.
tests/test_awm.py compares our functions with the released outputs stored in the results file.
"""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from treegrpo_cli.engine.awm import AWMConfig, anchor_decay_at, awm_loss, matching_loss, scaled_advantage, strata

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "oracle_awm.json"
SCRIPT = "advantage_weighted_matching/scripts/train_sd3_awm.py"
SEED = 0
LEVELS, BATCH, SHAPE = 3, 4, (2, 2, 2)  # the code's train_timesteps, train.batch_size, a latent
WEIGHTINGS = {"uniform": "Uniform", "t": "t", "t2": "t**2", "huber": "huber", "ghuber": "ghuber"}  # ours: the code's
KL_WEIGHTS = {"uniform": "Uniform", "elbo": "ELBO"}
# (weighting, kl_weight, kl_beta, anchor_beta) of each gradient case
CASES = [("ghuber", "uniform", 0.001, 1.0), ("uniform", "elbo", 0.003, 1.0), ("t", "uniform", 1e-4, 0.5),
         ("t2", "elbo", 0.01, 2.0), ("huber", "uniform", 0.001, 1.0)]  # fmt: skip
GRID = 14  # sampler steps of the time-type cases (the released configs')


def inputs(seed: int = SEED) -> dict[str, torch.Tensor]:
    """The seeded fp32 inputs of every case: rows LEVELS x BATCH (levels outer, as the code's), a latent SHAPE each."""
    g = torch.Generator().manual_seed(seed)
    rows = LEVELS * BATCH
    x0 = torch.randn(BATCH, *SHAPE, generator=g).repeat(LEVELS, 1, 1, 1)  # [rows, ...] a sample at each level
    eps = torch.randn(rows, *SHAPE, generator=g)
    t = torch.rand(LEVELS, generator=g).repeat_interleave(BATCH)  # [rows] one level per row block, as the code
    t[:BATCH] = 1.0  # the pure-noise level ("discrete" trains it): the ELBO weight's clamp at 0.99
    v = torch.randn(rows, *SHAPE, generator=g)  # the trained velocity
    v_ref = v + 0.3 * torch.randn(rows, *SHAPE, generator=g)
    v_anchor = v + 0.1 * torch.randn(rows, *SHAPE, generator=g)
    adv = 3.0 * torch.randn(BATCH, generator=g)  # some beyond +-5: the clip acts
    adv[0] = 7.5
    return {"x0": x0, "eps": eps, "t": t, "v": v, "v_ref": v_ref, "v_anchor": v_anchor, "adv": adv}


# --- the released code, read from the mirror ----------------------------------------------------------------------


def released_source(git_dir: Path) -> tuple[str, str]:
    """(the training script's text, the mirror's HEAD commit)."""
    git = ["git", "--git-dir", str(git_dir)]
    text = subprocess.run([*git, "show", f"HEAD:{SCRIPT}"], capture_output=True, text=True, check=True).stdout
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return text, head


def function(text: str, name: str) -> Any:
    """A top-level function of the script, executed on its own with torch in scope."""
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module([node], []), SCRIPT, "exec"), scope)
    return scope[name]


def block(text: str, start: str, stop: tuple[str, ...], near: str = "") -> str:
    """The lines of the script from one that starts with `start` (stripped: the first, or with `near` the last
    before the first line holding `near`) to the one before the next that starts with one of `stop`, dedented."""
    lines = text.splitlines()
    if near:
        g = next(k for k, line in enumerate(lines) if near in line)
        i = max(k for k in range(g) if lines[k].strip().startswith(start))
    else:
        i = next(k for k, line in enumerate(lines) if line.strip().startswith(start))
    j = next(k for k in range(i + 1, len(lines)) if lines[k].strip().startswith(stop))
    return textwrap.dedent("\n".join(lines[i:j]))


def config(weighting: str, kl_weight: str, beta: float, ema_beta: float) -> SimpleNamespace:
    train = SimpleNamespace(
        cfg=False, ghuber_power=0.25, train_timesteps=LEVELS, batch_size=BATCH, off_policy=False,
        gradient_accumulation_steps=1, adv_clip_max=5, advantage_max=1, loss_type="exp_first", clip_range=1,
        beta=beta, kl_weight=KL_WEIGHTS[kl_weight], kl_ema_weight=KL_WEIGHTS[kl_weight], ema_beta=ema_beta,
        weighting=WEIGHTINGS[weighting], timestep_fraction=0.9, kl_ema_decay=0.3,
    )  # fmt: skip
    return SimpleNamespace(train=train, sample=SimpleNamespace(guidance_scale=1.0, num_steps=GRID))


def released_log_prob(fn: Any, x: dict[str, torch.Tensor], v: torch.Tensor, weighting: str) -> torch.Tensor:
    """compute_log_prob_awm's (log_prob [rows], model_output, std_dev_t) with a transformer that returns v."""
    cfg = config(weighting, "uniform", 0.0, 0.0)

    def transformer(**kwargs: Any) -> tuple[torch.Tensor]:
        return (v,)

    t = x["t"].view(-1, 1, 1, 1)
    x_t = (1 - t) * x["x0"] + t * x["eps"]
    return fn(transformer, None, {}, t, None, None, cfg, x_t, x["x0"], x["eps"], weighting=cfg.train.weighting)


def released_gradient(text: str, case: tuple[str, str, float, float], x: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The micro-batch loss of main() on x: its gradient with respect to v and its two KL terms."""
    weighting, kl_weight, beta, ema_beta = case
    fn, cfg = function(text, "compute_log_prob_awm"), config(*case)
    v = x["v"].clone().requires_grad_(True)
    log_prob, model_output, std_dev_t = released_log_prob(fn, x, v, weighting)
    with torch.no_grad():
        log_prob_ref, model_output_ref, _ = released_log_prob(fn, x, x["v_ref"], weighting)
        _, model_output_ema, _ = released_log_prob(fn, x, x["v_anchor"], weighting)
    scope: dict[str, Any] = {
        "torch": torch, "config": cfg, "accelerator": SimpleNamespace(is_main_process=False), "i": 0,
        "sample": {"advantages": x["adv"][:, None]}, "log_prob": log_prob, "model_output": model_output,
        "std_dev_t": std_dev_t, "log_prob_ref": log_prob_ref, "model_output_ref": model_output_ref,
        "model_output_ema": model_output_ema,
    }  # fmt: skip
    exec(block(text, "if not config.train.off_policy:", ('info["clipfrac"]',), near="# grpo logic"), scope)
    scope["loss"].backward()
    assert v.grad is not None
    return {
        "grad": v.grad.flatten().tolist(),
        "kl": float(scope["kl_loss"].detach()),
        "ema_kl": float(scope["ema_kl_loss"].detach()),
    }


def released_steps(text: str, time_type: str, seed: int) -> list[int]:
    """The training timesteps' grid steps of the discrete time type, after torch.manual_seed(seed)."""
    src = block(text, f"elif config.time_type == '{time_type}':", ("elif config.time_type", "else:"))
    src = src.replace(f"elif config.time_type == '{time_type}':", "if True:", 1)
    grid = torch.arange(GRID, 0, -1, dtype=torch.float32) * (1000 / GRID)  # distinct timesteps, step k at row k
    scope: dict[str, Any] = {
        "torch": torch, "config": config("ghuber", "uniform", 0, 0), "accelerator": SimpleNamespace(device="cpu"),
        "sample": {"timesteps": grid[None]},
    }  # fmt: skip
    torch.manual_seed(seed)
    exec(src, scope)
    steps = (GRID - scope["timesteps"].flatten() * GRID).round().long()  # back to grid steps
    return steps[::BATCH].tolist()  # one per level (the code repeats each for the micro-batch)


def released_decay(text: str, kind: str, step: int) -> float:
    src = block(text, "if config.train.kl_ema_decay_type == 'constant':", ("if accelerator.is_main_process",))
    cfg = config("ghuber", "uniform", 0, 0)
    cfg.train.kl_ema_decay_type = kind
    scope: dict[str, Any] = {"config": cfg, "global_step": step}
    exec(src, scope)
    return float(scope["decay"])


# --- ours ------------------------------------------------------------------------------------------------------


def ours_log_prob(x: dict[str, torch.Tensor], weighting: str) -> list[float]:
    return (-matching_loss(x["v"], x["x0"], x["eps"], x["t"], weighting, 0.25)).tolist()


def ours_gradient(case: tuple[str, str, float, float], x: dict[str, torch.Tensor]) -> dict[str, Any]:
    weighting, kl_weight, beta, anchor_beta = case
    cfg = AWMConfig(weighting=weighting, kl_weight=kl_weight, anchor_beta=anchor_beta)
    v = x["v"].clone().requires_grad_(True)
    a = scaled_advantage(x["adv"].repeat(LEVELS), cfg)
    loss, k_ref, k_anchor = awm_loss(
        v, x["x0"], x["eps"], x["t"], a, cfg, kl_beta=beta, v_ref=x["v_ref"], v_anchor=x["v_anchor"]
    )
    loss.mean().backward()
    assert v.grad is not None and k_ref is not None and k_anchor is not None
    return {
        "grad": v.grad.flatten().tolist(),
        "kl": float(k_ref.detach().mean()),
        "ema_kl": float(k_anchor.detach().mean()),
    }


def ours_steps(time_type: str, seed: int) -> list[int]:
    first, top = AWMConfig(levels=LEVELS, time_sampling=time_type).grid(GRID)
    torch.manual_seed(seed)
    return strata(torch.rand(LEVELS), first, top).tolist()


def diff(a: Any, b: Any) -> float:
    return float((torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max())


def main(git_dir: Path) -> dict[str, Any]:
    text, head = released_source(git_dir)
    x = inputs()
    fn = function(text, "compute_log_prob_awm")
    log_probs: list[dict[str, Any]] = [
        {"weighting": w, "released": released_log_prob(fn, x, x["v"], w)[0].tolist(), "ours": ours_log_prob(x, w)}
        for w in WEIGHTINGS
    ]
    gradients: list[dict[str, Any]] = [
        {"case": list(case), "released": released_gradient(text, case, x), "ours": ours_gradient(case, x)}
        for case in CASES
    ]
    steps: list[dict[str, Any]] = [
        {"time_type": kind, "seed": seed, "released": released_steps(text, kind, seed), "ours": ours_steps(kind, seed)}
        for kind in ("discrete_wo_init", "discrete")
        for seed in range(4)
    ]
    decays: list[dict[str, Any]] = [
        {"ramp": kind, "step": s, "released": released_decay(text, kind, s),
         "ours": anchor_decay_at(s, AWMConfig(anchor_ramp=kind))}
        for kind in ("linear", "constant") for s in (0, 1, 150, 299, 300, 1000)
    ]  # fmt: skip
    for row in log_probs + steps + decays:
        row["max_abs_diff"] = diff(row["released"], row["ours"])
    for row in gradients:
        row["max_abs_diff"] = max(diff(row["released"][k], row["ours"][k]) for k in ("grad", "kl", "ema_kl"))
    worst = max(float(row["max_abs_diff"]) for row in log_probs + gradients + steps + decays)
    return {
        "command": "python bench/oracle_awm.py GIT_DIR",
        "released": {"repository": "scxue/advantage_weighted_matching", "commit": head, "file": SCRIPT},
        "inputs": {"seed": SEED, "levels": LEVELS, "batch": BATCH, "shape": list(SHAPE), "grid": GRID},
        "log_prob": log_probs,
        "gradient": gradients,
        "timesteps": steps,
        "anchor_decay": decays,
        "max_abs_diff": worst,
        "agree": worst <= 1e-5,
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    result = main(Path(sys.argv[1]))
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{OUT.relative_to(ROOT)}: max abs difference {result['max_abs_diff']:.3g} (agree: {result['agree']})")
    if not math.isfinite(result["max_abs_diff"]) or not result["agree"]:
        sys.exit(1)

"""Oracle: GRPO-Guard's ratio, loss and gradient (engine/ratio_guard.py, as engine/grpo.py runs it) beside the
released codes' own lines, on the same seeded fp32 tensors.

    python bench/oracle_ratio_guard.py --flow-grpo /work/.mirror/zhtmike+flow_grpo/repo \\
        --flow-factory /work/.mirror/X-GenGroup+Flow-Factory/repo

Both paths are bare git mirrors (the `fetch` tool's, or `git clone --mirror`): github:zhtmike/flow_grpo is a fork
of yifan123/flow_grpo at the merge of its pull request 175, the paper's authors' "GRPO-Guard" commit (the stored
snapshot of yifan123/flow_grpo predates it); github:X-GenGroup/Flow-Factory. What runs, read from HEAD:

- flow_grpo `scripts/train_sd3_GRPO_Guard.py`: the RatioNorm block of its training loop (`if config.rationorm:`
  to the loss / sqrt_dt^2), with its SDE step `sde_step_with_logprob`
  (`flow_grpo/diffusers_patch/sd3_sde_with_logprob.py`, diffusers stubbed) for the log-probs and means. Ours:
  train.ratio_norm = "code", train.step_reweight = "dt".
- Flow-Factory `src/flow_factory/trainers/grpo.py`, `GRPOGuardTrainer.optimize`: its reweighted ratio and clipped
  loss (the log-probs and means from the same SDE step, which its Flow-SDE branch repeats). Ours: "paper", "none".

Both loops train one denoising step's micro-batch at a time: here 6 edges at each of the steps 0 (sigma = 1), 4 and
8 of a 10-step Flow-GRPO grid (shift 3, a = 0.7), each edge with its own parent. Ours takes the 18 edges as one
chunk of one optimizer step (the step after the first, so the behaviour means are the kept ones), the loss divided
by 6 (a step's edges), which gives each edge the gradient of its step's loss. Compared: every edge's ratio, every
step's loss, the gradient of the loss with respect to the new velocities. Writes bench/results/oracle_ratio_guard.json
(seed and shapes, the released outputs, ours, the largest absolute differences; agreement required to 1e-5);
tests/test_ratio_guard.py checks ours against the stored released outputs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from treegrpo_cli.engine.grpo import EdgeTerms, clip_objective
from treegrpo_cli.engine.ratio_guard import RatioGuard
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig, gaussian_log_prob

SEED = 2510
STEPS = (0, 4, 8)  # denoising steps of the 10-step grid (0: sigma = 1, where Flow-GRPO's g uses sigma_1)
EDGES = 6  # a step's micro-batch
LATENT = (2, 4, 4)
CLIP = 2e-3  # the clip range eps: some ratios clip, others do not
OUT = Path(__file__).resolve().parent / "results" / "oracle_ratio_guard.json"
TOL = 1e-5


def kernel() -> FlowSDE:
    return FlowSDE(SamplerConfig(steps=10, shift=3.0, noise="flow", eta=0.7))


def make_inputs(seed: int = SEED) -> dict[str, torch.Tensor]:
    """The seeded batch: parents x, behaviour and new velocities, the sampled children x' = mu_old + s eps, advantages.
    The new velocities differ from the behaviour ones by 1e-2 to 3 (some ratios far outside the clip band)."""
    g = torch.Generator().manual_seed(seed)
    n = len(STEPS) * EDGES
    step = torch.tensor(STEPS).repeat_interleave(EDGES)
    x, v_old, eps = (torch.randn(n, *LATENT, generator=g) for _ in range(3))
    scale = torch.logspace(-2, 0.5, EDGES).repeat(len(STEPS)).view(-1, 1, 1, 1)
    v_new = v_old + scale * torch.randn(n, *LATENT, generator=g)
    adv = torch.randn(n, generator=g)
    res = kernel().step(x, v_old, step, torch.ones(n, dtype=torch.bool))
    x_next = res.mean + res.std.view(-1, 1, 1, 1) * eps
    return {"step": step, "x": x, "v_old": v_old, "v_new": v_new, "x_next": x_next, "adv": adv}


def ours(inp: dict[str, torch.Tensor], ratio_norm: str, step_reweight: str) -> dict[str, list[float]]:
    """Our edge terms from our SDE step, through RatioGuard as grpo_update calls it (optimizer step 1, one chunk)."""
    sde, n = kernel(), len(inp["step"])
    v = inp["v_new"].clone().requires_grad_(True)
    sde_on = torch.ones(n, dtype=torch.bool)
    res = sde.step(inp["x"], v, inp["step"], sde_on)
    old = sde.step(inp["x"], inp["v_old"], inp["step"], sde_on)
    new_lp = gaussian_log_prob(inp["x_next"], res.mean, res.std)
    old_lp = gaussian_log_prob(inp["x_next"], old.mean, old.std)
    slot = torch.arange(n)
    e = EdgeTerms(new_lp, None, n, res.mean, res.std, inp["step"], slot)
    quiet = EdgeTerms(new_lp.detach(), None, n, res.mean.detach(), res.std, inp["step"], slot)
    guard = RatioGuard(
        ratio_norm,
        step_reweight,
        sde,
        forward=lambda edges: quiet,
        pad=lambda k, have: None,
        objective=lambda r, a: clip_objective(r, a, CLIP),
    )
    guard.behaviour = [[], [old.mean.detach()]]
    bias = guard.step_bias(1, [slot], old_lp, inp["adv"])
    loss, ratio, carry = guard.loss(e, 1, 0, old_lp, inp["adv"], bias)
    ((loss if carry is None else loss + carry).sum() / EDGES).backward()
    assert v.grad is not None
    return {
        "ratio": ratio.detach().tolist(),
        "loss": loss.detach().view(len(STEPS), EDGES).mean(1).tolist(),
        "grad": v.grad.flatten().tolist(),
    }


# --- the released codes ---------------------------------------------------------------------------------------------


def git_show(mirror: Path, path: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
    ).stdout


def git_head(mirror: Path) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def block(source: str, start: str, end: str, after: str = "") -> str:
    """The lines of `source` from the first line holding `start` (after the first holding `after`) to the first
    holding `end` after it, dedented: released code to exec."""
    lines = source.splitlines()
    a = next(i for i, ln in enumerate(lines) if after in ln) if after else 0
    s = next(i for i in range(a, len(lines)) if start in lines[i])
    e = next(i for i in range(s, len(lines)) if end in lines[i])
    return textwrap.dedent("\n".join(lines[s : e + 1]))


def _stub_diffusers() -> None:
    """The two names sd3_sde_with_logprob.py imports from diffusers: it samples no noise here (prev_sample given)."""
    utils = types.ModuleType("diffusers.utils.torch_utils")
    utils.randn_tensor = lambda *a, **k: torch.randn(*a)  # type: ignore[attr-defined]
    sched = types.ModuleType("diffusers.schedulers.scheduling_flow_match_euler_discrete")
    sched.FlowMatchEulerDiscreteScheduler = object  # type: ignore[attr-defined]
    for name in ("diffusers", "diffusers.utils", "diffusers.schedulers"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["diffusers.utils.torch_utils"] = utils
    sys.modules["diffusers.schedulers.scheduling_flow_match_euler_discrete"] = sched


class Scheduler:
    """What sde_step_with_logprob reads of diffusers' FlowMatchEulerDiscreteScheduler: the float32 sigmas [T+1] and
    a timestep's index (SD3's timesteps are 1000 sigma)."""

    def __init__(self, sigmas: torch.Tensor):
        self.sigmas = sigmas.float()
        self.timesteps = self.sigmas[:-1] * 1000

    def index_for_timestep(self, t: torch.Tensor) -> int:
        return int((self.timesteps == t).nonzero()[0])


def flow_grpo_step(mirror: Path) -> Any:
    _stub_diffusers()
    ns: dict[str, Any] = {}
    exec(compile(git_show(mirror, "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"), "sd3_sde", "exec"), ns)
    return ns["sde_step_with_logprob"]


def released_terms(step_fn: Any, inp: dict[str, torch.Tensor], rows: slice) -> dict[str, Any]:
    """One step's micro-batch through flow_grpo's SDE step: the new terms (with the gradient of v) and the old."""
    sched = Scheduler(kernel().sigmas)
    t = sched.timesteps[inp["step"][rows]]
    v = inp["v_new"][rows].clone().requires_grad_(True)
    x, x_next = inp["x"][rows], inp["x_next"][rows]
    _, lp, mean, std_dev_t, sqrt_dt = step_fn(sched, v, t, x, noise_level=0.7, prev_sample=x_next, return_sqrt_dt=True)
    with torch.no_grad():
        _, old_lp, old_mean, _ = step_fn(sched, inp["v_old"][rows], t, x, noise_level=0.7, prev_sample=x_next)
    i = inp["step"][rows]
    dt = (sched.sigmas[i + 1] - sched.sigmas[i]).view(-1, 1, 1, 1)  # Flow-Factory's sigma_t+1 - sigma_t [B, 1, 1, 1]
    terms = {"v": v, "lp": lp, "mean": mean, "std_dev_t": std_dev_t, "sqrt_dt": sqrt_dt, "dt": dt}
    return {**terms, "old_lp": old_lp, "old": old_mean}


def run_flow_grpo(mirror: Path, step_fn: Any, inp: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    code = block(
        git_show(mirror, "scripts/train_sd3_GRPO_Guard.py"),
        "if config.rationorm:",
        "policy_loss = policy_loss / (sqrt_dt.mean()**2)",
        after="# grpo logic",
    )
    return _per_step(inp, lambda tm, rows: _exec_flow_grpo(code, tm, inp, rows), step_fn)


def _exec_flow_grpo(code: str, tm: dict[str, Any], inp: dict[str, torch.Tensor], rows: slice) -> tuple[Any, Any]:
    config = SimpleNamespace(rationorm=True, train=SimpleNamespace(clip_range=CLIP))
    sample = {"prev_sample_mean": tm["old"][:, None], "log_probs": tm["old_lp"][:, None]}
    ns: dict[str, Any] = dict(torch=torch, config=config, sample=sample, j=0, advantages=inp["adv"][rows])
    ns["log_prob"] = tm["lp"]
    ns.update(std_dev_t=tm["std_dev_t"], sqrt_dt=tm["sqrt_dt"], prev_sample_mean=tm["mean"])
    exec(compile(code, "train_sd3_GRPO_Guard", "exec"), ns)
    return ns["ratio"], ns["policy_loss"]


def run_flow_factory(mirror: Path, step_fn: Any, inp: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    code = block(
        git_show(mirror, "src/flow_factory/trainers/grpo.py"),
        "scale_factor = torch.sqrt(-output.dt) * output.std_dev_t",
        "policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))",
        after="class GRPOGuardTrainer",
    )
    return _per_step(inp, lambda tm, rows: _exec_flow_factory(code, tm, inp, rows), step_fn)


def _exec_flow_factory(code: str, tm: dict[str, Any], inp: dict[str, torch.Tensor], rows: slice) -> tuple[Any, Any]:
    output = SimpleNamespace(dt=tm["dt"], std_dev_t=tm["std_dev_t"], log_prob=tm["lp"], next_latents_mean=tm["mean"])
    trainer = SimpleNamespace(training_args=SimpleNamespace(clip_range=(-CLIP, CLIP)))
    ns: dict[str, Any] = dict(torch=torch, output=output, batch={"next_latents_mean": tm["old"][:, None]})
    ns["self"] = trainer
    ns.update(callback_index_map=torch.tensor([0]), timestep_index=0, old_log_prob=tm["old_lp"], adv=inp["adv"][rows])
    exec(compile(code, "flow_factory_grpo", "exec"), ns)
    ratio = ns["ratio"].reshape(EDGES, EDGES)  # [B, 1, 1, B]: its [B] log-probs times the [B, 1, 1, 1] scale
    assert torch.equal(ratio, ratio[:1].expand_as(ratio)), "the micro-batch's rows differ"
    return ratio[0], ns["policy_loss"]


def _per_step(inp: dict[str, torch.Tensor], run: Any, step_fn: Any) -> dict[str, list[float]]:
    ratio, loss, grad = [], [], []
    for s in range(len(STEPS)):
        rows = slice(s * EDGES, (s + 1) * EDGES)
        tm = released_terms(step_fn, inp, rows)
        r, pl = run(tm, rows)
        pl.backward()
        ratio += r.detach().flatten().tolist()
        loss.append(float(pl.detach()))
        grad.append(tm["v"].grad.flatten())
    return {"ratio": ratio, "loss": loss, "grad": torch.cat(grad).tolist()}


def max_diff(a: dict[str, list[float]], b: dict[str, list[float]]) -> dict[str, float]:
    return {k: float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max()) for k in a}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flow-grpo", type=Path, required=True, help="bare git mirror of flow_grpo with GRPO-Guard")
    ap.add_argument("--flow-factory", type=Path, required=True, help="bare git mirror of X-GenGroup/Flow-Factory")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    inp = make_inputs()
    step_fn = flow_grpo_step(args.flow_grpo)
    cases = {
        "flow_grpo": (args.flow_grpo, run_flow_grpo, ("code", "dt")),
        "flow_factory": (args.flow_factory, run_flow_factory, ("paper", "none")),
    }
    out: dict[str, Any] = {
        "seed": SEED,
        "steps": list(STEPS),
        "edges_per_step": EDGES,
        "latent": list(LATENT),
        "clip_range": CLIP,
        "sampler": {"steps": 10, "shift": 3.0, "noise": "flow", "eta": 0.7},
        "tolerance": TOL,
    }
    for name, (mirror, run, (norm, reweight)) in cases.items():
        released, mine = run(mirror, step_fn, inp), ours(inp, norm, reweight)
        diff = max_diff(released, mine)
        out[name] = {
            "commit": git_head(mirror),
            "train": {"ratio_norm": norm, "step_reweight": reweight},
            "released": released,
            "ours": mine,
            "max_abs_diff": diff,
        }
        print(f"{name} ({norm}, {reweight}): max abs diff {diff}")
        if max(diff.values()) > TOL:
            raise SystemExit(f"{name}: ours differs from the released code by more than {TOL}")
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

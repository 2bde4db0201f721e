"""Oracle: Flow-DPPO's KL mask (engine/kl_mask.py, as engine/grpo.py runs it through RatioGuard) beside the released
code's own functions, on the same seeded fp32 tensors.

    python bench/oracle_kl_mask.py --unirl /work/.mirror/Tencent-Hunyuan+UniRL/repo

The path is a bare git mirror of github:Tencent-Hunyuan/UniRL (the `fetch` tool's, or `git clone --mirror`). What
runs, read from HEAD: `unirl/algorithms/flowdppo.py`'s `_gaussian_kl_div` and `_flowdppo_kl_adv_loss` (exec'd
alone: the module's other imports are the trainer's), and `FlowDPPO._compute_sigma_t` for its KL's std.

The batch: 6 samples, each with its own parent at each of the steps 2, 4 and 8 of a 10-step Flow-GRPO grid (shift 3,
a = 0.7); the new velocities differ from the behaviour ones by 1e-2 to 3, so some steps' KLs pass the threshold and
some do not, with ratios on both sides of 1 and advantages of both signs. The released loss takes [B, S'] log-probs
and [B, S', C, H, W] means, its std per step from `_compute_sigma_t`; ours takes the 18 edges as one chunk of the
second optimizer step (the behaviour means the kept ones), the std from our SDE step. Compared: each edge's KL, drop
mask and loss, the mean loss, and the gradient of the mean loss with respect to the new velocities; ours with
train.kl_mask_reduction = "mean" at the code's threshold, and "sum" at the threshold times D (the same mask).
Writes bench/results/oracle_kl_mask.json (seed and shapes, the released outputs, ours, the largest absolute
differences; agreement required to 1e-5); tests/test_kl_mask.py checks ours against the stored released outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from treegrpo_cli.engine.grpo import EdgeTerms, clip_objective
from treegrpo_cli.engine.kl_mask import KLMask, gaussian_kl
from treegrpo_cli.engine.ratio_guard import RatioGuard
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig, gaussian_log_prob

SEED = 2606
STEPS = (2, 4, 8)
SAMPLES = 6
LATENT = (2, 4, 4)
ETA = 0.7
THRESHOLD = 1e-3  # the code's kl_mask_threshold ("mean"): some of these edges' KLs pass it, some do not
OUT = Path(__file__).resolve().parent / "results" / "oracle_kl_mask.json"
TOL = 1e-5


def kernel() -> FlowSDE:
    return FlowSDE(SamplerConfig(steps=10, shift=3.0, noise="flow", eta=ETA))


def make_inputs(seed: int = SEED) -> dict[str, torch.Tensor]:
    """The seeded batch, edge e = s * SAMPLES + i (step s, sample i): parents x, behaviour and new velocities, the
    children x' = mu_old + s eps, advantages."""
    g = torch.Generator().manual_seed(seed)
    n = len(STEPS) * SAMPLES
    step = torch.tensor(STEPS).repeat_interleave(SAMPLES)
    x, v_old, eps = (torch.randn(n, *LATENT, generator=g) for _ in range(3))
    scale = torch.logspace(-2, 0.5, SAMPLES).repeat(len(STEPS)).view(-1, 1, 1, 1)
    v_new = v_old + scale * torch.randn(n, *LATENT, generator=g)
    adv = torch.randn(n, generator=g)
    res = kernel().step(x, v_old, step, torch.ones(n, dtype=torch.bool))
    x_next = res.mean + res.std.view(-1, 1, 1, 1) * eps
    return {"step": step, "x": x, "v_old": v_old, "v_new": v_new, "x_next": x_next, "adv": adv}


def _terms(inp: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Any, Any, torch.Tensor, torch.Tensor]:
    """The new velocities (with gradient), our SDE step's new and behaviour terms, new and behaviour log-probs."""
    sde, n = kernel(), len(inp["step"])
    v = inp["v_new"].clone().requires_grad_(True)
    on = torch.ones(n, dtype=torch.bool)
    res, old = sde.step(inp["x"], v, inp["step"], on), sde.step(inp["x"], inp["v_old"], inp["step"], on)
    new_lp = gaussian_log_prob(inp["x_next"], res.mean, res.std)
    old_lp = gaussian_log_prob(inp["x_next"], old.mean, old.std)
    return v, res, old, new_lp, old_lp.detach()


def ours(inp: dict[str, torch.Tensor], reduction: str, threshold: float) -> dict[str, list[float]]:
    """Our loss through RatioGuard as grpo_update calls it with train.trust = "kl-mask" (optimizer step 1, a chunk)."""
    v, res, old, new_lp, old_lp = _terms(inp)
    n = len(inp["step"])
    slot = torch.arange(n)
    e = EdgeTerms(new_lp, None, n, res.mean, res.std, inp["step"], slot)
    guard = RatioGuard(
        "none",
        "none",
        kernel(),
        forward=lambda edges: e,
        pad=lambda k, have: None,
        objective=lambda r, a: clip_objective(r, a, 1e-3),
        kl_mask=KLMask(threshold, reduction),
    )
    guard.behaviour = [[], [old.mean.detach()]]
    loss, _, _ = guard.loss(e, 1, 0, old_lp, inp["adv"], None)
    (loss.sum() / n).backward()
    assert v.grad is not None
    kl = gaussian_kl(res.mean.detach(), old.mean, res.std, reduction)
    d = math.prod(LATENT) if reduction == "sum" else 1
    return {
        "kl": (kl / d).tolist(),  # in the code's units
        "drop": guard.dropped[0].tolist(),
        "loss_per_edge": loss.detach().tolist(),
        "loss": float(loss.detach().mean()),
        "grad": v.grad.flatten().tolist(),
        "std": res.std.tolist(),
    }


# --- the released code ----------------------------------------------------------------------------------------------


def git_show(mirror: Path, path: str) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", "show", f"HEAD:{path}"], capture_output=True, text=True, check=True
    ).stdout


def git_head(mirror: Path) -> str:
    return subprocess.run(
        ["git", f"--git-dir={mirror}", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def function(source: str, name: str) -> str:
    """The text of the top-level or method `def name` in `source`, dedented, up to the next line at its indent."""
    lines = source.splitlines()
    s = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"def {name}("))
    indent = len(lines[s]) - len(lines[s].lstrip())
    e = next(
        (i for i in range(s + 1, len(lines)) if _outdented(lines[i], indent)),
        len(lines),
    )
    return "\n".join(ln[indent:] for ln in lines[s:e])


def _outdented(line: str, indent: int) -> bool:
    """A line back at the def's indent that does not close its signature: the def has ended."""
    return bool(line.strip()) and len(line) - len(line.lstrip()) <= indent and not line.lstrip().startswith(")")


def released_functions(mirror: Path) -> dict[str, Any]:
    src = git_show(mirror, "unirl/algorithms/flowdppo.py")
    ns: dict[str, Any] = {"torch": torch, "Tuple": tuple, "Dict": dict, "List": list, "Any": Any}
    ns["LatentSegment"] = ns["Condition"] = object
    for name in ("_gaussian_kl_div", "_flowdppo_kl_adv_loss", "_compute_sigma_t"):
        exec(compile("from __future__ import annotations\n" + function(src, name), f"flowdppo.{name}", "exec"), ns)
    return ns


def released(mirror: Path, inp: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """The released loss on the batch laid out as [B = SAMPLES, S' = steps]; outputs back in our edge order."""
    fn = released_functions(mirror)
    v, res, old, new_lp, old_lp = _terms(inp)
    b, s = SAMPLES, len(STEPS)

    def grid(t: torch.Tensor) -> torch.Tensor:  # [S' * B, ...] -> [B, S', ...]
        return t.view(s, b, *t.shape[1:]).transpose(0, 1)

    self = SimpleNamespace(add_kl_coefficient=True, params=SimpleNamespace(eta=ETA))
    segment = SimpleNamespace(sigmas=kernel().sigmas)
    sigma_t = fn["_compute_sigma_t"](self, segment, list(STEPS), device=torch.device("cpu"))
    loss_elem, metrics = fn["_flowdppo_kl_adv_loss"](
        new_logp=grid(new_lp),
        old_logp=grid(old_lp),
        new_means=grid(res.mean),
        old_means=grid(old.mean),
        advantages=grid(inp["adv"]),
        sigma_t=sigma_t,
        kl_mask_threshold=THRESHOLD,
    )
    loss = loss_elem.mean()
    loss.backward()
    assert v.grad is not None
    kl = fn["_gaussian_kl_div"](grid(res.mean.detach()), grid(old.mean), sigma_t).mean(dim=(2, 3, 4))
    ratio, adv = torch.exp(grid(new_lp - old_lp)).detach(), grid(inp["adv"])
    drop = (kl >= THRESHOLD) & (((ratio > 1) & (adv > 0)) | ((ratio < 1) & (adv < 0)))
    assert abs(float(drop.float().mean()) - float(metrics["masked_fraction"])) < 1e-7  # the same mask as its own

    def edges(t: torch.Tensor) -> list[float]:  # [B, S'] -> our edge order
        return t.transpose(0, 1).reshape(-1).tolist()

    return {
        "kl": edges(kl),
        "drop": edges(drop.float()),
        "loss_per_edge": edges(loss_elem.detach()),
        "loss": float(loss.detach()),
        "grad": v.grad.flatten().tolist(),
        "std": sigma_t.flatten().repeat_interleave(b).tolist(),
    }


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    return {k: float((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max()) for k in a}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unirl", type=Path, required=True, help="bare git mirror of Tencent-Hunyuan/UniRL")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    inp = make_inputs()
    rel = released(args.unirl, inp)
    out: dict[str, Any] = {
        "seed": SEED,
        "steps": list(STEPS),
        "samples": SAMPLES,
        "latent": list(LATENT),
        "sampler": {"steps": 10, "shift": 3.0, "noise": "flow", "eta": ETA},
        "kl_mask_threshold": THRESHOLD,
        "tolerance": TOL,
        "commit": git_head(args.unirl),
        "released": rel,
    }
    d = math.prod(LATENT)
    for reduction, threshold in (("mean", THRESHOLD), ("sum", THRESHOLD * d)):
        mine = ours(inp, reduction, threshold)
        diff = max_diff(rel, mine)
        out[reduction] = {"kl_mask_threshold": threshold, "ours": mine, "max_abs_diff": diff}
        print(f"{reduction} (threshold {threshold:g}): max abs diff {diff}")
        if max(diff.values()) > TOL:
            raise SystemExit(f"{reduction}: ours differs from the released code by more than {TOL}")
    drop = torch.tensor(rel["drop"])
    print(f"dropped {int(drop.sum())} of {len(drop)} edges")
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""DGPO's loss beside the released code's: engine/dgpo.py against Luo-Yihong/DGPO scripts/train_sd3_dgpo.py run
verbatim on the same seeded fp32 tensors.

    python bench/oracle_dgpo.py /work/.mirror/Luo-Yihong+DGPO/repo     # bench/results/oracle_dgpo.json; seconds

PATH is the released repository: a checkout, or a bare git directory (read with `git show HEAD:...`). From its
training script the oracle takes, unchanged, the functions precompute_group_info and
compute_group_dgpo_loss_allreduce and the lines of its training step from `ref_dgpo_v = ref_old_v` to the last
`info[...]` before the backward (the reference choice, the advantage clamp, the PPO-style clip of the flow-matching
error against the old policy, the group loss, the velocity penalty); a stub stands in for torch.distributed (one
process: the all-reduce is the identity) and for the accelerator. Each case draws groups of samples in shuffled
rows, advantages centred in each group, velocities near the target, and compares the released step's loss, its
gradient with respect to the trained velocity and its clipped rows with ours (dgpo.loss = "code" plus
train.kl_beta's penalty), and ours with dgpo.loss = "paper", whose gradient is beta times the released one.
tests/test_dgpo.py checks engine/dgpo.py against the released numbers this file keeps.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from treegrpo_cli.engine.dgpo import dgpo_loss, velocity_penalty

SCRIPT = "scripts/train_sd3_dgpo.py"
OUT = Path(__file__).resolve().parent / "results" / "oracle_dgpo.json"
SHAPE = (2, 3, 3)  # one sample's latent
# case -> (seed, groups, group size, beta_dpo, clip_range (0: no clip), train.beta (the penalty), use_ema_ref)
CASES: dict[str, tuple[int, int, int, float, float, float, bool]] = {
    "plain": (0, 3, 4, 100.0, 0.0, 0.0, False),
    "clip": (1, 3, 4, 100.0, 0.01, 0.0, False),
    "clip-penalty": (2, 4, 3, 100.0, 0.005, 0.02, False),
    "ema-reference": (3, 2, 6, 2000.0, 0.01, 0.001, True),
    "small-beta": (4, 3, 5, 10.0, 0.0, 0.0, False),
}


def make_inputs(seed: int, groups: int, size: int) -> dict[str, torch.Tensor]:
    """One case's tensors: velocities [B, *SHAPE] near the target (the trained one 0.05 from the reference, the old
    one 0.05 from the trained one), advantages [B] centred and scaled in each group, each row's group [B] (shuffled
    rows) and its prompt ids [B, 4] as the released code sees a group."""
    g = torch.Generator().manual_seed(seed)
    n = groups * size
    group = torch.arange(groups).repeat_interleave(size)[torch.randperm(n, generator=g)]
    target = torch.randn((n, *SHAPE), generator=g)
    ref = target + 0.5 * torch.randn((n, *SHAPE), generator=g)
    model = ref + 0.05 * torch.randn((n, *SHAPE), generator=g)
    old = model + 0.05 * torch.randn((n, *SHAPE), generator=g)
    init = ref + 0.05 * torch.randn((n, *SHAPE), generator=g)  # the frozen initial policy when ref is the old one
    rewards = torch.rand(n, generator=g)
    adv = torch.zeros(n)
    for k in range(groups):
        r = rewards[group == k]
        adv[group == k] = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
    prompt_ids = (group[:, None] * 7 + torch.arange(4)) % 97
    return {"target": target, "ref": ref, "model": model, "old": old, "init": init, "adv": adv, "group": group,
            "prompt_ids": prompt_ids}  # fmt: skip


class _Dist:
    """torch.distributed for one process: its all-reduce leaves the tensor as it is."""

    class ReduceOp:
        SUM = "sum"

    @staticmethod
    def all_reduce(tensor: torch.Tensor, op: Any = None) -> None:
        return None


class _Accelerator:
    """What precompute_group_info asks of the accelerator, for one process."""

    process_index = 0

    @staticmethod
    def gather(x: torch.Tensor) -> torch.Tensor:
        return x


def read_released(path: Path) -> tuple[str, str]:
    """The training script's text and the commit it comes from."""
    if (path / SCRIPT).is_file():
        rev = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True)
        return (path / SCRIPT).read_text(), rev.stdout.strip() or "a checkout"
    git = ["git", "--git-dir", str(path)]
    text = subprocess.run([*git, "show", f"HEAD:{SCRIPT}"], capture_output=True, text=True, check=True).stdout
    return text, subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def released_step(text: str) -> tuple[dict[str, Any], Any]:
    """The released functions (in a namespace with the stubs) and the training step's lines, compiled."""
    tree = ast.parse(text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    ns: dict[str, Any] = {"torch": torch, "dist": _Dist()}
    for name in ("precompute_group_info", "compute_group_dgpo_loss_allreduce"):
        exec(compile(ast.Module(body=[funcs[name]], type_ignores=[]), SCRIPT, "exec"), ns)
    for node in ast.walk(funcs["main"]):
        if not isinstance(node, ast.With):
            continue
        names = [_assigned(s) for s in node.body]
        if "ref_dgpo_v" in names:
            first = names.index("ref_dgpo_v")
            last = next(i for i, s in enumerate(node.body) if "accelerator.backward" in ast.unparse(s))
            body = node.body[first:last]
            return ns, compile(ast.Module(body=body, type_ignores=[]), SCRIPT, "exec")
    raise SystemExit(f"{SCRIPT}: no training step assigning ref_dgpo_v found")


def _assigned(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def run_released(ns: dict[str, Any], step: Any, x: dict[str, torch.Tensor], case: tuple) -> dict[str, Any]:
    """The released step on one case: its loss, the gradient of the loss with respect to the trained velocity and
    the rows it clipped."""
    _, _, size, beta, clip, kl, ema_ref = case
    model_v = x["model"].clone().requires_grad_(True)
    config = SimpleNamespace(
        use_ema_ref=ema_ref, clip_range=clip, clip_dsm=clip > 0, clip_kl=False,
        train=SimpleNamespace(adv_clip_max=5, beta_dpo=beta, beta=kl),
        sample=SimpleNamespace(num_image_per_prompt=size),
    )  # fmt: skip
    acc = _Accelerator()
    env = dict(ns)
    env.update(
        ref_old_v=x["init"] if ema_ref else x["ref"], old_v=x["old"], model_v=model_v, target_v=x["target"],
        x0=x["target"], sample={"advantages": x["adv"][:, None]}, j=0, config=config, use_old=clip > 0,
        group_info=ns["precompute_group_info"](x["prompt_ids"], acc), accelerator=acc, info=defaultdict(list),
    )  # fmt: skip
    exec(step, env)
    (grad,) = torch.autograd.grad(env["loss"], model_v)
    clipped = env["should_clip"].tolist() if clip > 0 else [False] * len(x["adv"])
    return {"loss": float(env["loss"].detach()), "grad": grad.flatten().tolist(), "clipped": clipped}


def run_ours(x: dict[str, torch.Tensor], case: tuple, loss: str) -> dict[str, Any]:
    """engine/dgpo.py on one case: dgpo_loss (+ train.kl_beta's penalty) and its gradient."""
    _, _, _, beta, clip, kl, ema_ref = case
    v = x["model"].clone().requires_grad_(True)
    init = x["init"] if ema_ref else x["ref"]
    v_ref = x["old"] if ema_ref else x["ref"]
    total = dgpo_loss(
        v, v_ref, x["target"], x["adv"], x["group"], beta=beta, loss=loss, v_old=x["old"], clip_range=clip
    )
    total = total + kl * velocity_penalty(v, init).mean()
    (grad,) = torch.autograd.grad(total, v)
    return {"loss": float(total.detach()), "grad": grad.flatten().tolist()}


def clipped_rows(x: dict[str, torch.Tensor], case: tuple) -> list[bool]:
    """Ours: the rows whose error the clip holds (engine/dgpo.py ppo_clipped)."""
    from treegrpo_cli.engine.dgpo import flow_errors, ppo_clipped

    clip = case[4]
    if clip <= 0:
        return [False] * len(x["adv"])
    err, err_old = flow_errors(x["model"], x["target"]), flow_errors(x["old"], x["target"])
    return ppo_clipped(err, err_old, x["adv"], clip).tolist()


def main(argv: list[str]) -> dict[str, Any]:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    text, commit = read_released(Path(argv[0]))
    ns, step = released_step(text)
    cases, worst = {}, 0.0
    for name, case in CASES.items():
        x = make_inputs(*case[:3])
        theirs, ours = run_released(ns, step, x, case), run_ours(x, case, "code")
        alone = (*case[:5], 0.0, case[6])  # the paper's identity holds for the group loss alone: no penalty
        theirs_alone, paper = run_released(ns, step, x, alone)["grad"], run_ours(x, alone, "paper")
        beta = case[3]
        grads = zip(theirs["grad"], ours["grad"], strict=True)
        diff = max(abs(theirs["loss"] - ours["loss"]), *(abs(a - b) for a, b in grads))
        paper_diff = max(abs(beta * a - b) for a, b in zip(theirs_alone, paper["grad"], strict=True))
        same_clip = theirs["clipped"] == clipped_rows(x, case)
        worst = max(worst, diff, paper_diff / beta)
        cases[name] = {
            "seed": case[0], "groups": case[1], "group_size": case[2], "beta": beta, "clip_range": case[4],
            "kl_beta": case[5], "ema_reference": case[6], "released": theirs, "ours_code": ours,
            "released_without_penalty": {"grad": theirs_alone}, "ours_paper_without_penalty": paper,
            "max_abs_diff": diff,
            "paper_grad_vs_beta_released_max_abs_diff": paper_diff, "same_clipped_rows": same_clip,
            "clipped": sum(theirs["clipped"]),
        }  # fmt: skip
    return {"released": f"Luo-Yihong/DGPO {SCRIPT} at {commit}", "shape": list(SHAPE), "cases": cases,
            "max_abs_diff": worst}  # fmt: skip


if __name__ == "__main__":
    result = main(sys.argv[1:])
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    for name, c in result["cases"].items():
        paper = c["paper_grad_vs_beta_released_max_abs_diff"] / c["beta"]
        print(
            f"{name}: max abs diff {c['max_abs_diff']:.2e}, paper gradient / beta {paper:.2e}, clipped {c['clipped']}"
        )
    print(f"max abs diff {result['max_abs_diff']:.2e} -> {OUT}")

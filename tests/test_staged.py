"""The staged pipeline (rollout -> score -> train --trees) makes exactly one online iteration's update.

The online side is the real Trainer.iteration; its tree, scores, advantages and mask are captured at
the calls it makes, and its weights after the update are compared with the staged checkpoint's.
"""

from pathlib import Path

import pytest
import torch
from clitools import undeclared
from typer.testing import CliRunner

from treegrpo_cli.cli.app import app
from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import grpo_update
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.store.checkpoint import load_checkpoint
from treegrpo_cli.store.shards import ShardStore
from treegrpo_cli.store.trees import open_trees, read_tree_shard, shard_name
from treegrpo_cli.training import overlap, steps
from treegrpo_cli.training.runlog import MetricsRow, read_metrics
from treegrpo_cli.training.trainer import Trainer

runner = CliRunner()
SETS = ['model="pixel-tiny"', "rollout.num_prompts=3", "seed=7"]


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def online(preset: str, iteration: int, monkeypatch, extra: tuple[str, ...] = ()) -> dict:
    """One Trainer.iteration at `iteration` from the initial weights; what it scored, credited and learned."""
    cfg = load_config(preset, sets=[*SETS, *extra])
    seen: dict = {}
    real_score, real_update = overlap.score_leaves, grpo_update

    def score(rewards, images, prompts, *a, **k):
        seen["images"], seen["scores"] = images, real_score(rewards, images, prompts, *a, **k)
        return seen["scores"]

    def update(policy, opt, sde, batch, *a, **k):
        seen["batch"] = batch
        return real_update(policy, opt, sde, batch, *a, **k)

    monkeypatch.setattr(overlap, "score_leaves", score)
    monkeypatch.setattr("treegrpo_cli.engine.grpo.grpo_update", update)
    trainer = Trainer(cfg, "cpu")
    trainer.step = iteration
    seen["row"] = trainer.iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    seen["weights"] = trainer.policy.trainable_state()
    return seen


def staged(preset: str, iteration: int, tmp_path: Path, extra: tuple[str, ...] = ()) -> dict:
    trees, run_dir = tmp_path / "trees", tmp_path / "run"
    sets = [x for s in (*SETS, *extra) for x in ("--set", s)]
    run("rollout", "--preset", preset, *sets, "--iteration", iteration, "--out", trees)
    run("score", trees)
    out = run("train", "--trees", trees, "--run-dir", run_dir, "--json")
    store: ShardStore = open_trees(trees)
    shards = [read_tree_shard(store, n) for n in store.names("trees")]
    assert len(shards) == 1  # one shard: the same node order as the online batch
    rewards = store.read(shard_name("rewards", 0))[0]
    adv = store.read(shard_name("advantages", 0))[0]
    ck = load_checkpoint(Path(__import__("json").loads(out.stdout)["checkpoint"]))
    assert [undeclared(row, MetricsRow) for row in read_metrics(run_dir)] == [[]]  # the staged row, typed too
    return {"tree": shards[0].tree, "images": shards[0].leaf_image, "rewards": rewards, "adv": adv, "weights": ck.model}


DYNAMIC = {  # TreePO's dynamic rollout: the x0-predictions' rewards (a judge in the rollout stage too), or distances
    "reward": ('tree.dynamic="reward"', "tree.stop_tol=0.05"),
    "distance": ('tree.dynamic="distance"', "tree.stop_tol=1.0"),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,iteration,extra",
    [
        ("branch", 0, ()),
        ("tree-grpo", 1, ()),
        ("mix-grpo", 26, ()),
        ("dance-grpo", 2, ()),
        ("branch", 1, DYNAMIC["reward"]),
        ("tree-grpo", 2, DYNAMIC["distance"]),
    ],
)
def test_staged_equals_online(preset, iteration, extra, tmp_path, monkeypatch):
    a = online(preset, iteration, monkeypatch, extra)
    b = staged(preset, iteration, tmp_path, extra)
    if extra:  # the dynamic rollout stopped paths: an irregular tree, and its row says what the stops did
        assert a["row"]["early_stops"] > 0 and {"evals_saved", "flops_saved", "zero_std_ratio"} <= set(a["row"])
    tree = a["batch"].tree
    for name, value in tree.tensors().items():
        torch.testing.assert_close(value, getattr(b["tree"], name), rtol=0, atol=0, equal_nan=True, msg=name)
    assert torch.equal(a["images"], b["images"])
    leaves = tree.leaves()
    assert torch.equal(a["scores"]["jpeg-compressibility"], b["rewards"]["reward/jpeg-compressibility"][leaves])
    assert torch.equal(a["batch"].trained, b["adv"]["trained"])
    torch.testing.assert_close(a["batch"].advantage, b["adv"]["advantage"], rtol=0, atol=0, equal_nan=True)
    assert a["batch"].trained.any()
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), k


@pytest.mark.slow
def test_rollout_honours_the_schedule(tmp_path):
    """mix-grpo's SDE window moves with the iteration; the staged trees follow it."""
    sets = [x for s in SETS for x in ("--set", s)]
    windows = []
    for it in (0, 26):
        out = tmp_path / f"t{it}"
        run("rollout", "--preset", "mix-grpo", *sets, "--iteration", it, "--out", out)
        windows.append(open_trees(out).meta["sde_steps"])
    assert windows[0] != windows[1]
    cfg = load_config("mix-grpo", sets=SETS)
    assert windows == [list(steps.plan_iteration(cfg, 5, it).tree.sde_steps) for it in (0, 26)]


@pytest.mark.slow
def test_score_uses_reward_options_and_refuses_other_keys(tmp_path):
    trees = tmp_path / "trees"
    run(
        "rollout",
        "--preset",
        "branch",
        "--set",
        'model="pixel-tiny"',
        "--set",
        'reward.names=["shapes"]',
        "--set",
        'reward.options=["shapes.kind=soft"]',
        "-n",
        2,
        "--out",
        trees,
    )
    run("score", trees)
    assert open_trees(trees).meta["scoring"]["options"] == ["shapes.kind=soft"]
    r = runner.invoke(app, ["score", str(trees), "--set", "tree.branch=3"])
    assert r.exit_code != 0 and len(r.stderr.strip().splitlines()) == 1 and "tree.branch" in r.stderr, r.output
    r = runner.invoke(app, ["score", str(trees), "--reward-opt", "shapes.kind=bogus"])  # options reach the reward
    assert r.exit_code != 0 and "shapes.kind must be one of" in r.stderr, r.output


@pytest.mark.slow
@pytest.mark.parametrize("preset,iteration", [("nft", 0), ("tree-nft", 3)])
def test_staged_nft_equals_online(preset, iteration, tmp_path):
    """rollout, score, train --trees with train.objective = nft: the trees the online iteration samples (with the
    old policy, at the start the initial weights) and the same weights after its NFT update."""
    sets = [*SETS, "tree.trees_per_prompt=2"] if preset == "nft" else SETS
    cfg = load_config(preset, sets=sets)
    trainer = Trainer(cfg, "cpu")
    trainer.step = iteration
    row = trainer.iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    assert row["optimizer_steps"] == 1 and row["grad_norm"] > 0
    trees, run_dir = tmp_path / "trees", tmp_path / "run"
    args = [x for s in sets for x in ("--set", s)]
    run("rollout", "--preset", preset, *args, "--iteration", iteration, "--out", trees)
    run("score", trees)
    out = __import__("json").loads(run("train", "--trees", trees, "--run-dir", run_dir, "--json").stdout)
    assert [undeclared(row, MetricsRow) for row in read_metrics(run_dir)] == [[]]
    ck = load_checkpoint(Path(out["checkpoint"]))
    assert out["optimizer_steps"] == 1 and ck.old is not None
    for k, v in trainer.policy.trainable_state().items():
        assert torch.equal(v, ck.model[k]), k
        assert torch.equal(trainer.checkpoint({}).old[k], ck.old[k]), k

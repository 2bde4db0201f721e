"""Data-parallel training on the default model (tiny-shapes, a latent DiT), not only the pixel model of
test_distributed.py: two gloo processes match one process over the same global batch, metrics row for row,
for the tree methods and the flat baseline. A process with nothing to train in an optimizer step (its
trees hold none of the step's edges) runs no forward on an empty batch."""

import pytest
import torch
from clitools import close, treegrpo

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import Batch, Parallel, _parent_chunks, grpo_update, make_optimizer
from treegrpo_cli.engine.rollout import rollout
from treegrpo_cli.engine.sde import FlowSDE
from treegrpo_cli.models.registry import load_policy
from treegrpo_cli.training.runlog import read_metrics

SETS = [
    "--set",
    "rollout.num_prompts=4",
    "--set",
    "train.eval_samples=0",
    "--set",
    "train.sample_every=0",
    "--set",
    "train.save_every=3",
    "--seed",
    "5",
]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["branch", "branch-mix", "tree-grpo", "dance-grpo"])
def test_two_processes_match_one_on_the_default_model(preset, tmp_path):
    """Every metrics value within 1e-5 (relative above 1) over 3 iterations; `branch` takes an optimizer
    step every 12 transitions and `tree-grpo` two steps an iteration, so some steps are empty on one rank."""
    args = [*SETS, "--preset", preset, "--iterations", 3]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    rows_two, rows_one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    assert len(rows_one) == 3 and all(r["trained_edges"] > 0 for r in rows_one)
    close(rows_two, rows_one)


# --- the pieces: no forward on an empty batch, and the DiT takes one anyway ------------------------------


def _dit_batch():
    cfg = load_config("branch", sets=["sampler.steps=4", "tree.split_steps=[0, 1]", "rollout.num_prompts=1"])
    policy = load_policy(cfg.model)
    sde = FlowSDE(cfg.sampler)
    tree, _ = rollout(policy, ["a red circle"], [0], sde, cfg.tree, 3)
    trained = tree.parent >= 0
    adv = torch.linspace(-1, 1, tree.num_nodes)
    return cfg, policy, sde, Batch(tree, trained, adv, policy.encode(["a red circle"]))


@pytest.mark.parametrize("sharded", [False, True])
def test_a_rank_with_nothing_to_train_in_a_step_runs_no_empty_forward(sharded):
    """Step 0 holds none of this rank's edges: it runs no chunk (replicated) or only the zero-weight pads that
    keep a sharded model's collectives in step; never the model on zero rows."""
    cfg, policy, sde, b = _dit_batch()
    edges = torch.nonzero(b.trained).flatten()
    rows = []
    real = policy.velocity

    def spy(x, sigma, cond):
        rows.append(len(x))
        return real(x, sigma, cond)

    policy.velocity = spy
    par = Parallel(
        [edges[:0], edges],
        [1.0, float(len(edges))],
        lambda ps: None,
        lambda t: t,
        chunks=[2, 1] if sharded else None,
    )
    opt = make_optimizer(list(policy.trainable_parameters()), cfg.train)
    m = grpo_update(policy, opt, sde, b, cfg.train, torch.Generator().manual_seed(0), parallel=par)
    assert m["optimizer_steps"] == 2 and m["edges"] == len(edges)
    assert 0 not in rows
    assert len(rows) == (3 if sharded else 1)
    if sharded:
        assert m["pad_chunks"] == 2


def test_no_edges_make_no_chunk():
    parent = torch.tensor([-1, 0, 0, 1])
    assert _parent_chunks(parent, torch.zeros(0, dtype=torch.long), 4) == []
    assert [c.tolist() for c in _parent_chunks(parent, torch.tensor([1, 2, 3]), 1)] == [[1, 2], [3]]


def test_the_dit_takes_an_empty_batch():
    policy = load_policy("tiny-shapes")
    x = torch.zeros(0, *policy.latent_shape, requires_grad=True)
    cond = {k: v[:0] for k, v in policy.encode(["a red circle"]).items()}
    v = policy.velocity(x, torch.zeros(0), cond)
    assert v.shape == (0, *policy.latent_shape)
    v.sum().backward()

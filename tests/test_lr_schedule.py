"""The learning-rate schedule ([train] lr_schedule, warmup_iterations, lr_min_ratio) and AdamW's weight decay: the
rate of each iteration against hand-computed values, the decay's effect on the weights, one-line refusals of bad
values, and a scheduled run interrupted and resumed that repeats the uninterrupted one row for row and bitwise."""

import dataclasses

import pytest
import torch
from clitools import one_line_error, run
from test_grpo import scored_batch
from test_resume import TINY, comparable, train

from treegrpo_cli.config import load_config, preset_names
from treegrpo_cli.engine.grpo import TrainConfig, grpo_update, lr_at, make_optimizer, set_lr
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import read_metrics


def rates(its, **keys):
    cfg = TrainConfig(lr=1.0, iterations=10, **keys)
    return [lr_at(cfg, i) for i in its]


def test_constant_and_warmup_golden():
    assert rates([0, 5, 9, 30]) == [1.0, 1.0, 1.0, 1.0]
    # warm-up 4: iteration i < 4 at (i + 1) / 5, then the constant rate
    assert rates(range(7), warmup_iterations=4) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0], rel=1e-12)
    assert lr_at(TrainConfig(lr=3e-4, warmup_iterations=1), 0) == pytest.approx(1.5e-4, rel=1e-12)


def test_linear_golden():
    # 10 iterations, no warm-up: 1 - i / 10; past the end the floor
    assert rates([0, 1, 5, 9, 12], lr_schedule="linear") == pytest.approx([1.0, 0.9, 0.5, 0.1, 0.0], rel=1e-12)
    # warm-up 2 (1/3, 2/3), then 1 - (i - 2) / 8
    got = rates([0, 1, 2, 6, 9], lr_schedule="linear", warmup_iterations=2)
    assert got == pytest.approx([1 / 3, 2 / 3, 1.0, 0.5, 0.125], rel=1e-12)
    # floor 0.2: 0.2 + 0.8 x (1 - 5 / 10)
    assert rates([5, 10], lr_schedule="linear", lr_min_ratio=0.2) == pytest.approx([0.6, 0.2], rel=1e-12)


def test_cosine_golden():
    # (1 + cos(pi i / 10)) / 2: cos(0.2 pi) = 0.80901699437, cos(0.9 pi) = -0.95105651630
    got = rates([0, 2, 5, 9, 11], lr_schedule="cosine")
    assert got == pytest.approx([1.0, 0.904508497187, 0.5, 0.024471741852, 0.0], rel=1e-10, abs=1e-15)
    # warm-up 2, then over 8 iterations: i = 4 is t = 1/4, cos(pi / 4) = 0.70710678119
    got = rates([1, 2, 4, 6], lr_schedule="cosine", warmup_iterations=2)
    assert got == pytest.approx([2 / 3, 1.0, 0.853553390593, 0.5], rel=1e-10)
    # floor 0.1: 0.1 + 0.9 x 0.5
    assert rates([5, 10], lr_schedule="cosine", lr_min_ratio=0.1) == pytest.approx([0.55, 0.1], rel=1e-12)


def test_every_preset_keeps_its_constant_rate_exactly():
    """The defaults leave every preset's run as it was: each iteration's rate is train.lr itself."""
    for preset in preset_names():
        t = load_config(preset).train
        assert (t.lr_schedule, t.warmup_iterations) == ("constant", 0), preset
        assert all(lr_at(t, i) == t.lr for i in range(t.iterations)), preset


@pytest.mark.slow
def test_weight_decay_is_decoupled_and_zero_is_plain_adam():
    """One optimizer step from the same weights and batch: the decayed weights differ from wd = 0 by exactly
    -lr x wd x w0 (AdamW's decoupled decay, at the scheduled rate), and the default path (the rate set by the
    schedule) is bitwise the old one (AdamW left at train.lr)."""
    _, policy, sde, batch, _ = scored_batch("tree-grpo", sets=["train.minibatches=1"])
    w0 = {k: v.clone() for k, v in policy.trainable_state().items()}

    def step(train: TrainConfig, lr: float | None) -> dict[str, torch.Tensor]:
        policy.load_trainable_state({k: v.clone() for k, v in w0.items()})
        opt = make_optimizer(list(policy.trainable_parameters()), train)
        if lr is not None:
            set_lr(opt, lr)
        m = grpo_update(policy, opt, sde, batch, train, torch.Generator().manual_seed(0), max_batch=64)
        assert m["optimizer_steps"] == 1
        return {k: v.clone() for k, v in policy.trainable_state().items()}

    base = load_config("tree-grpo", sets=['model="pixel-tiny"', "train.minibatches=1"]).train
    old = step(base, None)
    new = step(base, lr_at(base, 0))
    assert all(torch.equal(old[k], new[k]) for k in old)
    warm = dataclasses.replace(base, warmup_iterations=1)  # iteration 0 at lr / 2
    plain = step(dataclasses.replace(warm, weight_decay=0.0), lr_at(warm, 0))
    decayed = step(dataclasses.replace(warm, weight_decay=0.5), lr_at(warm, 0))
    assert any(not torch.equal(plain[k], decayed[k]) for k in plain)
    for k in plain:
        expected = -base.lr / 2 * 0.5 * w0[k]
        assert torch.allclose(decayed[k] - plain[k], expected, rtol=1e-3, atol=1e-9), k


BAD = {
    "train.lr_schedule=bogus": "train.lr_schedule must be one of constant, linear, cosine",
    "train.warmup_iterations=-1": "train.warmup_iterations",
    "train.warmup_iterations=1.5": "train.warmup_iterations",
    "train.lr_min_ratio=1.5": "train.lr_min_ratio must be in [0, 1]",
    "train.lr_min_ratio=nan": "train.lr_min_ratio",
    "train.weight_decay=-0.1": "train.weight_decay must be >= 0",
    "train.weight_decay=inf": "train.weight_decay",
}


@pytest.mark.parametrize("item", BAD)
def test_bad_values_are_refused_in_one_line(item, tmp_path):
    r = run("train", "--set", item, "--run-dir", tmp_path / "r")
    assert r.exit_code == 2, r.output
    one_line_error(r, BAD[item])
    assert not (tmp_path / "r").exists()


def test_mistakes_warn():
    said = load_config(sets=["train.lr_min_ratio=0.1"]).warnings()
    assert 'warning: train.lr_min_ratio set, but train.lr_schedule = "constant" ignores it' in said
    said = load_config(sets=["train.warmup_iterations=5", "train.iterations=5"]).warnings()
    assert any("train.warmup_iterations = 5 is not below train.iterations = 5" in w for w in said)
    assert not load_config(sets=['train.lr_schedule="cosine"', "train.lr_min_ratio=0.1"]).warnings()


SCHEDULED = ["--iterations", 4, "--set", "train.keep_last=4", "--set", "train.warmup_iterations=1"]
SCHEDULED += [
    "--set",
    'train.lr_schedule="cosine"',
    "--set",
    "train.lr_min_ratio=0.1",
    "--set",
    "train.weight_decay=0.05",
]


@pytest.mark.slow
def test_a_scheduled_run_interrupted_and_resumed_repeats_the_uninterrupted_one(tmp_path):
    """Warm-up, cosine decay and weight decay over 4 iterations; the second run stops after 2 (a FLOPs budget
    between its 1st and 2nd iteration's totals) and is resumed: the same rows, the same final tensors."""
    train(*TINY, *SCHEDULED, "--run-dir", tmp_path / "a")
    rows = read_metrics(tmp_path / "a")
    # pixel-tiny's lr 3e-4: warm-up 1/2, then 0.1 + 0.9 (1 + cos(pi t)) / 2 at t = 0, 1/3, 2/3
    assert [r["lr"] for r in rows] == pytest.approx([1.5e-4, 3e-4, 2.325e-4, 9.75e-5], rel=1e-12)
    budget = (rows[0]["flops_total"] + rows[1]["flops_total"]) / 2e12  # reached by the 2nd iteration
    train(*TINY, *SCHEDULED, "--set", f"train.max_tflops={budget!r}", "--run-dir", tmp_path / "b")
    assert len(read_metrics(tmp_path / "b")) == 2
    r = train("--resume", tmp_path / "b", "--set", "train.max_tflops=0")
    assert "resuming" in r.stderr and "step-2" in r.stderr
    assert comparable(read_metrics(tmp_path / "b")) == comparable(rows)
    a, b = (load_checkpoint(list_checkpoints(tmp_path / d / "checkpoints")[-1]) for d in ("a", "b"))
    assert a.step == b.step == 4 and a.model.keys() == b.model.keys()
    assert all(torch.equal(a.model[k], b.model[k]) for k in a.model)
    sa, sb = a.optimizer["state"], b.optimizer["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i][n], sb[i][n]) for i in sa for n in sa[i])
    assert a.optimizer["param_groups"] == b.optimizer["param_groups"]

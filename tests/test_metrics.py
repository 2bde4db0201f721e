"""The metrics the field reports, in every metrics row: the share of prompt groups whose rewards all tie and the
spread within groups, clip fractions above and below the band, the ratios' spread, milliseconds per image of
each phase, images per second and model FLOPs utilisation; on hand-made batches."""

import pytest
import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import TrainConfig, _metrics
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.training import overlap
from treegrpo_cli.training.steps import group_spread, throughput
from treegrpo_cli.training.trainer import Trainer


def test_group_spread_by_hand():
    """Groups 0: (1, 1) ties; 1: (0.5, 0.7) std 0.1; 2: (0, 0, 0) ties: 2 of 3 groups tie, mean std 0.1 / 3."""
    total = torch.tensor([1.0, 1.0, 0.5, 0.7, 0.0, 0.0, 0.0])
    group = torch.tensor([4, 4, 9, 9, 2, 2, 2])
    out = group_spread(total, group)
    assert out["zero_std_ratio"] == pytest.approx(2 / 3)
    assert out["tied_leaf_share"] == pytest.approx(5 / 7)  # 2 + 3 of the 7 leaves
    assert out["reward_group_std"] == pytest.approx(0.1 / 3)


def test_clip_fractions_and_ratio_spread_by_hand():
    """clip_range 1e-3: 1.5 is above the band, 0.5 below it, 1.0 and 1.0005 inside."""
    r = torch.tensor([0.5, 1.0, 1.5, 1.0005])
    out = _metrics([r], [torch.zeros(4)], [1.0], [], 4, [r], TrainConfig(clip_range=1e-3))
    assert out["clip_frac_high"] == 0.25 and out["clip_frac_low"] == 0.25 and out["clip_frac"] == 0.5
    assert out["ratio_mean"] == pytest.approx(1.000125) and out["ratio_std"] == pytest.approx(float(r.std()))


def test_throughput_by_hand():
    """8 images; rollout 2 s, scoring 1 s, update 1 s: 250, 125, 125 ms per image, 2 images per second. At a peak
    of 1e12 FLOP/s, 100 rollout evaluations of 10 FLOPs and 50 training rows of 10 + 20 + 10 (one extra forward)."""
    row = {"leaves": 8, "rollout_evals": 100, "train_evals": 50}
    row["seconds"] = {"rollout": 2.0, "score": 1.0, "update": 1.0, "total": 4.0}
    out = throughput(row, (10, 20), 1, 1e12)
    assert out == pytest.approx(
        {
            "ms_per_image/rollout": 250.0,
            "ms_per_image/score": 125.0,
            "ms_per_image/update": 125.0,
            "images_per_second": 2.0,
            "mfu/rollout": 1000 / 2e12,
            "mfu/update": 2000 / 1e12,
        }
    )
    assert "mfu/rollout" not in throughput(row, (10, 20), 1, None)  # no known peak: no utilisation


@pytest.mark.slow
def test_a_batch_where_every_group_ties_has_ratio_1_and_trains_nothing(monkeypatch):
    def tied(rewards, images, prompts, *a, **k):
        return {"shapes": torch.full((images.shape[0],), 0.5)}

    monkeypatch.setattr(overlap, "score_leaves", tied)
    cfg = load_config("tree-grpo", sets=["rollout.num_prompts=2", "train.eval_samples=0"])
    row = Trainer(cfg, "cpu").iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    assert row["zero_std_ratio"] == 1.0 and row["reward_group_std"] == 0.0 and row["trained_edges"] == 0
    assert row["images_per_second"] > 0 and row["ms_per_image/rollout"] > 0
    assert not any(k.startswith("mfu/") for k in row)  # the CPU's peak is not known


@pytest.mark.slow
def test_a_run_writes_the_new_metrics():
    cfg = load_config("tree-grpo", sets=["rollout.num_prompts=2", "train.eval_samples=0"])
    row = Trainer(cfg, "cpu").iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    assert 0 <= row["zero_std_ratio"] < 1 and row["reward_group_std"] > 0
    assert {"clip_frac_high", "clip_frac_low", "ratio_std", "ms_per_image/update"} <= set(row)

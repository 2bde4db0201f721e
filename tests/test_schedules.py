"""SDE window schedules: progressive (MixGRPO), shifting (TreeGRPO code), geometric (TreeGRPO paper)."""

from __future__ import annotations

import math

import pytest
import torch

from treegrpo_cli.engine.rollout import TreeConfig
from treegrpo_cli.engine.schedules import ScheduleConfig, geometric_probs, tree_for_iteration, window_start
from treegrpo_cli.errors import ConfigError


def starts(cfg, steps, iterations, seed=0, decode="x0"):
    return [window_start(cfg, steps, it, seed, decode) for it in iterations]


def test_progressive_moves_every_tau_and_rolls_back():
    cfg = ScheduleConfig(kind="progressive", window=2, every=3, max_step=6)  # starts 0..4
    got = starts(cfg, 10, range(18))
    assert got == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3 + [0] * 3


def test_progressive_clamps_without_roll_back():
    cfg = ScheduleConfig(kind="progressive", window=2, every=3, max_step=6, roll_back=False)
    assert starts(cfg, 10, [0, 3, 12, 15, 300]) == [0, 1, 4, 4, 4]


def test_progressive_start_and_stride():
    cfg = ScheduleConfig(kind="progressive", window=2, start=2, stride=2, every=1, max_step=9)  # starts 2..7
    assert starts(cfg, 10, range(5)) == [2, 4, 6, 2, 4]


def test_progressive_default_max_step_depends_on_decode():
    cfg = ScheduleConfig(kind="progressive", window=2, every=1, roll_back=False)
    assert window_start(cfg, 10, 100, 0, "x0") == 7  # window {7, 8}: never the last step
    assert window_start(cfg, 10, 100, 0, "final") == 8  # window {8, 9}


def test_mixgrpo_window_never_reaches_max_step():
    cfg = ScheduleConfig(kind="progressive", window=4, every=25, max_step=23)
    tree = TreeConfig(split_steps=(0,), branch=12)
    seen = set()
    for it in range(0, 1200, 5):
        t = tree_for_iteration(tree, cfg, 25, it, seed=0)
        assert max(t.sde_steps) < 23 and len(t.sde_steps) == 4
        seen.add(t.sde_steps[0])
    assert seen == set(range(20))  # every start 0..19 is used, then it rolls back


def test_shifting_clamps_before_last_step():
    cfg = ScheduleConfig(kind="shifting", window=4, every=50)
    got = starts(cfg, 10, [0, 49, 50, 100, 250, 10_000])
    assert got == [0, 0, 1, 2, 5, 5]
    assert max(got) + 4 - 1 == 8  # never the last step 9


def test_static_is_unchanged():
    tree = TreeConfig(split_steps=(0, 3, 6, 9), sde_steps=(0, 1, 2, 3))
    assert tree_for_iteration(tree, ScheduleConfig(), 20, 123, seed=1) is tree


def test_geometric_probs_match_formula():
    T, w, r = 10, 3, 0.5
    p = geometric_probs(T, w, r)
    assert p.shape == (T - w,)
    assert math.isclose(float(p.sum()), 1.0, abs_tol=1e-12)
    for i in range(T - w):
        assert math.isclose(float(p[i]), (1 - r) * r**i / (1 - r ** (T - w)), rel_tol=1e-12)
    assert torch.allclose(geometric_probs(10, 4, 1.0), torch.full((6,), 1 / 6, dtype=torch.float64))


@pytest.mark.slow
def test_geometric_empirical_frequencies():
    T, w, n = 10, 3, 4000
    cfg = ScheduleConfig(kind="geometric", window=w, r=0.5)
    counts = torch.bincount(torch.tensor(starts(cfg, T, range(n), seed=7)), minlength=T - w)
    assert counts.numel() == T - w  # no draw outside {0, ..., T - w - 1}
    p = geometric_probs(T, w, 0.5)
    sd = torch.sqrt(n * p * (1 - p))
    assert torch.all((counts.double() - n * p).abs() <= 5 * sd + 1)


def test_geometric_is_reproducible_and_ignores_global_rng():
    cfg = ScheduleConfig(kind="geometric", window=3, r=0.7)
    a = starts(cfg, 10, range(50), seed=3)
    torch.manual_seed(999)
    torch.rand(10)
    assert starts(cfg, 10, range(50), seed=3) == a
    assert starts(cfg, 10, range(50), seed=4) != a
    assert len(set(a)) > 1


@pytest.mark.parametrize("kind", ["progressive", "shifting", "geometric"])
@pytest.mark.parametrize("decode", ["x0", "final"])
def test_split_first_and_all_are_valid(kind, decode):
    T = 10
    tree = TreeConfig(split_steps=(0,), branch=2)
    for split in ("first", "all"):
        cfg = ScheduleConfig(kind=kind, window=3, every=2, split=split)
        for it in range(60):
            t = tree_for_iteration(tree, cfg, T, it, seed=11, decode=decode)
            t.validate(T, decode)
            s = window_start(cfg, T, it, 11, decode)
            assert t.sde_steps == (s, s + 1, s + 2)
            assert t.split_steps == ((s,) if split == "first" else t.sde_steps)
            assert t.branch == 2 and all(t.is_sde(i) == (i in t.sde_steps) for i in range(T))


def test_split_none_keeps_split_steps():
    tree = TreeConfig(split_steps=(0, 3), branch=2)
    cfg = ScheduleConfig(kind="progressive", window=4, every=1)
    t = tree_for_iteration(tree, cfg, 20, 5, seed=0)
    assert t.split_steps == (0, 3) and t.sde_steps == (5, 6, 7, 8)


@pytest.mark.parametrize("kind", ["geometric", "shifting"])
def test_treegrpo_preset_has_27_leaves(kind):
    tree = TreeConfig(branch=3, branch_s=math.inf)
    cfg = ScheduleConfig(kind=kind, window=3, every=50, split="all")
    for it in range(0, 400, 3):
        t = tree_for_iteration(tree, cfg, 10, it, seed=0)
        assert t.leaves(10) == 27 and len(t.split_steps) == 3 and 9 not in t.split_steps


@pytest.mark.parametrize(
    "kw, key",
    [
        (dict(kind="random"), "schedule.kind"),
        (dict(kind="progressive", split="some"), "schedule.split"),
        (dict(kind="progressive", window=0), "schedule.window"),
        (dict(kind="progressive", window=11), "schedule.window"),
        (dict(kind="geometric", r=0.0), "schedule.r"),
        (dict(kind="geometric", r=1.5), "schedule.r"),
        (dict(kind="progressive", every=0), "schedule.every"),
        (dict(kind="progressive", start=-1), "schedule.start"),
        (dict(kind="progressive", max_step=11), "schedule.max_step"),
        (dict(kind="progressive", window=4, start=7), "schedule.start"),
        (dict(kind="shifting", window=10), "schedule.start"),
        (dict(kind="geometric", window=10), "schedule.window"),
        (dict(split="all"), "schedule.split"),
        (dict(kind="progressive", max_step=10, split="all"), "schedule.split"),
    ],
)
def test_validate_names_the_key(kw, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        ScheduleConfig(**kw).validate(10)
    assert "\n" not in str(e.value)


def test_validate_accepts_defaults_and_final_decode_at_the_end():
    ScheduleConfig().validate(2)  # static ignores the window
    ScheduleConfig(kind="progressive", max_step=10, split="all").validate(10, "final")

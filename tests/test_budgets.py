"""Per-prompt leaf budgets (engine/budgets.py) and split steps that move with training (engine/splits.py): the
estimator by hand, the allocation's cap, the replacement rule, TMPO's schedules, and exact resume of a run that
plans from them."""

import dataclasses
import json
import math

import pytest
import torch
from clitools import run

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.budgets import BudgetConfig, PromptStats, allocate, replace_tied
from treegrpo_cli.engine.dynamic import Shape, tree_evals
from treegrpo_cli.engine.splits import SplitConfig, adaptive_steps, densest_steps, progress_steps
from treegrpo_cli.errors import ConfigError, TreegrpoError
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training import steps
from treegrpo_cli.training.runlog import read_metrics, without_timings

SPREAD = BudgetConfig(mode="spread", floor=0.0, min_width=2, max_width=32)


def _stats(**spread: float) -> PromptStats:
    s = PromptStats()
    s.spread = {int(k[1:]): v for k, v in spread.items()}
    return s


# --- the estimator ---------------------------------------------------------------------------------------------


def test_the_estimates_by_hand():
    s = PromptStats(decay=0.5, bounds_decay=0.9)
    s.update(torch.tensor([3, 3, 3, 3, 5, 5]), torch.tensor([0.0, 1.0, 0.0, 1.0, 0.4, 0.4], dtype=torch.float64))
    # prompt 3: four squared deviations of 0.25 over 4 - 1 (Bessel): variance 1/3
    assert s.spread == {3: pytest.approx(math.sqrt(1 / 3)), 5: 0.0} and s.mean == {3: 0.5, 5: 0.4}
    assert s.ties == {3: 0, 5: 1} and (s.low, s.high) == (0.0, 1.0)
    s.update(torch.tensor([3, 3, 5, 5]), torch.tensor([1.0, 1.0, 0.2, 0.6], dtype=torch.float64))
    # the variances average: prompt 3 (1/3 + 0) / 2; prompt 5 (0 + (0.04 + 0.04) / 1) / 2 = 0.04
    assert s.spread == {3: pytest.approx(math.sqrt(1 / 6)), 5: pytest.approx(0.2)}
    assert s.mean == {3: 0.75, 5: pytest.approx(0.4)}
    assert s.ties == {3: 1, 5: 0}
    assert s.low == pytest.approx(0.9 * 0.0 + 0.1 * 0.2) and s.high == pytest.approx(1.0)
    s.update(torch.tensor([3, 3]), torch.tensor([1.0, 1.0]), skipped=[5])
    assert s.ties == {3: 2, 5: 0}  # a skipped prompt rests (never below 0)
    back = PromptStats.from_json(json.loads(json.dumps(s.to_json())))
    assert back == s  # exact: JSON keeps every float's bits


def test_the_spread_does_not_depend_on_the_leaves_a_prompt_was_given():
    # two prompts equally spread, the first given one leaf and the second three (rewards 0, 1, 2: variance 1):
    # one leaf shows no spread, so both keep spread 1 and share the next iteration's leaves evenly. Read as a
    # population std, the single leaf was a spread of 0 and a tie (0.5 and 0.91 after the draw: 11 and 21 of 32
    # leaves), and each later single-leaf draw halved it again
    s = PromptStats(decay=0.5)
    s.spread, s.mean, s.ties = {0: 1.0, 1: 1.0}, {0: 0.5, 1: 0.5}, {0: 0, 1: 0}
    s.update(torch.tensor([0, 1, 1, 1]), torch.tensor([0.7, 0.0, 1.0, 2.0], dtype=torch.float64))
    assert s.spread == {0: 1.0, 1: 1.0} and s.ties == {0: 0, 1: 0} and s.mean == {0: 0.5, 1: 0.75}
    assert allocate(SPREAD, s, [0, 1], 16) == [16, 16]
    # two leaves are an unbiased variance too, (0 - 1)^2 + (2 - 1)^2 over 2 - 1 = 2, not a population std of 1
    s.update(torch.tensor([0, 0]), torch.tensor([0.0, 2.0], dtype=torch.float64))
    assert s.spread[0] == pytest.approx(math.sqrt((1.0 + 2.0) / 2))


def test_a_checkpoint_keeps_the_order_the_prompts_were_drawn_in():
    # the mean spread a never-drawn prompt takes is a float sum in the estimates' order: sorted on the way back
    # from a checkpoint, it moved in the last bit and, here, a leaf between prompts 191 and 301 (resume != run)
    live = PromptStats()
    live.spread = {191: 0.075, 12: 0.1, 13: 0.05}  # prompt 191 drawn at an earlier iteration than 12 and 13
    live.mean = dict(live.spread)
    back = PromptStats.from_json(json.loads(json.dumps(live.to_json())))
    assert list(back.spread) == [191, 12, 13]
    cfg = BudgetConfig(mode="spread", min_width=2, max_width=32)
    ids = [191, 12, 300, 301, 191, 12]  # 300 and 301 never drawn
    assert allocate(cfg, back, ids, 16) == allocate(cfg, live, ids, 16) == [15, 19, 15, 14, 14, 19]


def test_damaged_estimates_are_one_line():
    with pytest.raises(ConfigError, match="prompt statistics in the checkpoint are damaged"):
        PromptStats.from_json({"decay": 0.5})


# --- allocation -----------------------------------------------------------------------------------------------


def test_no_estimates_gives_every_prompt_the_tree():
    assert allocate(SPREAD, None, [1, 2, 3], 16) == [16, 16, 16]
    assert allocate(SPREAD, PromptStats(), [1, 2, 3], 16) == [16, 16, 16]
    assert allocate(BudgetConfig(), _stats(p1=0.3, p2=0.1), [1, 2], 16) == [16, 16]  # mode off


def test_leaves_follow_the_spread_by_hand():
    # B = 3 x 16 = 48 over weights 0.3, 0.1, 0.2: 24, 8, 16
    assert allocate(SPREAD, _stats(p1=0.3, p2=0.1, p3=0.2), [1, 2, 3], 16) == [24, 8, 16]
    # a tied prompt gets the floor: weights 0.4, 0.04 (0.1 x mean 0.2... of 0.4, 0.0 -> mean 0.2 -> floor 0.02)
    cfg = BudgetConfig(mode="spread", floor=0.1, min_width=2, max_width=32)
    assert allocate(cfg, _stats(p1=0.4, p2=0.0), [1, 2], 16) == [30, 2]  # 32 x 0.4 / 0.42 = 30.5 -> 30, then 2
    # the most per tree binds: the rest spreads over the others
    assert allocate(
        BudgetConfig(mode="spread", floor=0.0, max_width=20), _stats(p1=1.0, p2=0.1, p3=0.1), [1, 2, 3], 16
    ) == [
        20,
        14,
        14,
    ]
    # a prompt never drawn takes the mean estimate of those that were: (0.3 + 0.1) / 2 = 0.2
    assert allocate(SPREAD, _stats(p1=0.3, p2=0.1), [1, 9], 10) == [12, 8]


def test_the_budget_never_exceeds_its_cap():
    g = torch.Generator().manual_seed(3)
    for _ in range(300):
        n, w = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 40, (1,), generator=g))
        lo, hi = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(0, 80, (1,), generator=g))
        cfg = BudgetConfig(
            mode="spread", floor=float(torch.rand(1, generator=g)), min_width=lo, max_width=max(hi, lo, w) if hi else 0
        )
        spread = (torch.rand(n, generator=g) * (torch.rand(n, generator=g) > 0.3)).tolist()
        stats = PromptStats(spread=dict(enumerate(spread)))
        out = allocate(cfg, stats, list(range(n)), w)
        fewest, most = cfg.bounds(w)
        assert sum(out) <= n * w and all(fewest <= x <= most for x in out), (cfg, spread, w, out)
        if n * fewest <= n * w <= n * most:
            assert sum(out) == n * w


def test_tied_prompts_are_replaced_by_the_next_of_the_draw():
    s = PromptStats(ties={4: 2, 7: 1, 1: 0})
    assert replace_tied([4, 7, 2], [4, 7, 2, 1, 9, 3], s, 2) == ([1, 7, 2], [4])
    assert replace_tied([4, 7, 2], [4, 7, 2, 1, 9, 3], s, 1) == ([1, 9, 2], [4, 7])
    assert replace_tied([4, 7, 2], [4, 7, 2], s, 1) == ([4, 7, 2], [])  # nothing left to draw: kept
    assert replace_tied([4, 7], [4, 7, 1], s, 0) == ([4, 7], [])  # off


# --- split steps that move with training ------------------------------------------------------------------------


def test_progress_moves_the_splits_from_early_to_late():
    cfg = SplitConfig(kind="progress", early=(1, 2, 3), late=(1, 3, 5), min_gap=1, tail_guard=0)  # TMPO's FLUX config
    assert progress_steps(cfg, 6, "final", 0, 100, 0) == (1, 2, 3)
    assert progress_steps(cfg, 6, "final", 50, 100, 0) == (1, 2, 4)  # 1, 2.5 -> 2, 4
    assert progress_steps(cfg, 6, "final", 100, 100, 0) == progress_steps(cfg, 6, "final", 500, 100, 0) == (1, 3, 5)
    assert progress_steps(cfg, 6, "x0", 100, 100, 0) == (1, 3, 4)  # never the last step when the x0 is decoded
    over = SplitConfig(kind="progress", early=(0, 3, 6, 9), late=(0, 4, 8, 12), over=10)
    assert progress_steps(over, 20, "x0", 5, 300, 0) == (0, 4, 7, 10)  # 0, 3.5, 7, 10.5: round half to even
    jitter = SplitConfig(kind="progress", early=(0, 3, 6, 9), late=(0, 4, 8, 12), kappa=6.0)
    draws = {progress_steps(jitter, 20, "x0", it, 100, 7) for it in range(30)}
    assert len(draws) > 5 and progress_steps(jitter, 20, "x0", 3, 100, 7) == progress_steps(jitter, 20, "x0", 3, 100, 7)
    assert all(len(d) == 4 and all(b > a for a, b in zip(d, d[1:], strict=False)) and d[-1] <= 18 for d in draws)


def test_adaptive_moves_a_low_reward_prompt_earlier_or_later():
    s = PromptStats(mean={1: 0.1, 2: 0.9}, low=0.0, high=1.0)
    early = SplitConfig(kind="adaptive", kappa=8.0, low_reward="earlier")
    late = SplitConfig(kind="adaptive", kappa=8.0, low_reward="later")
    base = (0, 3, 6, 9)

    def mean_first(cfg, pid):
        return (
            sum(
                sum(adaptive_steps(cfg, base, steps=20, decode="x0", it=it, seed=0, prompt_id=pid, stats=s))
                for it in range(200)
            )
            / 200
        )

    assert mean_first(early, 1) < mean_first(early, 2) and mean_first(late, 1) > mean_first(late, 2)
    assert (
        adaptive_steps(early, base, steps=20, decode="x0", it=0, seed=0, prompt_id=99, stats=s) == base
    )  # never drawn: the tree's own steps
    assert adaptive_steps(early, base, steps=20, decode="x0", it=0, seed=0, prompt_id=1, stats=None) == base


def test_no_draw_splits_earlier_than_the_densest_steps():
    """The bound tree.max_evals is checked against: every draw of 300 iterations (and 40 prompts) costs at most the
    forwards of densest_steps' tree, and a draw reaches it where it can be expected to."""
    s = PromptStats(mean={p: p / 40 for p in range(40)}, low=0.0, high=1.0)
    base = (2, 5, 8, 11)
    for cfg, tight in (
        (SplitConfig(kind="progress", early=(0, 3, 6, 9), late=(0, 5, 10, 15), over=200), True),  # its early steps
        (SplitConfig(kind="progress", early=(4, 5, 6, 9), late=(0, 3, 10, 15), over=200), False),  # pairs that cross
        (SplitConfig(kind="progress", early=(0, 3, 6, 9), late=(0, 5, 10, 15), kappa=0.5, min_gap=2), True),
        (SplitConfig(kind="adaptive", kappa=0.3), True),
        (SplitConfig(kind="adaptive", kappa=8.0, min_gap=2), False),  # packed draws: possible, rare
    ):
        dense = densest_steps(cfg, base)
        bound = tree_evals(Shape(dense, 16), 20, 2)
        if cfg.kind == "progress":
            draws = {progress_steps(cfg, 20, "x0", it, 300, 0) for it in range(300)}
        else:
            draws = {
                adaptive_steps(cfg, base, steps=20, decode="x0", it=it, seed=0, prompt_id=p, stats=s)
                for it in range(30)
                for p in range(40)
            }
        costs = [tree_evals(Shape(d, 16), 20, 2) for d in draws]
        assert max(costs) <= bound, (cfg, dense, max(costs))
        assert max(costs) == bound or not tight, (cfg, dense)


def test_bad_split_and_budget_settings_are_one_line_errors():
    for sets, needle in (
        (['splits.kind="sometimes"'], "splits.kind must be one of"),
        (['splits.kind="progress"', "splits.early=[0, 3]", "splits.late=[0]"], "the same number"),
        (['splits.kind="progress"', "splits.early=[0, 3]", "splits.late=[0, 19]"], "split at the last step"),
        (['splits.kind="adaptive"', 'schedule.kind="progressive"', 'schedule.split="first"'], "both set the split"),
        (['budget.mode="always"'], "budget.mode must be one of"),
        (["budget.decay=1.0"], "budget.decay"),
        (["budget.min_width=4", "budget.max_width=3"], "below budget.min_width"),
        (['budget.mode="spread"', "budget.max_width=8"], "below the tree's 16 leaves"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_config("branch-mix-flow", sets=sets)
    with pytest.raises(ConfigError, match="no split steps"):
        load_config("flow-grpo", sets=['budget.mode="spread"'])


def test_a_cap_on_forwards_must_hold_the_costliest_tree_the_plans_may_make():
    # budget up to 32 leaves on 0, 3, 6, 9 of 20: 4 children at step 0, 1 + 4*3 + 8*3 + 16*3 + 32*10 = 405 forwards
    # (before, a config with a lower cap validated and stopped the run at the first iteration that planned it)
    with pytest.raises(ConfigError, match="below the 405 forwards of the largest tree"):
        load_config("branch-mix-flow", sets=['budget.mode="spread"', "tree.max_evals=404"])
    load_config("branch-mix-flow", sets=['budget.mode="spread"', "tree.max_evals=405"])
    # adaptive splits may go to 0, 1, 2, 3: 1 + 2 + 4 + 8 + 16*16 = 271
    with pytest.raises(ConfigError, match="below the 271 forwards"):
        load_config("branch-mix-flow", sets=['splits.kind="adaptive"', "tree.max_evals=270"])


def test_the_node_count_checked_is_that_of_the_densest_tree_the_splits_may_draw():
    # branch-late splits at 9, 12, 15, 18 of 20; adaptive draws never go before its first split, so they pack at
    # 9, 10, 11, 12: 10 forwards before them, 2 + 4 + 8, 16 paths on 13-19 (112), and 16 leaves = 152 nodes (not the
    # 271 + 16 of splits at 0, 1, 2, 3); progress splits pack from 0: 1 + 2 + 4 + 8 + 16*16 + 16 = 287
    late = load_config("branch-late", sets=['splits.kind="adaptive"'])
    assert late.rollout_nodes(1) == (152, 152)
    moving = ['splits.kind="progress"', "splits.early=[0,3,6,9]", "splits.late=[0,5,10,15]", "splits.kappa=2"]
    assert load_config("branch-late", sets=moving).rollout_nodes(1) == (287, 287)


def _most_nodes(f: dict[int, int], trees: int, leaves: int) -> int:
    """The most nodes `trees` trees of widths in f hold with at most `leaves` leaves in all (a knapsack)."""
    best = {0: 0}  # leaves used -> most nodes
    for _ in range(trees):
        step: dict[int, int] = {}
        for u, v in best.items():
            for b, n in f.items():
                if u + b <= leaves:
                    step[u + b] = max(step.get(u + b, -1), v + n)
        best = step
    return max(best.values())


def test_a_budget_counts_the_nodes_its_leaf_total_allows_not_every_tree_at_the_widest():
    # branch-mix-flow with budgets: 16 leaves a tree on average, 2 to 32 a tree, splits at 0, 3, 6, 9 of 20.
    # Nodes of a tree of b leaves: f(8) = 1 + 2*3 + 4*3 + 8*13 + 8 = 131; f(25) = 1 + 4*3 + 8*3 + 16*3 + 25*10 + 25
    # = 360 (children 7, 6, 6, 6 at step 0); f(32) = 437. 17 trees with 272 leaves: 9 at 8 and 8 at 25 hold
    # 4059 nodes, the most of any allocation; the bound is 4059 / 17 = 238.8 a tree, not 437
    cfg = load_config("branch-mix-flow", sets=['budget.mode="spread"'])
    tree = cfg.largest_tree()
    f = {b: dataclasses.replace(tree, width=b).model_evals(20) + b for b in range(2, 33)}
    assert (f[8], f[25], f[32]) == (131, 360, 437)
    assert _most_nodes(f, 17, 17 * 16) == 4059 == 9 * 131 + 8 * 360
    assert cfg.rollout_nodes(17) == (17 * 239, 239)
    for trees in range(1, 7):  # a bound for any number of trees
        assert _most_nodes(f, trees, 16 * trees) <= 239 * trees


def test_a_staged_rollout_cannot_plan_a_later_iteration_from_estimates_it_does_not_have():
    cfg = load_config("branch-mix-flow", sets=['budget.mode="spread"'])
    assert steps.plan_iteration(cfg, 20, 0).shapes is not None
    with pytest.raises(TreegrpoError, match="depends on the rewards of the iterations before it"):
        steps.plan_iteration(cfg, 20, 3)


# --- a run that plans from its estimates -----------------------------------------------------------------------


def _train(tmp_path, name, iterations, *extra):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\ntwo blue squares\na green triangle\n")
    sets = [
        'model="pixel-tiny"',
        f'rollout.prompts="{prompts}"',
        "rollout.num_prompts=2",
        'budget.mode="spread"',
        "budget.replace_after=1",
        'splits.kind="adaptive"',
        "splits.kappa=4.0",
        "train.save_every=1",
        "train.sample_every=0",
        "train.eval_samples=0",
    ]
    args = ["--preset", "branch", *(x for s in sets for x in ("--set", s)), "--iterations", iterations, *extra]
    r = run("train", *args, "--run-dir", tmp_path / name)
    assert r.exit_code == 0, r.output


@pytest.mark.slow
def test_a_resumed_run_plans_as_the_uninterrupted_one(tmp_path):
    _train(tmp_path, "a", 5)
    _train(tmp_path, "b", 2)
    ck = load_checkpoint(list_checkpoints(tmp_path / "b" / "checkpoints")[-1])
    assert ck.state["prompt_stats"]["prompts"]  # the estimates are in the checkpoint
    r = run("train", "--resume", tmp_path / "b", "--iterations", 5)
    assert r.exit_code == 0, r.output
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert without_timings(b) == without_timings(a)
    uniform = load_config("branch").tree.model_evals(20) * 2
    assert any(row["rollout_evals"] != uniform for row in a[1:])  # the estimates did change the trees

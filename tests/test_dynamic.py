"""TreePO's dynamic rollout and leaf budgets (engine/dynamic.py): the closed-form counts, the split plans (transfer,
fallback, cap), the tie heuristic, rollouts that keep their caps and repeat bit for bit, and every advantage
estimator on the irregular trees they make, against hand-computed values."""

import math
import random

import pytest
import torch

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.advantages import ESTIMATORS, AdvantageConfig, estimate
from treegrpo_cli.engine.credit import assign_credit
from treegrpo_cli.engine.dynamic import (
    Shape,
    children,
    distance_values,
    plan_split,
    share,
    subtree_evals,
    tie_leaders,
    tie_verdicts,
    tree_evals,
)
from treegrpo_cli.engine.pruning import PruneConfig
from treegrpo_cli.engine.rollout import rollout
from treegrpo_cli.engine.sde import make_kernel
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.models.pixel import PixelConfig, PixelPolicy

PROMPTS = ["a red circle", "two blue squares", "a green triangle"]
MIX = ['model="pixel-tiny"']
TOL = 1.0  # x0-prediction RMS distances of this policy's siblings lie around 0.7-1.4: some stop, some branch


@pytest.fixture
def policy():
    """The tiny pixel policy from fixed weights: which x0-predictions tie must not depend on the test order."""
    torch.manual_seed(0)
    return PixelPolicy(PixelConfig(image_size=8, width=8, blocks=1, text_dim=16), name="pixel-test")


def _roll(policy, sets=(), seed=7, judge=None, shapes=None, preset="branch-mix-flow"):
    cfg = load_config(preset, sets=[*MIX, *sets])
    stats: dict = {}
    tree, nfe = rollout(
        policy, PROMPTS, [0, 1, 2], make_kernel(policy, cfg.sampler), cfg.tree, seed,
        shapes=shapes, judge=judge, stats=stats,
    )  # fmt: skip
    return cfg, tree, nfe, stats


def _forwards_and_leaves(tree, steps):
    """Per tree: forwards (one per node above the last depth) and leaves."""
    return (
        torch.bincount(tree.tree[tree.depth < steps], minlength=tree.num_trees).tolist(),
        torch.bincount(tree.tree[tree.leaves()], minlength=tree.num_trees).tolist(),
    )


# --- closed forms --------------------------------------------------------------------------------------------


def test_budget_of_the_fixed_tree_gives_the_fixed_tree():
    assert [children(b, 2, later) for b, later in ((16, 3), (8, 2), (4, 1), (2, 0))] == [2, 2, 2, 2]
    assert children(3, 2, 1) == 2 and children(9, 2, 1) == 5 and children(5, 2, 0) == 5 and children(1, 2, 3) == 1
    assert share(7, 3) == [3, 2, 2] and share(4, 4) == [1, 1, 1, 1]
    assert tree_evals(Shape((0, 3, 6, 9), 16), 20, 2) == 203  # the dense BranchGRPO tree: 1 + 3*2 + 3*4 + 3*8 + 10*16
    assert tree_evals(Shape((0, 1, 2), 27), 10, 3) == 202  # TreeGRPO's k = 3 window: 1 + 3 + 9 + 27*7
    assert tree_evals(Shape((0,), 12), 16, 12) == 1 + 12 * 15  # DanceGRPO's flat group
    assert tree_evals(Shape((), 1), 10, 2) == 10  # a chain
    for name in ("branch", "branch-mix-flow", "tree-grpo", "dance-grpo", "treepo"):
        cfg = load_config(name)
        assert tree_evals(cfg.tree.shape(cfg.sampler.steps), cfg.sampler.steps, cfg.tree.branch) == (
            cfg.tree.model_evals(cfg.sampler.steps)
        ), name


def test_an_irregular_width_by_hand():
    # width 10 on splits 0, 3, 6, 9 of 20, K = 2: root (1 forward at step 0) -> 5, 5; each 5 -> 3, 2 at step 3;
    # 3 -> 2, 1 and 2 -> 1, 1 at step 6; then every budget-2 node splits in two at step 9, budget-1 nodes go on
    # depths 1-3: 2 nodes x 3 steps; 4-6: 4 x 3; 7-9: 8 x 3; 10-19: 10 leaves' chains x 10
    assert tree_evals(Shape((0, 3, 6, 9), 10), 20, 2) == 1 + 2 * 3 + 4 * 3 + 8 * 3 + 10 * 10
    # a stopped node (budget 1) at split index 1 costs its chain: steps 4..19
    assert subtree_evals(1, 1, (0, 3, 6, 9), 20, 2) == 16


# --- one split's plan ---------------------------------------------------------------------------------------


def _cost(b):  # the last split of 20 steps at step 9: every leaf's chain of 10 forwards
    return subtree_evals(b, 3, (0, 3, 6, 9), 20, 2)


def test_stopped_paths_hand_their_budget_to_the_active_ones_evenly():
    p = plan_split([2, 2, 2, 2], [False, True, True, False], cost=_cost, branch=2, later=0, room=80)
    assert p.budget == [3, 1, 1, 3] and p.counts == [3, 1, 1, 3] and p.stopped == 2 and not p.fallback
    odd = plan_split([2, 2, 2], [False, True, False], cost=_cost, branch=2, later=0, room=60)
    assert odd.budget == [3, 1, 2]  # the first active node takes the odd unit (TreePO's fixed_avg)


def test_no_transfer_drops_the_spare_budget_and_fallback_keeps_the_width():
    p = plan_split([2, 2, 2, 2], [False, True, True, False], cost=_cost, branch=2, later=0, room=80, transfer=False)
    assert p.budget == [2, 1, 1, 2] and sum(p.counts) == 6
    everyone = plan_split([2, 2], [True, True], cost=_cost, branch=2, later=0, room=40)
    assert everyone.fallback and everyone.budget == [3, 1]  # the first stopped node is re-activated: 4 leaves
    none = plan_split([2, 2], [True, True], cost=_cost, branch=2, later=0, room=40, fallback=False)
    assert not none.fallback and none.budget == [1, 1]


def test_the_cap_takes_back_the_last_given_units_first():
    # at split index 1 of (0, 3, 6, 9), budgets 4 and 4; the second stops: its 3 spare units go to the first
    cost = lambda b: subtree_evals(b, 1, (0, 3, 6, 9), 20, 2)  # noqa: E731
    loose = plan_split([4, 4], [False, True], cost=cost, branch=2, later=2, room=10_000)
    assert loose.budget == [7, 1] and loose.taken_back == 0
    need = cost(7) + cost(1)
    tight = plan_split([4, 4], [False, True], cost=cost, branch=2, later=2, room=need - 1)
    assert tight.budget == [6, 1] and tight.taken_back == 1 and cost(6) + cost(1) <= need - 1
    assert plan_split([4, 4], [False, False], cost=cost, branch=2, later=2, room=2 * cost(4)).budget == [4, 4]


def test_a_predicted_tie_gets_no_budget_whatever_its_own():
    # node 1 (budget 1) ties node 0 as node 2 does: node 2's two spare units go to node 0 alone, not to node 1
    p = plan_split([2, 1, 3], [False, True, True], cost=_cost, branch=2, later=0, room=10_000)
    assert p.budget == [4, 1, 1] and p.out == [False, True, True] and p.stopped == 1
    # a frontier that is one cluster led by a budget-1 node: the fallback re-activates the first node with budget
    one = plan_split([1, 4], [True, True], cost=_cost, branch=2, later=0, room=10_000)
    assert one.budget == [1, 4] and one.fallback and one.out == [True, False]


def test_a_stopped_path_never_branches_again(policy):
    # one tree (splits 0, 3, 6, 9 of 20, 16 leaves); a judge that answers by position: at step 3 both nodes tie
    # (one cluster: the fallback keeps the first, the second goes on as a chain); at step 6 the first node's
    # children 2 and 3 tie child 1 and child 4 differs: their spare budget goes to children 1 and 4, never to the
    # chain (before: scored 2, it counted as active and branched again)
    script = iter([[0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 2.0], [float(i) for i in range(32)]])
    calls = []

    def judge(x0, prompts):
        calls.append(len(x0))
        return torch.tensor(next(script)[: len(x0)])

    cfg = load_config("branch-mix-flow", sets=[*MIX, 'tree.dynamic="reward"'])
    tree, _ = rollout(policy, PROMPTS[:1], [0], make_kernel(policy, cfg.sampler), cfg.tree, 7, judge=judge)
    leaves = tree.leaves()
    under = [n for n in leaves.tolist() if _ancestor(tree, n, 3) == 6]  # node 6: the second node at depth 3
    assert len(under) == 1  # the chain ends as one leaf
    assert calls[:2] == [2, 4]  # and is not judged at step 6
    assert 14 <= len(leaves) <= 16


def _ancestor(tree, n, depth):
    while int(tree.depth[n]) > depth:
        n = int(tree.parent[n])
    return n


def test_tie_verdicts_by_hand():
    # tree 0: 0.5, 0.5 (a tie), 0.7; tree 1: 0.2, 0.2 (one cluster: the whole frontier predicts a tie)
    v = torch.tensor([0.5, 0.5, 0.7, 0.2, 0.2])
    assert tie_verdicts(v, [0, 0, 0, 1, 1], 0.0) == [False, True, False, True, True]
    assert tie_verdicts(v, [0, 0, 0, 1, 1], 0.25) == [True, True, True, True, True]
    assert tie_verdicts(torch.tensor([0.3]), [4], 0.0) == [False]  # one node has no sibling to tie with
    x = torch.tensor([[0.0, 0.0], [0.0, 0.3], [3.0, 4.0]])  # RMS distances: 0.212, 3.54 from the first
    assert tie_verdicts(x, [0, 0, 0], 0.25) == [False, True, False]
    assert tie_verdicts(x, [0, 0, 0], 0.2) == [False, False, False]
    # each node's leader: the first earlier leader of its tree within the tolerance (-1: it leads)
    assert tie_leaders(v, [0, 0, 0, 1, 1], 0.0) == [-1, 0, -1, -1, 3]
    assert tie_leaders(torch.tensor([0.5, 0.8, 0.7]), [0, 0, 0], 0.25) == [-1, -1, 0]  # 0.7: 0 and 1 near, 0 first


def test_distance_values_are_each_trees_x0_over_its_rms():
    x0 = torch.tensor([[3.0, 4.0], [0.0, 5.0], [1.0, 1.0]])  # tree 0: RMS over its nodes sqrt((12.5 + 12.5) / 2)
    got = distance_values(x0.view(3, 1, 2), [0, 0, 7])
    r = 12.5**0.5
    assert torch.allclose(got, torch.tensor([[3 / r, 4 / r], [0.0, 5 / r], [1.0, 1.0]], dtype=torch.float64))


# --- rollouts ------------------------------------------------------------------------------------------------


def test_no_stop_is_the_fixed_tree_bit_for_bit(policy):
    _, fixed, n0, _ = _roll(policy)
    cfg, dyn, n1, st = _roll(policy, ['tree.dynamic="distance"', "tree.stop_tol=0.0", "tree.width=16"])
    assert st["early_stops"] == 0 and n0 == n1 == st["evals_fixed"]
    for k, v in fixed.tensors().items():
        torch.testing.assert_close(v, getattr(dyn, k), rtol=0, atol=0, equal_nan=True, msg=k)


@pytest.mark.parametrize("heuristic", ["distance", "reward"])
def test_a_dynamic_rollout_repeats_bit_for_bit_and_stops(policy, heuristic):
    judge = lambda x0, prompts: x0.flatten(1).mean(1).round(decimals=1)  # noqa: E731  (ties are common)
    sets = [f'tree.dynamic="{heuristic}"', f"tree.stop_tol={0.02 if heuristic == 'reward' else TOL}"]
    _, a, na, sa = _roll(policy, sets, judge=judge)
    _, b, nb, sb = _roll(policy, sets, judge=judge)
    assert sa["early_stops"] > 0 and sa == sb and na == nb
    for k, v in a.tensors().items():
        torch.testing.assert_close(v, getattr(b, k), rtol=0, atol=0, equal_nan=True, msg=k)
    assert (heuristic == "reward") == ("judged_images" in sa)
    kids = torch.bincount(a.parent[a.parent >= 0], minlength=a.num_nodes)
    assert {1, 2}.issubset(set(kids[kids > 0].tolist())) and int(kids.max()) > 2  # irregular: chains and wide splits


def test_the_cap_is_never_exceeded(policy):
    rng = random.Random(5)
    seen = set()
    for trial in range(12):
        width = rng.choice([3, 5, 8, 16, 20])
        base = tree_evals(Shape((0, 3, 6, 9), width), 20, 2)
        cap = rng.choice([0, base, base + rng.randrange(1, 60)])
        sets = [
            'tree.dynamic="distance"',
            f"tree.stop_tol={rng.choice([0.5, 1.0, 1.2, 5.0])}",
            f"tree.width={width}",
            f"tree.max_evals={cap}",
            f"tree.transfer={rng.choice(['true', 'false'])}",
            f"tree.fallback={rng.choice(['true', 'false'])}",
        ]
        _, tree, nfe, st = _roll(policy, sets, seed=trial)
        forwards, leaves = _forwards_and_leaves(tree, 20)
        assert all(f <= (cap or base) for f in forwards), (sets, forwards)
        assert all(1 <= n <= width for n in leaves), (sets, leaves)
        assert nfe == sum(forwards) and st["evals_saved"] == 3 * base - nfe
        assert cap > base or st["evals_saved"] >= 0  # at the undisturbed tree's cap a dynamic tree never costs more
        seen.add((st["early_stops"] > 0, st["fallbacks"] > 0))
    assert (True, True) in seen  # the sweep did stop paths and fall back


def test_width_is_kept_when_the_cap_leaves_room(policy):
    sets = ['tree.dynamic="distance"', f"tree.stop_tol={TOL}", "tree.max_evals=2000"]
    _, tree, _, st = _roll(policy, sets)
    assert st["early_stops"] > 0 and _forwards_and_leaves(tree, 20)[1] == [16, 16, 16]
    _, tree, _, st = _roll(policy, [*sets[:2], "tree.transfer=false"])
    assert st["evals_saved"] > 0 and sum(_forwards_and_leaves(tree, 20)[1]) < 48


def test_per_prompt_shapes(policy):
    shapes = [Shape((0, 3, 6, 9), 5), Shape((0, 5), 3), Shape((2, 4, 8, 12), 16)]
    cfg, tree, _, _ = _roll(policy, ["tree.width=16"], shapes=shapes)
    forwards, leaves = _forwards_and_leaves(tree, 20)
    assert leaves == [5, 3, 16] and forwards == [tree_evals(s, 20, 2) for s in shapes]
    split_depths = [
        sorted({int(tree.depth[p]) for p in tree.parent[tree.tree == t].tolist() if p >= 0}) for t in range(3)
    ]
    kids = torch.bincount(tree.parent[tree.parent >= 0], minlength=tree.num_nodes)
    for t, s in enumerate(shapes):
        branching = sorted({int(tree.depth[n]) for n in range(tree.num_nodes) if tree.tree[n] == t and kids[n] > 1})
        assert set(branching) <= set(s.split_steps) and split_depths[t]
    assert bool(tree.sde[(tree.tree == 2) & (tree.depth == 13)].all())  # a split step is stochastic (12 -> 13)
    assert not bool(tree.sde[(tree.tree == 0) & (tree.depth == 13)].any())  # outside the window of 0-9: ODE


def test_bad_dynamic_settings_are_one_line_errors():
    for sets, needle in (
        (['tree.dynamic="fast"'], "tree.dynamic must be one of"),
        (["tree.stop_tol=-1.0"], "tree.stop_tol"),
        (["tree.width=-2"], "tree.width"),
        (["tree.max_evals=100"], "tree.max_evals = 100 is below"),
        (['tree.dynamic="reward"', "tree.split_steps=[0]"], "needs >= 2 split steps"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_config("branch-mix-flow", sets=sets)
    with pytest.raises(ConfigError, match="tree.width = 4 needs split steps"):
        load_config("flow-grpo", sets=["tree.width=4"])


# --- advantages on irregular trees ---------------------------------------------------------------------------
# An early stop and a transfer, by hand: root -> A, B at step 0; at step 1 A stopped (a chain: one child a) and
# B took its spare leaf (three children b1 b2 b3); step 2 is a chain step. Leaf rewards a 1, b1 2, b2 3, b3 6.
PARENT = torch.tensor([-1, 0, 0, 1, 2, 2, 2, 3, 4, 5, 6])
DEPTH = torch.tensor([0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
ZERO = torch.zeros(11, dtype=torch.long)
REWARD = torch.full((11,), math.nan).index_put_((torch.tensor([7, 8, 9, 10]),), torch.tensor([1.0, 2.0, 3.0, 6.0]))
LOGP = torch.zeros(11)


def _est(cfg):
    return estimate(cfg, parent=PARENT, depth=DEPTH, tree=ZERO, group=ZERO, reward=REWARD, log_prob=LOGP)


def test_flat_on_the_irregular_tree():
    a = _est(AdvantageConfig("flat", ddof=1, clamp=None))
    z = [-2 / math.sqrt(14 / 3), -1 / math.sqrt(14 / 3), 0.0, 3 / math.sqrt(14 / 3)]
    assert torch.allclose(a.leaf[7:], torch.tensor(z), atol=1e-6)
    assert abs(float(a.leaf[7:].sum())) < 1e-6  # the group's advantages sum to 0
    # an edge gets the mean of its leaves: the chain A -> a -> leaf all carry a's; B the mean of b1 b2 b3
    assert torch.allclose(a.edge[[1, 3, 7]], torch.full((3,), z[0]), atol=1e-6)
    assert abs(float(a.edge[2]) - sum(z[1:]) / 3) < 1e-6
    assert torch.allclose(a.fused, torch.tensor([3, 1, 11 / 3, 1, 2, 3, 6, 1, 2, 3, 6.0]), atol=1e-6)  # fusion


def test_branch_depthwise_on_the_irregular_tree():
    a = _est(AdvantageConfig("branch", ddof=1, clamp=None))
    assert torch.allclose(a.fused, torch.tensor([3, 1, 11 / 3, 1, 2, 3, 6, 1, 2, 3, 6.0]), atol=1e-6)  # uniform fusion
    s = 1 / math.sqrt(2)  # depth 1: fused 1 and 11/3, two nodes: -+1/sqrt(2) whatever the gap
    z = [-2 / math.sqrt(14 / 3), -1 / math.sqrt(14 / 3), 0.0, 3 / math.sqrt(14 / 3)]
    assert torch.allclose(a.edge[1:3], torch.tensor([-s, s]), atol=1e-6)
    assert torch.allclose(a.edge[3:7], torch.tensor(z), atol=1e-6) and torch.allclose(
        a.edge[7:], torch.tensor(z), atol=1e-6
    )
    for d in (1, 2, 3):  # depth-wise normalisation: each depth's values have mean 0 and (ddof 1) std 1
        x = a.edge[DEPTH == d].double()
        assert abs(float(x.mean())) < 1e-6 and abs(float(x.std()) - 1) < 1e-6


def test_treegrpo_backup_on_the_irregular_tree():
    a = _est(AdvantageConfig("treegrpo", backup="mean", ddof=0, clamp=None))
    z = [x / math.sqrt(14 / 4) for x in (-2, -1, 0, 3)]
    assert torch.allclose(a.leaf[7:], torch.tensor(z, dtype=torch.float32), atol=1e-6)
    assert torch.allclose(a.edge[[1, 3]], torch.full((2,), z[0]), atol=1e-6)  # a chain backs up its one leaf
    assert abs(float(a.edge[2]) - sum(z[1:]) / 3) < 1e-6  # B: the mean of its three children


def test_treepo_subgroups_on_the_irregular_tree():
    # sub-groups: the whole group (mean 3) for every leaf; B's subtree (mean 11/3) for b1 b2 b3; A's chain is none
    raw = [-2.0, ((2 - 3) + (2 - 11 / 3)) / 2, ((3 - 3) + (3 - 11 / 3)) / 2, ((6 - 3) + (6 - 11 / 3)) / 2]
    m = sum(raw) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in raw) / 4)
    a = _est(AdvantageConfig("treepo", ddof=0, treepo_weight="average", clamp=None))
    assert torch.allclose(a.leaf[7:], torch.tensor([(x - m) / sd for x in raw]), atol=1e-5)
    assert abs(float(a.leaf[7:].sum())) < 1e-5  # whitened over the batch


def test_treepo_gives_a_tied_group_nothing_and_whitens_the_rest_without_it():
    # the irregular tree twice, in two prompt groups: scored 1, 2, 3, 6 and 2, 2, 2, 2. The first's raw
    # advantages sum to -1, not 0: whitened together with the tie's four zeros, the tie's leaves would each get
    # +0.125 over the batch std; TreePO's pipeline drops the tied group (DAPO's filter), so they get 0 and the first
    # group is whitened on its own, as when it is the whole batch
    parent = torch.cat([PARENT, torch.where(PARENT >= 0, PARENT + 11, -1)])
    reward = torch.cat([REWARD, torch.where(REWARD.isnan(), math.nan, 2.0)])
    two = torch.tensor([0] * 11 + [1] * 11)
    cfg = AdvantageConfig("treepo", ddof=0, treepo_weight="average", clamp=None)
    a = estimate(cfg, parent=parent, depth=DEPTH.repeat(2), tree=two, group=two, reward=reward, log_prob=LOGP.repeat(2))
    raw = [-2.0, ((2 - 3) + (2 - 11 / 3)) / 2, ((3 - 3) + (3 - 11 / 3)) / 2, ((6 - 3) + (6 - 11 / 3)) / 2]
    m = sum(raw) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in raw) / 4)
    assert torch.allclose(a.leaf[7:11], torch.tensor([(x - m) / sd for x in raw]), atol=1e-5)
    assert torch.equal(a.leaf[18:], torch.zeros(4)) and torch.equal(a.edge[12:], torch.zeros(10))
    tie = torch.where(REWARD.isnan(), math.nan, 2.0)
    tied = estimate(cfg, parent=PARENT, depth=DEPTH, tree=ZERO, group=ZERO, reward=tie, log_prob=LOGP)
    assert torch.equal(tied.leaf[7:], torch.zeros(4))  # a batch of ties: nothing to whiten, no nan


@pytest.mark.parametrize("estimator", list(ESTIMATORS))
def test_estimators_keep_their_invariants_on_dynamic_rollouts(policy, estimator):
    _, tree, _, st = _roll(policy, ['tree.dynamic="distance"', f"tree.stop_tol={TOL}", "tree.transfer=true"])
    assert st["early_stops"] > 0
    g = torch.Generator().manual_seed(0)
    leaves = tree.leaves()
    reward = torch.full((tree.num_nodes,), math.nan).index_put_((leaves,), torch.rand(len(leaves), generator=g))
    cfg = AdvantageConfig(estimator, ddof=0, clamp=None, backup="mean")
    adv, trained = assign_credit(
        tree, {"r": reward}, weights={"r": 1.0}, combine_mode="rewards", advantage=cfg, pruning=PruneConfig(),
        steps=20, decode="x0",
    )  # fmt: skip
    assert torch.isfinite(adv.edge).all() and bool(trained.any())
    leaf = adv.leaf[leaves].double()
    if estimator in ("flat", "treegrpo"):  # each prompt group's leaf z-scores sum to 0
        for t in range(tree.num_trees):
            assert abs(float(leaf[tree.tree[leaves] == t].sum())) < 1e-4
    if estimator == "treepo":
        assert abs(float(leaf.sum())) < 1e-4
    if estimator == "branch":  # per (tree, depth) with >= 2 nodes: mean 0
        for t in range(tree.num_trees):
            for d in range(1, 21):
                x = adv.edge[(tree.tree == t) & (tree.depth == d)].double()
                if x.numel() > 1:
                    assert abs(float(x.mean())) < 1e-4
    # fusion: every node's fused value is the mean of the rewards of the leaves below it
    below = torch.zeros(tree.num_nodes, dtype=torch.float64)
    count = torch.zeros(tree.num_nodes, dtype=torch.float64)
    for n in leaves.tolist():
        p = n
        while p >= 0:
            below[p] += float(reward[n])
            count[p] += 1
            p = int(tree.parent[p])
    assert torch.allclose(adv.fused.double(), below / count, atol=1e-5)


@pytest.mark.parametrize("heuristic", ["distance", "reward"])
def test_stops_do_not_depend_on_the_batch(policy, heuristic):
    """A prompt's dynamic tree is the same rolled out with the others or alone (chunks, shards, processes)."""
    calls = []

    def judge(x0, prompts):
        calls.append(len(set(prompts)))
        return x0.flatten(1).mean(1).round(decimals=1)

    cfg = load_config("branch-mix-flow", sets=[*MIX, f'tree.dynamic="{heuristic}"', f"tree.stop_tol={TOL}"])
    sde = make_kernel(policy, cfg.sampler)
    whole, _ = rollout(policy, PROMPTS, [0, 1, 2], sde, cfg.tree, 7, judge=judge)
    first, _ = rollout(policy, PROMPTS[:1], [0], sde, cfg.tree, 7, judge=judge)
    rest, _ = rollout(policy, PROMPTS[1:], [1, 2], sde, cfg.tree, 7, earlier_ids=[0], judge=judge)
    for part, trees in ((first, [0]), (rest, [1, 2])):
        for j, t in enumerate(trees):
            a = {
                k: v[whole.tree == t] for k, v in whole.tensors().items() if k in ("parent", "child", "seed", "latent")
            }
            b = {k: v[part.tree == j] for k, v in part.tensors().items() if k in ("parent", "child", "seed", "latent")}
            assert torch.equal(a["child"], b["child"]) and torch.equal(a["seed"], b["seed"])
            torch.testing.assert_close(a["latent"], b["latent"], rtol=0, atol=1e-6)
    assert heuristic == "distance" or (calls and set(calls) == {1})  # the judge sees one tree (prompt) at a time

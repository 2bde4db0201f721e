"""GRPO-Guard (engine/ratio_guard.py; train.ratio_norm, train.step_reweight): the released codes' outputs stored by
bench/oracle_ratio_guard.py, golden values of the formulas, the normalised ratio centred on a skewed batch where the
plain one is not, the "code" shift's gradient, the defaults' update bitwise as before, and the options end to end:
a flat and a tree preset through the CLI, a resume, the staged pipeline and two processes."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from clitools import bench_module, close, run, treegrpo, undeclared
from test_grpo import scored_batch
from test_staged import online, staged

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.grpo import (
    _edge_terms,
    _parent_chunks,
    clipped_loss,
    grpo_update,
    loss_denominators,
    make_optimizer,
    minibatches,
)
from treegrpo_cli.engine.ratio_guard import (
    code_bias,
    mean_shift,
    normalized_log_ratio,
    objective_slope,
    step_totals,
    step_weight,
)
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.store.checkpoint import list_checkpoints
from treegrpo_cli.training.runlog import MetricsRow, read_metrics, without_timings

ROOT = Path(__file__).resolve().parents[1]
GUARD = ['train.ratio_norm="paper"', 'train.step_reweight="dt"']
SMALL = ['model="pixel-tiny"', "rollout.num_prompts=2", "train.eval_samples=0", "train.sample_every=0"]


def _sets(sets):
    return [x for s in sets for x in ("--set", s)]


def _oracle():
    return bench_module("oracle_ratio_guard")


# --- the released codes' outputs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["flow_grpo", "flow_factory"])
def test_ours_matches_the_released_codes_stored_outputs(code):
    """flow_grpo's RatioNorm script ("code", "dt") and Flow-Factory's GRPOGuardTrainer ("paper", "none"), run by
    bench/oracle_ratio_guard.py on its seeded batch: each edge's ratio, each step's loss, the velocity gradient."""
    oracle = _oracle()
    stored = json.loads((ROOT / "bench" / "results" / "oracle_ratio_guard.json").read_text())
    assert stored["seed"] == oracle.SEED and stored["clip_range"] == oracle.CLIP
    case = stored[code]
    mine = oracle.ours(oracle.make_inputs(stored["seed"]), **case["train"])
    for key, released in case["released"].items():
        got, want = torch.tensor(mine[key]), torch.tensor(released)
        assert got.shape == want.shape, key
        assert float((got - want).abs().max()) <= stored["tolerance"], key
    assert max(case["max_abs_diff"].values()) <= stored["tolerance"]
    r = torch.tensor(case["released"]["ratio"])
    assert bool(((r - 1).abs() > oracle.CLIP).any()) and bool(
        ((r - 1).abs() < oracle.CLIP).any()
    )  # both sides of the clip


# --- golden values ----------------------------------------------------------------------------------------------------


def test_formulas_golden():
    # (l - l_old + shift / (2 s^2)) s = (0.2 + 0.01 / 0.02) x 0.1 = 0.07; (0 + 0.08 / 0.08) x 0.2 = 0.2
    got = normalized_log_ratio(
        torch.tensor([-1.0, 0.5]), torch.tensor([-1.2, 0.5]), torch.tensor([0.01, 0.08]), torch.tensor([0.1, 0.2])
    )
    torch.testing.assert_close(got, torch.tensor([0.07, 0.2]))
    # |mu - mu_old|^2 over 4 elements: (1 + 4 + 0 + 9) / 4 = 3.5, summed 14
    mu, old = torch.tensor([[[1.0, 2.0], [0.0, 3.0]]]), torch.zeros(1, 2, 2)
    assert mean_shift(mu, old).tolist() == [3.5] and mean_shift(mu, old, "sum").tolist() == [14.0]
    # 1 / (sigma_t - sigma_t+1) on the grid 1, 0.75, 0.25, 0
    grid = torch.tensor([1.0, 0.75, 0.25, 0.0], dtype=torch.float64)
    assert step_weight(grid, torch.tensor([0, 1, 2, 1])).tolist() == [4.0, 2.0, 4.0, 2.0]
    assert step_totals(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2, 0, 2]), 3).tolist() == [2.0, 0.0, 4.0]
    # the clipped loss's slope: -A inside the band and where the clip does not bind, 0 where it caps
    ratio, adv = torch.tensor([1.0, 1.5, 1.5, 0.5, 0.5]), torch.tensor([2.0, 2.0, -2.0, -2.0, 2.0])
    slope = objective_slope(lambda r: clipped_loss(torch.log(r), torch.zeros(5), adv, 0.1)[0], ratio)
    assert slope.tolist() == [-2.0, 0.0, 2.0, 0.0, -2.0]


def test_the_normalised_ratio_is_centred_at_every_step_of_a_skewed_batch():
    """Edges of 4 steps whose std s falls from 0.5 to 0.02, the new mean moved by the same delta: the plain ratio's
    mean sits far below 1 at the low-noise steps and its log's spread grows as 1 / s; RatioNorm's is centred on 1
    with one spread at every step (log r^ = mean(eps delta))."""
    g = torch.Generator().manual_seed(0)
    stds, n, d = [0.5, 0.2, 0.05, 0.02], 4000, 16
    plain_mean, plain_spread = [], []
    for s in stds:
        old = torch.randn(n, d, generator=g)
        eps = torch.randn(n, d, generator=g)
        new = old + 0.02 * torch.randn(n, d, generator=g)
        x = old + s * eps

        def lp(mean, s=s, x=x):
            return (-((x - mean) ** 2) / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi)).mean(1)

        std = torch.full((n,), s)
        plain = lp(new) - lp(old)
        normed = normalized_log_ratio(lp(new), lp(old), mean_shift(new, old), std)
        assert abs(float(torch.exp(normed).mean()) - 1) < 0.002, s
        assert float(normed.std()) == pytest.approx(0.02 / math.sqrt(d), rel=0.1), s
        plain_mean.append(float(torch.exp(plain).mean()))
        plain_spread.append(float(plain.std()))
    assert plain_mean == sorted(plain_mean, reverse=True) and plain_mean[0] > 0.99 and plain_mean[-1] < 0.7
    for s, spread in zip(stds, plain_spread, strict=True):  # at least mean(eps delta) / s; the shift adds more
        assert spread > 0.9 * 0.02 / math.sqrt(d) / s, s


def test_the_code_shift_carries_the_gradient_of_the_steps_mean():
    """The loss with B_t = the mean of its step's shifts (the flow_grpo script's, differentiated through) has the
    gradient of the loss with B_t held plus c_t shift_e: edges of 3 steps, step weights, some ratios clipped."""
    g = torch.Generator().manual_seed(1)
    n, steps, clip = 12, 3, 0.02
    step = torch.tensor([0, 1, 2]).repeat(4)
    std, w = torch.tensor([0.3, 0.1, 0.05])[step], torch.tensor([2.0, 5.0, 9.0])[step]
    diff0, adv = 0.02 * torch.randn(n, generator=g), torch.randn(n, generator=g)
    theta0 = 0.3 * torch.randn(n, generator=g)

    def terms(theta):  # a stand-in for the model: each edge's shift and log-ratio move with its own parameter
        return theta**2 * 0.1, diff0 + 0.05 * theta

    theta = theta0.clone().requires_grad_(True)
    shift, diff = terms(theta)
    bmean = torch.stack([shift[step == t].mean() for t in range(steps)])[step]
    r = torch.exp(normalized_log_ratio(diff, torch.zeros(n), bmean, std))
    (clipped_loss(torch.log(r), torch.zeros(n), adv, clip)[0] * w).sum().backward()
    want = theta.grad.clone()

    theta = theta0.clone().requires_grad_(True)
    shift, diff = terms(theta)
    slope = lambda x: objective_slope(lambda y: clipped_loss(torch.log(y), torch.zeros(n), adv, clip)[0], x)  # noqa: E731
    bias, coef = code_bias(shift.detach(), step, std, diff.detach(), w, slope, steps)
    r = torch.exp(normalized_log_ratio(diff, torch.zeros(n), bias[step], std))
    assert bool(((r - 1).abs() > clip).any())
    ((clipped_loss(torch.log(r), torch.zeros(n), adv, clip)[0] * w) + coef[step] * shift).sum().backward()
    torch.testing.assert_close(theta.grad, want, rtol=1e-5, atol=1e-7)


# --- the defaults, the config -----------------------------------------------------------------------------------------


def _old_update(policy, opt, sde, b, cfg, gen):
    """grpo_update's loop as it was before GRPO-Guard: plain ratios, no behaviour means."""
    plan = minibatches(b, cfg, gen)
    for mb, denom in zip(plan, loss_denominators(b, cfg, plan), strict=True):
        opt.zero_grad(set_to_none=True)
        for chunk in _parent_chunks(b.tree.parent, mb, 64):
            new_lp, _, _ = _edge_terms(policy, sde, b, chunk, None)
            loss, _ = clipped_loss(new_lp, b.tree.log_prob[chunk], b.advantage[chunk], cfg.clip_range)
            (loss.sum() / denom).backward()
        torch.nn.utils.clip_grad_norm_(list(policy.trainable_parameters()), cfg.max_grad_norm)
        opt.step()


@pytest.mark.parametrize("preset", ["tree-grpo", "dance-grpo"])
def test_the_defaults_leave_the_update_bitwise_as_it_was(preset):
    cfg, policy, sde, batch, _ = scored_batch(preset, sets=["train.minibatches=2"])
    assert (cfg.train.ratio_norm, cfg.train.step_reweight) == ("none", "none")
    w0 = {k: v.clone() for k, v in policy.trainable_state().items()}
    weights = []
    for update in (grpo_update, _old_update):
        policy.load_trainable_state({k: v.clone() for k, v in w0.items()})
        opt = make_optimizer(list(policy.trainable_parameters()), cfg.train)
        update(policy, opt, sde, batch, cfg.train, torch.Generator().manual_seed(0))
        weights.append(policy.trainable_state())
    for k in w0:
        assert torch.equal(weights[0][k], weights[1][k]), k
        assert not torch.equal(weights[0][k], w0[k]), k


def test_every_preset_but_the_guard_presets_keeps_the_plain_ratio():
    from treegrpo_cli.config import preset_names

    for name in preset_names():
        t = load_config(name).train
        guarded = (t.ratio_norm, t.step_reweight) != ("none", "none")
        assert guarded == name.endswith("-guard"), name


def test_the_options_move_the_update_and_the_first_step_stays_on_policy():
    """With 2 optimizer steps, "paper" and "code" differ in the second (the behaviour means kept before the first);
    the first step's ratios are on-policy under every option."""
    states = {}
    for norm, rew in [("none", "none"), ("paper", "none"), ("code", "none"), ("paper", "dt"), ("none", "dt")]:
        cfg, policy, sde, batch, _ = scored_batch("flow-grpo", sets=["tree.trees_per_prompt=4"])
        train = replace(cfg.train, ratio_norm=norm, step_reweight=rew)
        opt = make_optimizer(list(policy.trainable_parameters()), train)
        m = grpo_update(policy, opt, sde, batch, train, torch.Generator().manual_seed(0))
        assert m["optimizer_steps"] == 2 and m["ratio_first_dev"] < 1e-5, (norm, rew)
        states[norm, rew] = policy.trainable_state()
    keys = list(states)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert any(not torch.equal(states[a][k], states[b][k]) for k in states[a]), (a, b)


@pytest.mark.parametrize(
    "sets,needle",
    [
        (['train.ratio_norm="batch"'], "train.ratio_norm must be one of none, paper, code"),
        (['train.step_reweight="sigma"'], "train.step_reweight must be one of none, dt"),
        (['train.ratio_norm="paper"', 'sampler.log_prob_form="squared-error"'], "log_prob_form = gaussian"),
    ],
)
def test_bad_settings_are_one_line_errors(sets, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config("branch", sets=sets)


def test_an_update_that_ignores_the_options_warns():
    (w,) = load_config("nft", sets=GUARD).warnings()
    assert "train.ratio_norm, train.step_reweight set, but train.objective = nft ignores it" in w


# --- end to end -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,extra",
    [
        ("flow-grpo-guard", ["tree.trees_per_prompt=4"]),
        ("tree-grpo", GUARD),
        ("branch", ['train.ratio_norm="code"', 'train.step_reweight="dt"', "train.minibatches=2"]),
    ],
)
def test_a_flat_and_a_tree_preset_train_two_iterations_with_the_options(preset, extra, tmp_path):
    r = run("train", "--preset", preset, *_sets([*SMALL, *extra]), "--iterations", 2, "--run-dir", tmp_path / "r")
    assert r.exit_code == 0, r.output
    rows = read_metrics(tmp_path / "r")
    assert [row["iteration"] for row in rows] == [0, 1]
    assert [undeclared(row, MetricsRow) for row in rows] == [[], []]
    assert all(row["trained_edges"] > 0 and math.isfinite(row["loss"]) for row in rows)
    assert all(row["ratio_first_dev"] < 1e-5 for row in rows)
    cfg = json.loads((tmp_path / "r" / "run.json").read_text())["config"]["train"]
    assert cfg["ratio_norm"] != "none" and cfg["step_reweight"] == "dt"


@pytest.mark.slow
def test_a_guarded_run_resumes_bitwise(tmp_path):
    args = ["--preset", "flow-grpo-guard", *_sets([*SMALL, "tree.trees_per_prompt=4", "train.save_every=1"])]
    assert run("train", *args, "--iterations", 3, "--run-dir", tmp_path / "a").exit_code == 0
    assert run("train", *args, "--iterations", 2, "--run-dir", tmp_path / "b").exit_code == 0
    assert [p.name for p in list_checkpoints(tmp_path / "b" / "checkpoints")][-1] == "step-2"
    r = run("train", "--resume", tmp_path / "b", "--iterations", 3)
    assert r.exit_code == 0, r.output
    assert without_timings(read_metrics(tmp_path / "b")) == without_timings(read_metrics(tmp_path / "a"))


@pytest.mark.slow
def test_staged_equals_online_with_the_options(tmp_path, monkeypatch):
    extra = ("tree.trees_per_prompt=4", 'train.ratio_norm="code"')
    a = online("flow-grpo-guard", 1, monkeypatch, extra)
    b = staged("flow-grpo-guard", 1, tmp_path, extra)
    assert a["batch"].trained.any()
    for k, v in a["weights"].items():
        assert torch.equal(v, b["weights"][k]), k


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,extra",
    [
        ("flow-grpo-guard", ['train.ratio_norm="code"', "tree.trees_per_prompt=4", "train.lr=0.05"]),
        ("tree-grpo", GUARD),
    ],
)
def test_two_processes_match_one(preset, extra, tmp_path):
    """The behaviour means and the "code" shifts of each optimizer step over both processes' edges: 2 gloo processes
    give the metrics of 1 over the same global batch (both presets take 2 optimizer steps an iteration). The large
    rate moves the means enough in the first step that "code" shifts summed over one process only differ here."""
    sets = ['model="pixel-tiny"', "rollout.num_prompts=4", "train.eval_samples=0", "train.sample_every=0", *extra]
    args = ["--preset", preset, "--iterations", 2, "--seed", 3, *_sets(sets)]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    close(read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one"))


@pytest.mark.slow
def test_a_sharded_model_keeps_its_ranks_in_step_through_the_extra_forwards(tmp_path):
    """FSDP2: the behaviour means and the "code" shifts are forwards too; chunks of 3 parents give the ranks unequal
    chunk counts, and the padding forwards keep their collectives in step (without them: a hang)."""
    sets = ['model="pixel-tiny"', "rollout.num_prompts=4", "train.eval_samples=0", "train.sample_every=0"]
    sets += ["rollout.max_batch=3", 'train.ratio_norm="code"', 'train.step_reweight="dt"']
    args = ["--preset", "tree-grpo", "--iterations", 2, "--seed", 3, *_sets(sets)]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, *_sets(['train.parallel="fsdp"']), "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    rows = read_metrics(tmp_path / "two")
    assert sum(r.pop("pad_chunks") for r in rows) > 0
    close(rows, read_metrics(tmp_path / "one"))

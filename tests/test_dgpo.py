"""DGPO (engine/dgpo.py, train.objective = "dgpo"): the loss against the released code's numbers
(bench/results/oracle_dgpo.json) and by hand, the clip, the noise levels and the old policy's decay, the update's
group weights against the loss's gradient, and the training loop end to end (the old policy sampling past its
switch, two iterations of each preset, exact resume, staged equal to online, one process against two)."""

import json
import math
from pathlib import Path

import pytest
import torch
from clitools import bench_module, close, one_line_error, run, treegrpo, undeclared

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.dgpo import (
    DGPOBatch,
    DGPOConfig,
    _weights,
    dgpo_loss,
    flow_errors,
    group_logits,
    ppo_clipped,
    trained_levels,
    velocity_penalty,
)
from treegrpo_cli.engine.sde import FlowSDE
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import MetricsRow, read_metrics, without_timings
from treegrpo_cli.training.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

# --- the released code's numbers (bench/oracle_dgpo.py) ------------------------------------------------------


def _oracle():
    return bench_module("oracle_dgpo"), json.loads((ROOT / "bench" / "results" / "oracle_dgpo.json").read_text())


def test_the_loss_gives_the_released_codes_loss_gradient_and_clipped_rows():
    """Each case's inputs drawn again from its seed; our "code" loss (with the velocity penalty) against the loss,
    the gradient and the clipped rows the released training step gave; our "paper" gradient against beta times the
    released one without the penalty. Clipped and unclipped rows both occur."""
    mod, res = _oracle()
    assert res["max_abs_diff"] < 1e-5 and "Luo-Yihong/DGPO scripts/train_sd3_dgpo.py" in res["released"]
    assert sum(c["clipped"] for c in res["cases"].values()) > 0
    for name, c in res["cases"].items():
        x = mod.make_inputs(c["seed"], c["groups"], c["group_size"])
        case = (c["seed"], c["groups"], c["group_size"], c["beta"], c["clip_range"], c["kl_beta"], c["ema_reference"])
        ours = mod.run_ours(x, case, "code")
        assert ours["loss"] == pytest.approx(c["released"]["loss"], abs=1e-5), name
        assert ours["grad"] == pytest.approx(c["released"]["grad"], abs=1e-5), name
        assert mod.clipped_rows(x, case) == c["released"]["clipped"], name
        paper = mod.run_ours(x, (*case[:5], 0.0, case[6]), "paper")["grad"]
        theirs = [c["beta"] * g for g in c["released_without_penalty"]["grad"]]
        assert paper == pytest.approx(theirs, abs=1e-5 * c["beta"]), name


# --- the loss, by hand -----------------------------------------------------------------------------------------


def test_the_loss_and_its_gradient_on_one_group():
    """One group of two one-element samples, target 0: v = (1, 2), v_ref = (0, 1), A = (1, -1), beta 2.
    err = (1, 4), err_ref = (0, 1), d = (1, 3); s = 2 / 2 (1 - 3) = -2; L = log(1 + e^-2) = 0.126928.
    dL/dv_i = sigmoid(-2) x 2 / 2 x A_i x 2 v_i = (0.238406, -0.476812). The code's surrogate: mean of
    sigmoid(-2) A err = (0.119203 - 0.476812) / 2 = -0.178804, gradient sigmoid(-2) A 2 v / 2 = the paper's / 2."""
    zeros = torch.zeros(2, 1)
    args = (torch.tensor([[0.0], [1.0]]), zeros, torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.long))
    v = torch.tensor([[1.0], [2.0]], requires_grad=True)
    loss = dgpo_loss(v, *args, beta=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(0.1269280, abs=1e-6)
    assert v.grad.flatten().tolist() == pytest.approx([0.2384058, -0.4768117], abs=1e-6)
    v.grad = None
    code = dgpo_loss(v, *args, beta=2.0, loss="code")
    code.backward()
    assert code.item() == pytest.approx(-0.1788044, abs=1e-6)
    assert v.grad.flatten().tolist() == pytest.approx([0.1192029, -0.2384058], abs=1e-6)


def test_groups_are_averaged_and_a_tied_group_gives_log_2():
    """Two groups in interleaved rows; the second has A = 0 (a tied prompt): s = 0, its term log 2, no gradient.
    The first: v = 1, v_ref = 0, A = (2, -2), one element, target 0 -> d = (1, 1), s = 3 / 2 x (2 - 2) = 0 too;
    with v = (1, 0) instead: d = (1, 0), s = 1.5 x 2 = 3, L = (softplus(3) + log 2) / 2."""
    v = torch.tensor([[1.0], [5.0], [0.0], [7.0]], requires_grad=True)
    args = dict(beta=3.0)
    loss = dgpo_loss(v, torch.zeros(4, 1), torch.zeros(4, 1), torch.tensor([2.0, 0.0, -2.0, 0.0]),
                     torch.tensor([0, 1, 0, 1]), **args)  # fmt: skip
    assert loss.item() == pytest.approx((math.log1p(math.exp(3.0)) + math.log(2.0)) / 2, abs=1e-6)
    loss.backward()
    assert v.grad[1].item() == 0 and v.grad[3].item() == 0
    assert v.grad[0].item() == pytest.approx(1 / (1 + math.exp(-3)) * 1.5 * 2 * 2 / 2, abs=1e-6)


def test_errors_are_means_over_elements_and_logits_divide_by_the_group_size():
    assert flow_errors(torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])).tolist() == [2.5]
    s = group_logits(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 1.0, -1.0]), torch.tensor([0, 0, 1]), 10.0)
    assert s.tolist() == pytest.approx([15.0, -30.0])
    assert velocity_penalty(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]])).tolist() == [2.0]


def test_the_clip_holds_a_sample_past_its_side_of_the_ratio():
    """ratio = exp(err_old - err): A > 0 is held above 1 + c, A <= 0 below 1 - c (the code's should_clip)."""
    err = torch.zeros(4)
    err_old = torch.tensor([0.2, -0.2, 0.2, -0.2])  # ratios e^0.2 = 1.22 and e^-0.2 = 0.82
    adv = torch.tensor([1.0, 1.0, -1.0, 0.0])
    assert ppo_clipped(err, err_old, adv, 0.1).tolist() == [True, False, False, True]
    v = torch.tensor([[1.0], [1.0]], requires_grad=True)  # a held sample keeps its value, loses its gradient
    adv, group, zeros = torch.tensor([1.0, -1.0]), torch.zeros(2, dtype=torch.long), torch.zeros(2, 1)
    loss = dgpo_loss(v, zeros, zeros, adv, group, beta=1.0, v_old=torch.tensor([[2.0], [1.0]]), clip_range=0.1)
    loss.backward()
    assert v.grad[0].item() == 0 and v.grad[1].item() != 0


def test_the_updates_group_weights_give_the_losss_gradient():
    """The update weighs each row's error by its group's sigmoid(s_G) times the form's scale, from every row's
    columns; sum_i w_i grad err_i equals the gradient of dgpo_loss over the same rows (three groups of unequal
    size, one optimizer step)."""
    g = torch.Generator().manual_seed(5)
    group = torch.tensor([0, 1, 1, 2, 0, 2, 2, 1, 1])
    adv, err_ref = torch.randn(9, generator=g), torch.rand(9, generator=g)
    for form in ("paper", "code"):
        v = (torch.rand(9, 1, generator=g) + 0.5).requires_grad_(True)
        v_ref = err_ref.sqrt()[:, None]
        dgpo_loss(v, v_ref, torch.zeros(9, 1), adv, group, beta=4.0, loss=form).backward()
        err = v.detach()[:, 0] ** 2
        whole = torch.stack([adv * (err - err_ref), adv * err, torch.zeros(9), torch.zeros(9)]).T
        b = DGPOBatch(x0=torch.zeros(9, 1), cond={}, adv=adv, group=group, keys=torch.zeros(9, dtype=torch.long),
                      t=torch.ones(1), whole_group=group, parts=[torch.ones(3, dtype=torch.bool)])  # fmt: skip
        w, _ = _weights(whole, b, b.parts[0], torch.arange(9), DGPOConfig(beta=4.0, loss=form))
        torch.testing.assert_close(w * 2 * v.detach()[:, 0], v.grad[:, 0], rtol=1e-5, atol=1e-6)


# --- levels, decay, settings -----------------------------------------------------------------------------------


def test_the_trained_levels_are_the_grid_at_or_above_t_min():
    """The dgpo preset's grid (10 steps, shift 3): sigma = 3u / (1 + 2u), u = 1 - i / 10; >= 0.6 are levels 0-6
    (0.667 at 6, 0.5625 at 7: the code's trunc_steps = 6)."""
    sigmas = FlowSDE(load_config("dgpo").sampler).sigmas
    got = trained_levels(sigmas, DGPOConfig())
    want = [3 * u / (1 + 2 * u) for u in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ConfigError, match="dgpo.levels = 8 is more than the 7 noise levels"):
        trained_levels(sigmas, DGPOConfig(levels=8))


def test_the_old_policys_decay():
    """The paper's constant 0.3; the code's ramp min(0.001 s, 0.3) from the run's first step (s = 0)."""
    assert [DGPOConfig().decay_at(s) for s in (0, 5, 1000)] == [0.3, 0.3, 0.3]
    ramp = DGPOConfig(old_ramp=0.001)
    assert [ramp.decay_at(s) for s in (0, 100, 299, 300, 5000)] == pytest.approx([0, 0.1, 0.299, 0.3, 0.3])


@pytest.mark.parametrize(
    "sets",
    [
        ["dgpo.beta=0"],
        ['dgpo.loss="dpo"'],
        ['dgpo.reference="ema"'],
        ["dgpo.t_min=1"],
        ["dgpo.clip_range=-0.1"],
        ["dgpo.old_decay=1"],
        ["dgpo.old_ramp=-1"],
        ["dgpo.levels=0"],
        ["dgpo.steps=1.5"],
        ["dgpo.sample_old_after=-1"],
        ['dgpo.shared_noise="yes"'],
    ],
)
def test_bad_dgpo_settings(sets):
    with pytest.raises(ConfigError, match="^dgpo\\."):
        load_config("dgpo", sets=sets)


def test_bad_settings_are_refused_in_one_line(tmp_path):
    one_line_error(run("train", "--preset", "dgpo", "--set", 'dgpo.loss="dpo"', "--run-dir", tmp_path / "a"),
                   "dgpo.loss must be one of paper, code")  # fmt: skip
    one_line_error(run("train", "--preset", "dgpo", "--set", "dgpo.levels=8", "--run-dir", tmp_path / "b"),
                   "dgpo.levels = 8 is more than the 7 noise levels")  # fmt: skip
    with pytest.raises(ConfigError, match="replicate"):
        load_config("dgpo", sets=['train.parallel="fsdp"'])


# --- the loop --------------------------------------------------------------------------------------------------

SMALL = ["rollout.num_prompts=2", "tree.trees_per_prompt=3", "train.eval_samples=0", "train.sample_every=0"]


def _trainer(preset="dgpo", extra=()):
    return Trainer(load_config(preset, sets=[*SMALL, *extra]), "cpu")


def test_an_iteration_takes_one_step_and_the_old_policy_trails():
    """One optimizer step of every leaf at 4 levels; s = 0 before it (the policy is its reference): the loss is
    log 2; old = 0.3 initial + 0.7 trained; the FLOPs count the trained forward and backward, the no-gradient one
    and the reference's."""
    t = _trainer()
    prompts = load_prompts("shapes-train")
    before = [p.detach().clone() for p in t.policy.trainable_parameters()]
    row = t.iteration(prompts, lambda *a: None)
    assert row["optimizer_steps"] == 1 and row["leaves"] == 6 and row["train_evals"] == 6 * 4
    assert row["loss"] == pytest.approx(math.log(2)) and row["grad_norm"] > 0 and row["old_decay"] == 0.3
    theta = [p.detach() for p in t.policy.trainable_parameters()]
    for o, a, b in zip(t.update.old.tensors, before, theta, strict=True):
        torch.testing.assert_close(o, 0.3 * a + 0.7 * b)
    fwd, bwd = t.flops_row
    assert t.add_to_totals(row)["flops"] == 60 * fwd + 24 * (fwd + bwd + 2 * fwd)


def test_the_rollout_samples_with_the_old_policy_only_past_the_switch():
    t = _trainer(extra=["dgpo.sample_old_after=1"])
    with torch.no_grad():
        for o in t.update.old.tensors:
            o.add_(1.0)
    trained = [p.detach().clone() for p in t.policy.trainable_parameters()]
    for done, old in ((1, False), (2, True)):
        t.update.done = done
        with t.sampling_policy():
            now = [p.detach().clone() for p in t.policy.trainable_parameters()]
        expect = t.update.old.tensors if old else trained
        assert all(torch.equal(a, b) for a, b in zip(now, expect, strict=True)), done
    assert all(torch.equal(p, q) for p, q in zip(t.policy.trainable_parameters(), trained, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["dgpo", "tree-dgpo"])
def test_each_preset_trains_two_iterations(preset, tmp_path):
    sets = ["rollout.num_prompts=2", "train.eval_samples=0", "train.sample_every=0"]
    sets += ["tree.trees_per_prompt=4"] if preset == "dgpo" else []
    r = run("train", "--preset", preset, *(x for s in sets for x in ("--set", s)), "--iterations", 2,
            "--run-dir", tmp_path / "run")  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = read_metrics(tmp_path / "run")
    assert [row["iteration"] for row in rows] == [0, 1]
    assert [undeclared(row, MetricsRow) for row in rows] == [[], []]
    assert all(row["grad_norm"] > 0 and row["train_evals"] == row["leaves"] * 4 for row in rows)
    assert rows[0]["leaves"] == (8 if preset == "dgpo" else 54)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["dgpo", "tree-dgpo"])
def test_resume_repeats_the_run_bitwise(preset, tmp_path):
    """The switch to the old policy (after iteration 1), its clip and the code's ramp cross the resume."""
    small = SMALL if preset == "dgpo" else [*SMALL[:1], "tree.split_steps=[0, 4]", *SMALL[2:]]
    sets = [*small, "train.save_every=1", "dgpo.sample_old_after=1", "dgpo.clip_range=0.01", "dgpo.old_ramp=0.1"]
    args = ["--preset", preset, *(x for s in sets for x in ("--set", s))]
    assert run("train", *args, "--iterations", 3, "--run-dir", tmp_path / "a").exit_code == 0
    assert run("train", *args, "--iterations", 2, "--run-dir", tmp_path / "b").exit_code == 0
    r = run("train", "--resume", tmp_path / "b", "--iterations", 3)
    assert r.exit_code == 0, r.output
    assert without_timings(read_metrics(tmp_path / "b")) == without_timings(read_metrics(tmp_path / "a"))
    a, b = (load_checkpoint(list_checkpoints(tmp_path / x / "checkpoints")[-1]) for x in "ab")
    assert a.step == b.step == 3 and a.old is not None and b.old is not None
    for k in a.model:
        assert torch.equal(a.model[k], b.model[k]) and torch.equal(a.old[k], b.old[k]), k


@pytest.mark.slow
@pytest.mark.parametrize("preset,iteration", [("dgpo", 0), ("tree-dgpo", 3)])
def test_staged_equals_online(preset, iteration, tmp_path):
    """rollout, score, train --trees with train.objective = dgpo: the same weights and old policy after the update
    as the online iteration's (both from the initial weights)."""
    sets = ['model="pixel-tiny"', "rollout.num_prompts=3", "seed=7", "dgpo.clip_range=0.01"]
    sets += ["tree.trees_per_prompt=3"] if preset == "dgpo" else []
    cfg = load_config(preset, sets=sets)
    trainer = Trainer(cfg, "cpu")
    trainer.step = iteration
    row = trainer.iteration(load_prompts(cfg.rollout.prompts), lambda *a: None)
    assert row["optimizer_steps"] == 1 and row["grad_norm"] > 0
    trees, run_dir = tmp_path / "trees", tmp_path / "run"
    args = [x for s in sets for x in ("--set", s)]
    for cmd in (("rollout", "--preset", preset, *args, "--iteration", iteration, "--out", trees), ("score", trees)):
        assert run(*cmd).exit_code == 0
    r = run("train", "--trees", trees, "--run-dir", run_dir, "--json")
    assert r.exit_code == 0, r.output
    ck = load_checkpoint(Path(json.loads(r.stdout)["checkpoint"]))
    assert [undeclared(row, MetricsRow) for row in read_metrics(run_dir)] == [[]]
    for k, v in trainer.policy.trainable_state().items():
        assert torch.equal(v, ck.model[k]), k
        assert torch.equal(trainer.checkpoint({}).old[k], ck.old[k]), k


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    """The groups of each optimizer step, the levels and the noises do not depend on the process layout."""
    sets = ["rollout.num_prompts=4", "tree.trees_per_prompt=2", "train.eval_samples=0", "train.sample_every=0"]
    sets += ["dgpo.steps=2", "dgpo.clip_range=0.01", "train.kl_beta=0.02"]
    args = ["--preset", "dgpo", "--iterations", 2, "--seed", 3, *(x for s in sets for x in ("--set", s))]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    rows = [[{k: v for k, v in r.items() if not k.startswith(NOT_SMOOTH)} for r in read_metrics(tmp_path / x)]
            for x in ("two", "one")]  # fmt: skip
    close(*rows)


NOT_SMOOTH = ("monitor/jpeg",)  # JPEG sizes of the images, whole bytes: a last-bit change of the weights moves them


def test_the_update_does_not_depend_on_its_chunks():
    """rollout.max_batch = 1 forwards one row at a time: the same gradient at the step as all rows at once."""
    prompts, grads = load_prompts("shapes-train"), []
    for extra in ((), ("rollout.max_batch=1",)):
        t = _trainer(extra=["dgpo.clip_range=0.01", "train.kl_beta=0.01", *extra])
        step = t.opt.step

        def record(*a, step=step, t=t, **k):
            grads.append([p.grad.clone() for p in t.policy.trainable_parameters()])
            return step(*a, **k)

        t.opt.step = record
        t.iteration(prompts, lambda *x: None)
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-6)  # batched matmuls round differently

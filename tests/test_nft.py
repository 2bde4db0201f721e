"""DiffusionNFT (engine/nft.py, train.objective = "nft"): the loss and its gradient on hand-made tensors, r from
advantages, the old policy's decay schedules and soft update, and the training loop end to end (old policy
sampling, one optimizer step of the mean, exact resume, one process against two)."""

import pytest
import torch
from clitools import close, run, treegrpo

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.nft import NFTConfig, OldPolicy, decay_at, nft_loss, optimality
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.prompts import load_prompts
from treegrpo_cli.store.checkpoint import list_checkpoints, load_checkpoint
from treegrpo_cli.training.runlog import read_metrics, without_timings
from treegrpo_cli.training.trainer import Trainer

# --- the loss, by hand -------------------------------------------------------------------------------


def test_nft_loss_and_gradient_on_one_element():
    """x0 = 1, t = 0.5, x_t = 0.2, v = 0.4, v_old = 0.2, r = 0.75, beta = 1, scale 5:
    v+ = 0.4, v- = 2(0.2) - 0.4 = 0; x0+ = 0.2 - 0.2 = 0 (error -1, weight 1, term 1);
    x0- = 0.2 (error -0.8, weight 0.8, term 0.64 / 0.8 = 0.8); L = 5 (0.75 + 0.25 x 0.8) = 4.75.
    dL/dv = 5 (0.75 x 2(-1)(-0.5) / 1 + 0.25 x 2(-0.8)(+0.5) / 0.8) = 5 (0.75 - 0.25) = 2.5."""
    v = torch.tensor([[0.4]], requires_grad=True)
    loss = nft_loss(v, torch.tensor([[0.2]]), torch.tensor([[0.2]]), torch.tensor([[1.0]]), torch.tensor([0.5]),
                    torch.tensor([0.75]), beta=1.0, scale=5.0)  # fmt: skip
    assert loss.item() == pytest.approx(4.75, abs=1e-6)
    loss.sum().backward()
    assert v.grad.item() == pytest.approx(2.5, abs=1e-6)


def test_nft_loss_means_over_elements_and_divides_by_beta():
    """Two elements, x0 = (1, -1), x_t = 0, t = 1, v = 0, v_old = (-1, 1), beta = 0.5, r = 1:
    v+ = 0.5 v_old = (-0.5, 0.5); x0+ = -v+ = (0.5, -0.5); error (-0.5, 0.5), weight mean|error| = 0.5;
    term = mean(0.25) / 0.5 = 0.5; L = 5 x 0.5 / 0.5 = 5. With de_i/dv_i = -t beta = -0.5:
    dL/dv_i = (5 / 0.5) x (1/2) x 2 e_i (-0.5) / 0.5 = -10 e_i = (5, -5)."""
    v = torch.zeros(1, 2, requires_grad=True)
    loss = nft_loss(v, torch.tensor([[-1.0, 1.0]]), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1),
                    torch.ones(1), beta=0.5, scale=5.0)  # fmt: skip
    assert loss.item() == pytest.approx(5.0, abs=1e-6)
    loss.sum().backward()
    assert v.grad.flatten().tolist() == pytest.approx([5.0, -5.0], abs=1e-5)


def test_the_adaptive_weight_has_a_floor_and_no_gradient():
    """An exact prediction: error 0, weight floored at 1e-5, loss 0 and a zero gradient (not NaN)."""
    v = torch.tensor([[0.0]], requires_grad=True)
    loss = nft_loss(
        v, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), torch.ones(1), torch.ones(1), beta=1.0, scale=5.0
    )
    loss.sum().backward()
    assert loss.item() == 0 and v.grad.item() == 0


@pytest.mark.parametrize(
    "mode, adv, r",
    [
        ("all", [0.0, 5.0, -7.0, 2.5, -1.0], [0.5, 1.0, 0.0, 0.75, 0.4]),
        ("positive_only", [-3.0, 3.0], [0.5, 0.8]),
        ("negative_only", [3.0, -3.0], [0.5, 0.2]),
        ("one_only", [0.1, -0.1], [0.6, 0.5]),
        ("binary", [-0.2, 0.0, 4.0], [0.4, 0.5, 0.6]),
    ],
)
def test_optimality_from_advantages(mode, adv, r):
    """r = clip(A, +-5) / 5 / 2 + 0.5 after the code's adv_mode (one_only: 1 where A > 0; binary: sign A)."""
    got = optimality(torch.tensor(adv), NFTConfig(adv_mode=mode))
    assert got.tolist() == pytest.approx(r, abs=1e-6)


def test_decay_schedules():
    """The code's return_decay: type 0 a hard copy; type 1 min(0.001 s, 0.5); type 2 0 until 75, then
    min(0.0075 (s - 75), 0.999)."""
    assert [decay_at(s, "hard") for s in (0, 10, 10_000)] == [0.0, 0.0, 0.0]
    assert [decay_at(s, "ramp") for s in (0, 100, 499, 500, 10_000)] == pytest.approx([0, 0.1, 0.499, 0.5, 0.5])
    got = [decay_at(s, "delayed-ramp") for s in (0, 74, 75, 76, 208, 300)]
    assert got == pytest.approx([0, 0, 0, 0.0075, 0.9975, 0.999])


def test_the_old_policy_soft_update_and_swap():
    net = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0]]))
    old = OldPolicy(list(net.parameters()))
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[3.0, 6.0]]))
    x = torch.tensor([[1.0, 1.0]])
    with old.swapped(list(net.parameters())):
        assert net(x).item() == 3.0  # the old weights
    assert net(x).item() == 9.0 and net.weight.requires_grad  # the trained ones back, still a parameter
    old.follow(list(net.parameters()), 0.25)  # 0.25 old + 0.75 theta
    assert old.tensors[0].tolist() == [[2.5, 5.0]]
    old.follow(list(net.parameters()), 0.0)  # a hard copy
    assert old.tensors[0].tolist() == [[3.0, 6.0]]


@pytest.mark.parametrize(
    "sets", [["nft.beta=0"], ['nft.adv_mode="some"'], ['nft.decay="linear"'], ["nft.timestep_fraction=0"]]
)
def test_bad_nft_settings(sets):
    with pytest.raises(ConfigError, match="nft"):
        load_config("nft", sets=sets)


def test_nft_is_refused_with_fsdp():
    with pytest.raises(ConfigError, match="replicate"):
        load_config("nft", sets=['train.parallel="fsdp"'])


# --- the loop --------------------------------------------------------------------------------------------

SMALL = ["rollout.num_prompts=2", "tree.trees_per_prompt=3", "train.eval_samples=0", "train.sample_every=0"]


def _trainer(preset="nft", extra=()):
    return Trainer(load_config(preset, sets=[*SMALL, *extra]), "cpu")


@pytest.mark.slow
def test_an_nft_iteration_samples_with_the_old_policy_and_takes_one_step():
    """Rollouts use the old weights (the trained ones differ after a step, the old ones trail them by the decay),
    one optimizer step of every leaf at 9 of 10 levels, one EMA update, 3 forwards per trained row in the FLOPs."""
    t = _trainer()
    prompts = load_prompts("shapes-train")
    before = [p.detach().clone() for p in t.policy.trainable_parameters()]
    row = t.iteration(prompts, lambda *a: None)
    assert row["adv_std"] > 0.5 and row["grad_norm"] > 0  # the rewards differ: something to learn
    assert row["optimizer_steps"] == 1 and row["ema_updates"] == 1 and row["leaves"] == 6
    assert row["train_evals"] == 6 * 9 and row["rollout_evals"] == 6 * 10
    theta = [p.detach() for p in t.policy.trainable_parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(theta, before, strict=True))
    d = row["old_decay"]
    assert d == pytest.approx(0.001)
    for o, a, b in zip(t.update.old.tensors, before, theta, strict=True):  # old = d x initial + (1 - d) x trained
        torch.testing.assert_close(o, d * a + (1 - d) * b)
    fwd, bwd = t.flops_row
    assert t.add_to_totals(row)["flops"] == 60 * fwd + 54 * (
        fwd + bwd + 2 * fwd
    )  # rollout; theta, old and reference forwards
    t2 = _trainer(extra=["nft.steps=2"])
    assert t2.iteration(prompts, lambda *a: None)["optimizer_steps"] == 2


def test_the_rollout_uses_the_old_weights():
    t = _trainer()
    with torch.no_grad():
        for o in t.update.old.tensors:
            o.add_(1.0)
    old = [o.clone() for o in t.update.old.tensors]
    trained = [p.detach().clone() for p in t.policy.trainable_parameters()]
    with t.sampling_policy():
        assert all(torch.equal(p, o) for p, o in zip(t.policy.trainable_parameters(), old, strict=True))
    assert all(torch.equal(p, q) for p, q in zip(t.policy.trainable_parameters(), trained, strict=True))
    assert all(torch.equal(o, q) for o, q in zip(t.update.old.tensors, old, strict=True))


@pytest.mark.slow
def test_nft_resume_repeats_the_run_and_keeps_the_old_policy(tmp_path):
    args = ["--preset", "nft", *(x for s in SMALL for x in ("--set", s)), "--set", "train.save_every=1"]
    assert run("train", *args, "--iterations", 3, "--run-dir", tmp_path / "a").exit_code == 0
    assert run("train", *args, "--iterations", 2, "--run-dir", tmp_path / "b").exit_code == 0
    ck = load_checkpoint(list_checkpoints(tmp_path / "b" / "checkpoints")[-1])
    assert ck.old is not None and set(ck.old) == set(ck.model) and ck.ema is not None
    assert any(not torch.equal(ck.old[k], ck.model[k]) for k in ck.model)
    r = run("train", "--resume", tmp_path / "b", "--iterations", 3)
    assert r.exit_code == 0, r.output

    def same(rows):
        return without_timings(rows)

    assert same(read_metrics(tmp_path / "b")) == same(read_metrics(tmp_path / "a"))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["nft", "tree-nft"])
def test_two_processes_match_one_for_nft(preset, tmp_path):
    """The samples of each optimizer step, their noise levels and noises do not depend on the process layout."""
    sets = ["rollout.num_prompts=4", "tree.trees_per_prompt=2", "train.eval_samples=0", "train.sample_every=0"]
    sets += ["tree.split_steps=[0, 3]"] if preset == "tree-nft" else []  # 9 leaves a tree, not 27: still a tree
    args = ["--preset", preset, "--iterations", 2, "--seed", 3, *(x for s in sets for x in ("--set", s))]
    one = treegrpo(*args, "--run-dir", tmp_path / "one", timeout=600)
    assert one.returncode == 0, one.stderr
    two = treegrpo(*args, "--run-dir", tmp_path / "two", nproc=2, timeout=600)
    assert two.returncode == 0, two.stderr
    close(read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one"))

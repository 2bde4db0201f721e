"""Coefficients-preserving sampling (sampler.noise = "cps"): the step from its formula, the released code's
numbers, the marginals of Gaussian data, the deterministic last step, and rollouts with it."""

import math

import pytest
import torch
from test_sde import M, _exact_velocity, _marginal

from treegrpo_cli.config import load_config
from treegrpo_cli.engine.rollout import rollout
from treegrpo_cli.engine.sde import FlowSDE, SamplerConfig, squared_error_log_prob
from treegrpo_cli.errors import ConfigError
from treegrpo_cli.models.registry import load_policy


def _cps(eta: float = 0.7, **kw) -> FlowSDE:
    return FlowSDE(SamplerConfig(steps=10, noise="cps", eta=eta, **kw))


def test_cps_step_from_its_formula():
    """std = sigma' sin(eta pi / 2); mean = (1 - sigma') (x - sigma v) + sqrt(sigma'^2 - std^2) (x + (1 - sigma) v)."""
    sde = _cps(0.5)
    x, v = torch.randn(3, 2, 4, 4, dtype=torch.float64), torch.randn(3, 2, 4, 4, dtype=torch.float64)
    i = torch.tensor([0, 4, 8])
    res = sde.step(x, v, i, torch.ones(3, dtype=torch.bool))
    for b, step in enumerate(i.tolist()):
        s, n = float(sde.sigmas[step]), float(sde.sigmas[step + 1])
        std = n * math.sqrt(0.5)  # sin(pi / 4)
        mean = (1 - n) * (x[b] - s * v[b]) + math.sqrt(n * n - std * std) * (x[b] + (1 - s) * v[b])
        assert res.std[b].item() == pytest.approx(std, rel=1e-6)
        torch.testing.assert_close(res.mean[b].double(), mean, rtol=0, atol=1e-5)
        torch.testing.assert_close(res.x0[b].double(), x[b] - s * v[b], rtol=0, atol=1e-5)


# IamCreateAI/FlowCPS, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py (commit of 2025, the Flow-CPS branch of
# sde_step_with_logprob), run on FlowMatchEulerDiscreteScheduler(shift=3).set_timesteps(10), noise_level 0.7,
# x = linspace(-1.2, 0.9, 16), v = cos(0..15), prev_sample = sin(0.7 * (0..15)), each viewed [2, 2, 2, 2].
RELEASED = {
    (0, 3): (
        [-0.610783, -0.525848, -0.421107, -0.331621, -0.278425, -0.24919, -0.209556, -0.134726]
        + [-0.026745, 0.151403, 0.22171, 0.192704, 0.164222, 0.235618, 0.41442, 0.609406],
        [0.855482, 0.704223],
        [-0.836455, -0.564576],
    ),
    (5, 8): (
        [-1.006833, -0.820293, -0.533724, -0.324198, -0.297957, -0.392731, -0.434988, -0.299481]
        + [-0.039941, 0.308118, 0.427789, 0.337136, 0.247592, 0.369571, 0.719015, 1.102734],
        [0.53652, 0.007955],
        [-0.991971, -0.798779],
    ),
}


@pytest.mark.parametrize("steps", sorted(RELEASED))
def test_cps_step_equals_the_released_flowcps_step(steps):
    sde = FlowSDE(SamplerConfig(steps=10, shift=3.0, grid="flow-match-euler", noise="cps", eta=0.7))
    x = torch.linspace(-1.2, 0.9, 16).view(2, 2, 2, 2)
    v = torch.cos(torch.arange(16.0)).view(2, 2, 2, 2)
    prev = torch.sin(torch.arange(16.0) * 0.7).view(2, 2, 2, 2)
    res = sde.step(x, v, torch.tensor(steps), torch.ones(2, dtype=torch.bool))
    mean, std, lp = RELEASED[steps]
    torch.testing.assert_close(res.mean.flatten(), torch.tensor(mean), rtol=0, atol=2e-6)
    torch.testing.assert_close(res.std, torch.tensor(std), rtol=0, atol=2e-6)
    code = FlowSDE(dataclass_replace(sde.cfg, log_prob_form="squared-error"))
    torch.testing.assert_close(code.log_prob(prev, res.mean, res.std), torch.tensor(lp), rtol=0, atol=2e-6)
    # the paper's form is the Gaussian log-density, not the code's squared error
    assert not torch.allclose(sde.log_prob(prev, res.mean, res.std), torch.tensor(lp), atol=1e-2)


def dataclass_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_squared_error_log_prob_golden_value():
    x, mean = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])
    assert squared_error_log_prob(x, mean, "mean").item() == pytest.approx(-(1 + 4) / 2)
    assert squared_error_log_prob(x, mean, "sum").item() == pytest.approx(-5.0)


@pytest.mark.parametrize("eta", [0.3, 0.7, 1.0])
def test_cps_keeps_the_forward_coefficients_of_a_known_image(eta):
    """What "coefficients-preserving" means, checked by sampling: with one clean image x0 = M (its exact
    velocity), a step from x = (1 - sigma) M + sigma eps lands on x' = (1 - sigma') M + sigma' eps' with eps'
    unit Gaussian: the forward process' law at sigma' (mean and variance), and eps' keeps a share
    cos(eta pi / 2) of eps (the correlation of x and x'). Changing the sqrt term's sign or dropping or changing
    the sin factor fails it (tried: at eta 0.3, where 0.89 is due, the correlation
    comes out -0.89 with the sign flipped, 0.95 with std = sigma' eta, 0.00 with std = sigma')."""
    sde = FlowSDE(SamplerConfig(steps=10, noise="cps", eta=eta))
    g = torch.Generator().manual_seed(0)
    n = 200_000
    for i in (0, 3, 6, 8):
        s, s_next = float(sde.sigmas[i]), float(sde.sigmas[i + 1])
        x = (1 - s) * M + s * torch.randn(n, 1, 1, 1, generator=g)
        v = (x - (1 - s) * M) / s - M  # E[eps - x0 | x] when x0 = M
        out = sde.step(x, v, torch.full((n,), i), torch.ones(n, dtype=torch.bool))
        x2 = out.mean + out.std.view(-1, 1, 1, 1) * torch.randn(x.shape, generator=g)
        assert float(x2.mean()) == pytest.approx((1 - s_next) * M, abs=0.01)
        assert float(x2.std()) == pytest.approx(s_next, rel=0.01)
        corr = float(torch.corrcoef(torch.stack([x.flatten(), x2.flatten()]))[0, 1])
        assert corr == pytest.approx(math.cos(eta * math.pi / 2), abs=0.01), (i, corr)


@pytest.mark.slow
@pytest.mark.parametrize("eta", [0.3, 0.7])
def test_cps_with_spread_data_keeps_the_mean_and_never_adds_variance(eta):
    """With Gaussian data of spread S (the marginal test of the other noise forms, test_sde.py) each CPS step keeps
    the forward mean, and its variance is at most the forward one: x0 and eps are replaced by their posterior
    means, and (Cauchy-Schwarz) their combination has no more variance than the forward process; unlike the SDE
    forms, whose noise shrinks with the step, CPS's fixed noise share lets the deficit build up over many steps."""
    sde = FlowSDE(SamplerConfig(steps=200, shift=1.0, noise="cps", eta=eta))
    g = torch.Generator().manual_seed(0)
    n = 100_000
    x = torch.randn(n, 1, 1, 1, generator=g)
    for i in range(sde.cfg.steps - 1):
        sigma = sde.sigmas[i].float()
        out = sde.step(x, _exact_velocity(x, sigma), torch.full((n,), i), torch.ones(n, dtype=torch.bool))
        x = out.mean + out.std.view(-1, 1, 1, 1) * torch.randn(x.shape, generator=g)
        mean, var = _marginal(float(sde.sigmas[i + 1]))
        assert abs(float(x.mean()) - mean) < 0.01, (i, float(x.mean()), mean)
        assert float(x.var()) < var * 1.01, (i, float(x.var()), var)


def test_cps_ode_step_is_euler_and_the_last_step_draws_no_noise():
    sde = _cps()
    x, v = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    i = torch.tensor([2, 9])
    ode = sde.step(x, v, i, torch.zeros(2, dtype=torch.bool))
    d = (sde.sigmas[i + 1] - sde.sigmas[i]).float().view(-1, 1, 1, 1)
    torch.testing.assert_close(ode.mean, x + d * v, rtol=0, atol=1e-6)
    last = sde.step(x, v, i, torch.ones(2, dtype=torch.bool))
    assert last.std[1] == 0 and last.std[0] > 0
    assert [sde.has_noise(s) for s in range(10)] == [True] * 9 + [False]
    assert all(FlowSDE(SamplerConfig(steps=10, noise=k)).has_noise(9) for k in ("dance", "flow"))


def test_a_cps_rollout_marks_the_last_step_deterministic():
    """Every SDE preset takes --set sampler.noise=cps: the last step is an ODE edge (no log-prob to train),
    the others keep their noise, and log-probs stay finite."""
    cfg = load_config("dance-grpo", sets=['sampler.noise="cps"', "sampler.eta=0.7", "sampler.steps=4"])
    policy = load_policy("tiny-shapes")
    tree, _ = rollout(policy, ["a red circle"], [0], FlowSDE(cfg.sampler), cfg.tree, seed=0)
    last = tree.depth == cfg.sampler.steps
    assert not tree.sde[last].any() and tree.sde[(tree.depth > 0) & ~last].all()
    assert torch.isfinite(tree.log_prob[tree.sde]).all()


def test_a_cps_split_at_the_last_step_is_refused():
    with pytest.raises(ConfigError, match="no noise at the last step"):
        load_config("branch", sets=['sampler.noise="cps"', "tree.split_steps=[0, 19]", 'sampler.decode="final"'])
    load_config("branch", sets=['sampler.noise="cps"'])  # splits 0, 3, 6, 9 of 20: fine

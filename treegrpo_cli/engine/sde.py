"""Flow-matching transitions for RL: sigma grids, the Euler ODE step, the SDE step and its log-prob.

One self-contained sampler, in the spirit of a diffusers scheduler. Notation (methods.md 1.2):
state x at noise level sigma, next level sigma', d = sigma' - sigma < 0, velocity v = v_theta(x, sigma, c).

    ODE:   x' = x + d*v
    SDE:   mean = x + d*v + (g^2 / (2*sigma)) * (x + (1 - sigma)*v) * d,   std = g*sqrt(-d)

The diffusion coefficient g is either a constant eta (DanceGRPO, BranchGRPO; "dance") or
a*sqrt(sigma/(1-sigma)) (Flow-GRPO, MixGRPO, TreeGRPO; "flow"), where at sigma = 1 the
denominator uses the grid's second value instead (as Flow-GRPO does).

Coefficients-preserving sampling ("cps"; Wang and Yu, arXiv 2509.05952; methods.md 15) predicts the
clean image and the noise, and recombines them at the next level with the noise share split between the
prediction and fresh noise:

    x0 = x - sigma*v,   eps = x + (1 - sigma)*v,   std = sigma' sin(eta pi / 2)
    mean = (1 - sigma') x0 + sqrt(sigma'^2 - std^2) eps

At sigma' = 0 (the last step) it draws no noise: that step is deterministic (`has_noise`).

All arithmetic is fp32 whatever the model dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError, shown
from .protocols import Kernel, StepResult

GRIDS = ("shifted", "flow-match-euler", "model")
NOISES = ("dance", "flow", "cps")
LOG_PROB_FORMS = ("gaussian", "squared-error")
SOLVERS = ("euler", "dpm2")
REDUCTIONS = ("mean", "sum")
DECODES = ("x0", "final")
# Stated maxima, checked before any work: the references sample 10 to 50 steps; 1000 is a flow model's whole
# training grid. Every count of a tree (nodes, model evaluations) grows with the steps.
MAX_STEPS = 1000
MAX_TRAIN_TIMESTEPS = 100_000  # the flow-match-euler grid's training timesteps (diffusers' SD3: 1000)


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = 20  # T denoising steps
    shift: float = 3.0  # time shift s of the sigma grid
    # "shifted": s*u/(1+(s-1)*u) on u = linspace(1, 0, T+1); "flow-match-euler": diffusers' SD3 grid;
    # "model": the diffusers model's own scheduler at its resolution (the dynamic shift of FLUX.2, Qwen-Image)
    grid: str = "shifted"
    noise: str = "dance"  # "dance": g = eta; "flow": g = eta*sqrt(sigma/(1-sigma)); "cps": std = sigma' sin(eta pi/2)
    eta: float = 0.3  # the noise level (eta for dance, a for flow and cps)
    log_prob_reduction: str = "mean"  # "mean" over latent elements (every reference) or "sum"
    log_prob_form: str = "gaussian"  # "gaussian": log N(x'; mean, std^2) (the papers) | "squared-error":
    # -(x' - mean)^2, no variance and no constants (the released CPS codes)
    decode: str = "x0"  # "x0": decode the last step's x0-prediction (references); "final": the final sample
    num_train_timesteps: int = 1000  # only for the flow-match-euler grid
    solver: str = "euler"  # deterministic (ODE) steps: "euler" | "dpm2", the second-order multistep DPM-Solver++
    # in data prediction (DiffusionNFT's sampler): steps 1..T-2 use the parent's x0-prediction too

    def validate(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"sampler.steps must be >= 1, got {self.steps}")
        if self.steps > MAX_STEPS:
            raise ConfigError(f"sampler.steps = {self.steps:,} is more than the maximum of {MAX_STEPS:,} steps")
        if not 1 <= self.num_train_timesteps <= MAX_TRAIN_TIMESTEPS:
            raise ConfigError(
                f"sampler.num_train_timesteps must be in 1..{MAX_TRAIN_TIMESTEPS:,} (the maximum), "
                f"got {self.num_train_timesteps:,}"
            )
        if self.shift <= 0:
            raise ConfigError(f"sampler.shift must be > 0, got {self.shift}")
        if self.eta < 0:
            raise ConfigError(f"sampler.eta must be >= 0, got {self.eta}")
        for name, value, allowed in (
            ("grid", self.grid, GRIDS),
            ("noise", self.noise, NOISES),
            ("log_prob_form", self.log_prob_form, LOG_PROB_FORMS),
            ("solver", self.solver, SOLVERS),
            ("log_prob_reduction", self.log_prob_reduction, REDUCTIONS),
            ("decode", self.decode, DECODES),
        ):
            if value not in allowed:
                raise ConfigError(f"sampler.{name} must be one of {', '.join(allowed)}; got {shown(value)}")


def time_shift(u: Tensor, shift: float) -> Tensor:
    return shift * u / (1 + (shift - 1) * u)


def check_grid(sigmas: Tensor, steps: int) -> Tensor:
    """A given grid as [T+1] float64, refused unless it falls strictly from at most 1 to exactly 0."""
    s = torch.as_tensor(sigmas, dtype=torch.float64).flatten().cpu()
    if len(s) != steps + 1 or not bool((s[1:] < s[:-1]).all()) or float(s[0]) > 1 or float(s[-1]) != 0:
        raise ConfigError(f"a sigma grid must fall strictly from <= 1 to 0 in {steps} steps; got {shown(s.tolist())}")
    return s


def sigma_grid(cfg: SamplerConfig) -> Tensor:
    """[T+1] float64 noise levels from 1 (pure noise) down to 0."""
    T = cfg.steps
    if cfg.grid == "model":
        raise ConfigError(
            'sampler.grid = "model" takes the grid of a diffusers model\'s scheduler; this model has none '
            '(use "shifted" or "flow-match-euler")'
        )
    if cfg.grid == "shifted":
        u = torch.linspace(1.0, 0.0, T + 1, dtype=torch.float64)
        return time_shift(u, cfg.shift)
    # diffusers FlowMatchEulerDiscreteScheduler (static shift): the training sigmas are shifted
    # once at construction, their min and max span the inference grid, which is shifted again.
    n = cfg.num_train_timesteps
    train = time_shift(torch.arange(n, 0, -1, dtype=torch.float64) / n, cfg.shift)
    u = torch.linspace(float(train[0]), float(train[-1]), T, dtype=torch.float64)
    return torch.cat([time_shift(u, cfg.shift), torch.zeros(1, dtype=torch.float64)])


def diffusion_coefficient(cfg: SamplerConfig, sigma: Tensor, sigma_max_below_one: float) -> Tensor:
    """g(sigma), elementwise over a [B] tensor of noise levels."""
    if cfg.noise == "dance":
        return torch.full_like(sigma, cfg.eta)
    denom = 1 - torch.where(sigma >= 1, torch.full_like(sigma, sigma_max_below_one), sigma)
    return cfg.eta * torch.sqrt(sigma / denom)


class FlowSDE:
    """The transition kernel of a flow-matching sampler on one sigma grid."""

    def __init__(self, cfg: SamplerConfig, sigmas: Tensor | None = None):
        """sigmas [T+1]: a grid from elsewhere (sampler.grid = "model": the policy's scheduler), else sigma_grid."""
        cfg.validate()
        self.cfg = cfg
        self.sigmas = sigma_grid(cfg) if sigmas is None else check_grid(sigmas, cfg.steps)  # [T+1] float64

    def step(self, x: Tensor, v: Tensor, i: Tensor, sde: Tensor, prev_x0: Tensor | None = None) -> StepResult:
        """One transition from step i for a batch: x, v [B, ...]; i [B] int64 step index; sde [B] bool.
        prev_x0 [B, ...]: the x0-prediction of step i - 1 on the same path (sampler.solver = "dpm2")."""
        x, v = x.float(), v.float()
        i = i.cpu()
        if self.cfg.solver == "dpm2" and prev_x0 is not None and not bool(sde.any()):
            return self._dpm2_step(x, v, i, prev_x0.float())
        sigma = self.sigmas[i].float().to(x.device)  # [B]
        d = (self.sigmas[i + 1] - self.sigmas[i]).float().to(x.device)  # [B], < 0
        if self.cfg.noise == "cps":
            return self._cps_step(x, v, sigma, self.sigmas[i + 1].float().to(x.device), sde.to(x.device))
        g = diffusion_coefficient(self.cfg, sigma, float(self.sigmas[1]))
        g = torch.where(sde.to(x.device), g, torch.zeros_like(g))
        shape = (-1,) + (1,) * (x.dim() - 1)
        sb, db, gb = sigma.view(shape), d.view(shape), g.view(shape)
        mean = x + db * v + (gb**2 / (2 * sb)) * (x + (1 - sb) * v) * db
        std = g * torch.sqrt(-d)
        return StepResult(mean=mean, std=std, x0=x - sb * v)

    def _dpm2_step(self, x: Tensor, v: Tensor, i: Tensor, prev_x0: Tensor) -> StepResult:
        """DPM-Solver++(2M) in data prediction for x = (1 - sigma) x0 + sigma eps (alpha = 1 - sigma), lambda =
        log(alpha / sigma), h = lambda' - lambda, r = (lambda - lambda_prev) / h, D1 = (x0 - x0_prev) / r:
            x' = (sigma' / sigma) x - alpha' (exp(-h) - 1) (x0 + D1 / 2)
        Euler at the first and the last step (the released solver's lower orders there); at sigma_prev = 1,
        lambda_prev = -inf and D1 = 0: the first-order step."""
        shape = (-1,) + (1,) * (x.dim() - 1)
        s = self.sigmas
        sig = s[i].float().to(x.device).view(shape)
        x0 = x - sig * v
        coef = []
        for k in i.tolist():
            if k == 0 or k == self.cfg.steps - 1:
                coef.append((1.0, float(s[k + 1] - s[k]), 0.0, 0.0))  # Euler: x + d v
                continue
            lam = [
                math.log((1 - float(s[j])) / float(s[j])) if float(s[j]) < 1 else -math.inf for j in (k + 1, k, k - 1)
            ]
            h, h0 = lam[0] - lam[1], lam[1] - lam[2]
            inv_r = h / h0 if math.isfinite(h0) else 0.0
            a_next = 1 - float(s[k + 1])
            e = a_next * math.expm1(-h)
            coef.append((float(s[k + 1] / s[k]), 0.0, -e, -0.5 * e * inv_r))
        c = torch.tensor(coef, dtype=torch.float32, device=x.device)  # [B, 4]: x, v, x0, (x0 - x0_prev)
        cb = [c[:, j].view(shape) for j in range(4)]
        mean = cb[0] * x + cb[1] * v + cb[2] * x0 + cb[3] * (x0 - prev_x0)
        return StepResult(mean=mean, std=torch.zeros(x.shape[0], device=x.device), x0=x0)

    def _cps_step(self, x: Tensor, v: Tensor, sigma: Tensor, sigma_next: Tensor, sde: Tensor) -> StepResult:
        """The CPS transition (module docstring); std 0 (the Euler step) where sde is False."""
        std = sigma_next * math.sin(self.cfg.eta * math.pi / 2)  # [B]
        std = torch.where(sde, std, torch.zeros_like(std))
        shape = (-1,) + (1,) * (x.dim() - 1)
        sb, nb = sigma.view(shape), sigma_next.view(shape)
        x0, eps = x - sb * v, x + (1 - sb) * v
        mean = (1 - nb) * x0 + torch.sqrt((nb**2 - std.view(shape) ** 2).clamp(min=0)) * eps
        return StepResult(mean=mean, std=std, x0=x0)

    def has_noise(self, step: int) -> bool:
        """Whether an SDE step from `step` draws noise: not CPS's last step, whose sigma' is 0."""
        return self.cfg.noise != "cps" or float(self.sigmas[step + 1]) > 0

    def log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """[B] log-density of x_next under N(mean, std^2 I) (sampler.log_prob_form), reduced over latent elements."""
        if self.cfg.log_prob_form == "squared-error":
            return squared_error_log_prob(x_next, mean, self.cfg.log_prob_reduction)
        return gaussian_log_prob(x_next, mean, std, self.cfg.log_prob_reduction)


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor, reduction: str = "mean") -> Tensor:
    """[B] log N(x; mean, std^2) per element, then mean or sum over all but the batch dim (fp32)."""
    x, mean = x.float(), mean.float()
    s = std.float().view((-1,) + (1,) * (x.dim() - 1))
    lp = -((x - mean) ** 2) / (2 * s**2) - torch.log(s) - 0.5 * math.log(2 * math.pi)
    lp = lp.flatten(1)
    return lp.mean(1) if reduction == "mean" else lp.sum(1)


def squared_error_log_prob(x: Tensor, mean: Tensor, reduction: str = "mean") -> Tensor:
    """[B] -(x - mean)^2 per element, then mean or sum: the released CPS codes' log-prob, which drops the
    variance and the constants (a ratio of two of them is not a likelihood ratio)."""
    se = -((x.float() - mean.float()) ** 2).flatten(1)
    return se.mean(1) if reduction == "mean" else se.sum(1)


# --- the diffusion (epsilon-prediction) case: DDIM with eta, as in DDPO ------------------------

PREDICTIONS = ("epsilon", "v_prediction", "sample")


class DDIMKernel:
    """The DDIM transition (Song et al. 2021) with noise eta and its Gaussian log-prob (DDPO, Black et
    al. 2023), behind FlowSDE's interface. With abar_t the cumulative alpha at the step's timestep t and
    abar_p at t - N/T (or the scheduler's final value past 0):

        x0   = (x - sqrt(1 - abar_t) * eps) / sqrt(abar_t)
        std  = eta * sqrt((1 - abar_p) / (1 - abar_t) * (1 - abar_t / abar_p))
        mean = sqrt(abar_p) * x0 + sqrt(1 - abar_p - std^2) * eps

    `sigmas` is the model's time input on the grid, t/N for t the diffusers DDIM timesteps and 0 after
    the last step: the policy turns it back into an integer timestep. ODE steps (sde False) are DDIM
    with eta 0. All arithmetic is fp32.
    """

    def __init__(
        self,
        cfg: SamplerConfig,
        alphas_cumprod: Tensor,
        timesteps: Tensor,
        num_train_timesteps: int,
        final_alpha_cumprod: float,
        eta: float = 1.0,
        prediction_type: str = "epsilon",
        clip_sample: float | None = None,
    ):
        cfg.validate()
        if len(timesteps) != cfg.steps:
            raise ConfigError(f"DDIM grid has {len(timesteps)} timesteps for {cfg.steps} steps")
        if prediction_type not in PREDICTIONS:
            raise ConfigError(
                f"unsupported prediction type {shown(prediction_type)} (supported: {', '.join(PREDICTIONS)})"
            )
        self.cfg, self.eta, self.prediction_type, self.clip_sample = cfg, float(eta), prediction_type, clip_sample
        t = timesteps.long().cpu()
        prev = t - num_train_timesteps // cfg.steps
        abar = alphas_cumprod.double().cpu()
        self.abar = abar[t]  # [T]
        self.abar_prev = torch.where(
            prev >= 0, abar[prev.clamp(min=0)], torch.tensor(float(final_alpha_cumprod), dtype=torch.float64)
        )  # [T]
        self.variance = (1 - self.abar_prev) / (1 - self.abar) * (1 - self.abar / self.abar_prev)  # [T]
        if self.eta > 0 and not bool((self.variance > 0).all()):
            raise ConfigError(
                "a DDIM step of this scheduler has zero variance (set_alpha_to_one = true); use a "
                "scheduler config with set_alpha_to_one = false, as Stable Diffusion 1.5 has"
            )
        self.sigmas = torch.cat([t.double() / num_train_timesteps, torch.zeros(1, dtype=torch.float64)])  # [T+1]

    def _eps_x0(self, x: Tensor, out: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
        """(eps, x0) [B, ...] from the model output under its prediction type."""
        if self.prediction_type == "epsilon":
            return out, (x - (1 - a).sqrt() * out) / a.sqrt()
        if self.prediction_type == "v_prediction":
            return a.sqrt() * out + (1 - a).sqrt() * x, a.sqrt() * x - (1 - a).sqrt() * out
        return (x - a.sqrt() * out) / (1 - a).sqrt(), out

    def step(self, x: Tensor, out: Tensor, i: Tensor, sde: Tensor, prev_x0: Tensor | None = None) -> StepResult:
        """One transition from step i for a batch: x, out [B, ...]; i [B] int64 step index; sde [B] bool
        (prev_x0 is ignored: DDIM is a one-step solver)."""
        x, out = x.float(), out.float()
        i = i.cpu()
        shape = (-1,) + (1,) * (x.dim() - 1)
        a = self.abar[i].float().to(x.device).view(shape)
        ap = self.abar_prev[i].float().to(x.device).view(shape)
        eps, x0 = self._eps_x0(x, out, a)
        if self.clip_sample is not None:
            x0 = x0.clamp(-self.clip_sample, self.clip_sample)
        std = self.eta * self.variance[i].sqrt().float().to(x.device)  # [B]
        std = torch.where(sde.to(x.device), std, torch.zeros_like(std))
        mean = ap.sqrt() * x0 + (1 - ap - std.view(shape) ** 2).sqrt() * eps
        return StepResult(mean=mean, std=std, x0=x0)

    def has_noise(self, step: int) -> bool:
        return True  # every DDIM step with eta > 0 draws noise (the kernel refuses a zero-variance grid)

    def log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """[B] log-density of x_next under N(mean, std^2 I) (sampler.log_prob_form), reduced over latent elements."""
        if self.cfg.log_prob_form == "squared-error":
            return squared_error_log_prob(x_next, mean, self.cfg.log_prob_reduction)
        return gaussian_log_prob(x_next, mean, std, self.cfg.log_prob_reduction)


def make_kernel(policy: object, cfg: SamplerConfig) -> Kernel:
    """The transition kernel a policy samples with: its own `kernel(cfg)` if it has one, else FlowSDE."""
    own = getattr(policy, "kernel", None)
    return own(cfg) if callable(own) else FlowSDE(cfg)

"""Kernel two-sample statistics: KID and unbiased MMD^2, with a permutation test.

KID (Binkowski et al. 2018, "Demystifying MMD GANs", arXiv 1801.01401) is the unbiased MMD^2
(Gretton et al. 2012, "A Kernel Two-Sample Test", JMLR 13) under the cubic polynomial kernel
k(x, y) = (gamma * x.y + c)^3 with gamma = 1/dim and c = 1, averaged over random subsets of both
sets. The mean and the (population) std over subsets follow torch-fidelity and torchmetrics, and
with the same seed the subset draws are theirs: per subset randperm(n_a) then randperm(n_b).

Everything is float64. The statistics work on one pooled kernel matrix K over z = [A; B]
([N, N], N = n_a + n_b, 8 N^2 bytes), so the KID subsets, the full-set MMD^2 and every
permutation of the test index into the same matrix instead of recomputing kernels. All of them
assume independent samples within a set (see report.py for the leaves of a tree).
"""

from __future__ import annotations

import torch
from torch import Tensor

# --- kernels ---------------------------------------------------------------------------------


def poly_kernel(x: Tensor, y: Tensor, degree: int = 3, gamma: float | None = None, coef: float = 1.0) -> Tensor:
    """[M, D], [N, D] -> [M, N]: (gamma * x.y + coef)^degree, gamma = 1/D by default."""
    gamma = 1.0 / x.shape[1] if gamma is None else gamma
    k = x.double() @ y.double().T  # [M, N]
    return k.mul_(gamma).add_(coef).pow_(degree)


def sq_dists(x: Tensor, y: Tensor) -> Tensor:
    """[M, D], [N, D] -> [M, N] squared Euclidean distances (clamped at 0 against round-off)."""
    x, y = x.double(), y.double()
    d2 = x @ y.T  # [M, N]
    d2.mul_(-2).add_((x * x).sum(1)[:, None]).add_((y * y).sum(1)[None, :])
    return d2.clamp_(min=0)


def gaussian_kernel(x: Tensor, y: Tensor, bandwidth: float) -> Tensor:
    """[M, D], [N, D] -> [M, N]: exp(-|x - y|^2 / (2 sigma^2)) with sigma = bandwidth."""
    if not bandwidth > 0:
        raise ValueError(f"the Gaussian bandwidth must be > 0, got {bandwidth}")
    return sq_dists(x, y).div_(-2.0 * bandwidth**2).exp_()


def median_bandwidth(z: Tensor, generator: torch.Generator, max_points: int = 1000) -> float:
    """The median pairwise distance of z [N, D] (over at most max_points random rows); the
    lower median, as torch.median. 1.0 when every point is the same."""
    idx = torch.randperm(z.shape[0], generator=generator)[:max_points].to(z.device)
    sub = z[idx]  # [n, D]
    d2 = sq_dists(sub, sub)  # [n, n]
    i, j = torch.triu_indices(sub.shape[0], sub.shape[0], offset=1, device=z.device)
    if i.numel() == 0:
        return 1.0
    med = float(d2[i, j].sqrt().median())
    return med if med > 0 else 1.0


# --- MMD^2 -----------------------------------------------------------------------------------


def mmd2_unbiased(kxx: Tensor, kyy: Tensor, kxy: Tensor) -> float:
    """Unbiased MMD^2 from kernel blocks kxx [m, m], kyy [n, n], kxy [m, n] (m, n >= 2):
    mean of k over x != x' pairs + the same for y - 2 * mean of k(x, y)."""
    m, n = kxx.shape[0], kyy.shape[0]
    if m < 2 or n < 2:
        raise ValueError(f"unbiased MMD^2 needs at least 2 samples per set, got {m} and {n}")
    sxx = kxx.sum() - kxx.diagonal().sum()
    syy = kyy.sum() - kyy.diagonal().sum()
    return float(sxx / (m * (m - 1)) + syy / (n * (n - 1)) - 2 * kxy.sum() / (m * n))


def mmd2_pooled(k: Tensor, n_a: int) -> float:
    """Unbiased MMD^2 of A = rows 0..n_a-1 against B = the rest of a pooled kernel matrix [N, N]."""
    return mmd2_unbiased(k[:n_a, :n_a], k[n_a:, n_a:], k[:n_a, n_a:])


def kid(
    k: Tensor, n_a: int, subsets: int = 100, subset_size: int = 1000, generator: torch.Generator | None = None
) -> tuple[float, float, Tensor]:
    """KID from a pooled polynomial kernel matrix k [N, N] (A first): unbiased MMD^2 of `subsets`
    random subset pairs of `subset_size` (drawn without replacement within a subset).
    Returns (mean, population std, the [subsets] values)."""
    n_b = k.shape[0] - n_a
    if not 2 <= subset_size <= min(n_a, n_b):
        raise ValueError(f"KID subset size must be in 2..{min(n_a, n_b)} (the smaller set), got {subset_size}")
    vals = torch.empty(subsets, dtype=torch.float64)
    for s in range(subsets):
        ia = torch.randperm(n_a, generator=generator)[:subset_size].to(k.device)
        ib = (torch.randperm(n_b, generator=generator)[:subset_size] + n_a).to(k.device)
        vals[s] = mmd2_unbiased(k[ia[:, None], ia], k[ib[:, None], ib], k[ia[:, None], ib])  # [s, s] blocks
    return float(vals.mean()), float(vals.std(unbiased=False)), vals


# --- permutation test ------------------------------------------------------------------------


def _mmd2_labelled(k: Tensor, diag: Tensor, rows: Tensor, total: float, labels: Tensor) -> Tensor:
    """Unbiased MMD^2 for every column of labels [N, P] (1 = in A, 0 = in B) at once.

    With a = labels[:, p], the off-diagonal sums are s_aa = a.K.a - a.diag, s_ab = 1.K.a - a.K.a
    and s_bb = total - 2 s_ab - s_aa, where total is the off-diagonal sum of K.
    """
    ka = k @ labels  # [N, P]
    aka = (labels * ka).sum(0)  # [P]
    s_aa = aka - labels.T @ diag
    s_ab = rows @ labels - aka
    s_bb = total - 2 * s_ab - s_aa
    m = labels.sum(0)
    n = labels.shape[0] - m
    return s_aa / (m * (m - 1)) + s_bb / (n * (n - 1)) - 2 * s_ab / (m * n)


def permutation_test(
    k: Tensor, n_a: int, permutations: int = 1000, generator: torch.Generator | None = None, chunk: int = 64
) -> tuple[float, float]:
    """P-value of "A and B come from one distribution" for the unbiased MMD^2 of a pooled kernel
    matrix k [N, N] (A = rows 0..n_a-1). Returns (observed MMD^2, p).

    Each permutation relabels n_a random samples as A; p = (1 + #{null >= observed}) / (1 + permutations).
    Exact when the N samples are exchangeable under the null, i.e. independent: leaves of one tree
    share noise, so a tree folder should contribute one leaf per tree (see report.py).
    """
    n = k.shape[0]
    if n_a < 2 or n - n_a < 2:
        raise ValueError(f"the permutation test needs at least 2 samples per set, got {n_a} and {n - n_a}")
    diag = k.diagonal().clone()  # [N]
    rows = k.sum(0) - diag  # [N] off-diagonal column sums
    total = float(rows.sum())
    truth = (torch.arange(n) < n_a).to(k)[:, None]  # [N, 1]
    observed = float(_mmd2_labelled(k, diag, rows, total, truth)[0])
    tol = 1e-12 * float(diag.abs().max())  # round-off between matmul shapes
    exceed, done = 0, 0
    while done < permutations:
        p = min(chunk, permutations - done)
        labels = torch.zeros(n, p, dtype=torch.float64)  # [N, p] 1 = in A
        for c in range(p):
            labels[torch.randperm(n, generator=generator)[:n_a], c] = 1.0
        stats = _mmd2_labelled(k, diag, rows, total, labels.to(k))  # [p]
        exceed += int((stats >= observed - tol).sum())
        done += p
    return observed, (1 + exceed) / (1 + permutations)

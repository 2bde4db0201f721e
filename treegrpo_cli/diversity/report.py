"""`treegrpo diversity` as a library call: do two image sets come from one distribution?

BranchGRPO (Li et al. 2025, arXiv 2509.06040, sec. 3.1) compares 4096 images from sequential
(DanceGRPO) rollouts with 4096 from branch rollouts by KID and MMD^2 in Inception and CLIP feature
spaces, and shows both sets in one 2D embedding. compare() does that for every feature space asked
for, and adds a permutation test: per feature space

    kid_mean, kid_std       KID over random subsets (cubic polynomial kernel, gamma 1/dim, c 1)
    mmd2_poly               unbiased MMD^2 of the full sets, the same polynomial kernel
    mmd2_gaussian           unbiased MMD^2, Gaussian kernel (bandwidth: median distance or given)
    p_value                 permutation test of "same distribution" on one of the two MMD^2s

Leaves of one tree share early noise, so they are not independent samples. The permutation test
is exact only for independent samples, so by default it uses one random leaf of every tree (a
tree folder holds i.i.d. trees when its prompts are drawn at random, as generate_set does); with
every leaf it rejects far too often. KID and MMD^2 use every image, as in the paper; the pairs of
leaves of one tree bias them up by about (leaves per tree - 1) / (images - 1) of the within-tree
similarity, negligible at thousands of images from hundreds of trees.
Nothing here prints; progress goes through `progress(phase, done, total)`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config import as_json
from ..engine.rollout import Progress
from ..errors import ConfigError, TreegrpoError
from ..plots import save_png, scatter
from ..store.shards import atomic_write
from .features import check_available, features, get_extractor, parse_features
from .io import ImageSet
from .kernels import gaussian_kernel, kid, median_bandwidth, mmd2_pooled, permutation_test, poly_kernel

TEST_KERNELS = ("gaussian", "poly")
REPORT = "report.json"


@dataclass(frozen=True)
class DiversityConfig:
    features: tuple[str, ...] = ("efficientnet",)  # feature spaces: inception, clip, efficientnet, pixels
    kid: bool = True
    mmd: bool = True
    kid_subsets: int = 100  # KID: random subset pairs (torchmetrics' default)
    kid_subset_size: int = 1000  # KID: images per subset, capped at the smaller set
    kid_degree: int = 3  # polynomial kernel (gamma x.y + coef)^degree
    kid_gamma: float | None = None  # None: 1 / feature dim
    kid_coef: float = 1.0
    bandwidth: float | None = None  # Gaussian kernel sigma; None: median pairwise distance
    permutations: int = 1000  # permutation test draws; 0: no test
    test_kernel: str = "gaussian"  # the MMD^2 the test uses: gaussian | poly
    by_tree: bool = True  # the test takes one random leaf per tree of a tree folder
    max_images: int = 4096  # per set: a random subset when larger (memory ~ 8 (2n)^2 bytes)
    batch: int = 64  # images per feature forward
    seed: int = 0
    device: str = "cpu"
    inception_weights: Path | None = None
    clip_weights: Path | None = None
    out: Path | None = None  # write report.json and embedding-<features>.png here

    def validate(self) -> DiversityConfig:
        """Check the values, and that every feature space can be built here (weights, packages)."""
        parse_features(",".join(self.features))
        if not (self.kid or self.mmd):
            raise ConfigError("nothing to compute: pass --kid, --mmd or both")
        if self.test_kernel not in TEST_KERNELS:
            raise ConfigError(f"--test-kernel must be one of {', '.join(TEST_KERNELS)}; got {self.test_kernel!r}")
        if self.kid_subsets < 1 or self.kid_subset_size < 2 or self.permutations < 0:
            raise ConfigError("need --kid-subsets >= 1, --kid-subset-size >= 2 and --permutations >= 0")
        if self.max_images < 2 or self.batch < 1 or (self.bandwidth is not None and not self.bandwidth > 0):
            raise ConfigError("need --max-images >= 2, --batch >= 1 and --bandwidth > 0")
        for name in self.features:
            check_available(name, self.inception_weights, self.clip_weights)
        return self


def check_tree_counts(cfg: DiversityConfig, trees_a: int, trees_b: int) -> None:
    """The tree permutation test needs at least 2 trees per set (also checked before generating them)."""
    if cfg.by_tree and cfg.mmd and cfg.permutations and min(trees_a, trees_b) < 2:
        raise TreegrpoError(
            f"the permutation test takes one leaf per tree and needs at least 2 trees per set, got "
            f"{trees_a} and {trees_b}; roll out more trees or pass --by-image"
        )


def compare(a: ImageSet, b: ImageSet, cfg: DiversityConfig, progress: Progress | None = None) -> dict[str, Any]:
    """KID, MMD^2 and a permutation test of A against B in every feature space of cfg. Sets larger
    than cfg.max_images are subsampled in place."""
    cfg.validate()
    gen = torch.Generator().manual_seed(cfg.seed)
    a.subsample(cfg.max_images, gen)
    b.subsample(cfg.max_images, gen)
    if len(a) < 2 or len(b) < 2:
        raise TreegrpoError(f"each set needs at least 2 images; got {len(a)} and {len(b)}")
    by_tree = cfg.by_tree and "trees" in (a.kind, b.kind)
    groups = torch.cat([a.groups(), b.groups() + int(a.groups().max()) + 1]) if by_tree else None  # [n_a + n_b]
    if by_tree:
        check_tree_counts(cfg, len(a.groups().unique()), len(b.groups().unique()))
    report: dict[str, Any] = {
        "a": a.describe(),
        "b": b.describe(),
        "test_unit": "tree" if by_tree else "image",
        "config": {k: v for k, v in as_json(cfg).items() if v is not None},
        "features": {},
    }
    files = []
    for name in cfg.features:
        t0 = time.perf_counter()
        ext = get_extractor(name, cfg.device, cfg.inception_weights, cfg.clip_weights)
        fa = features(ext, a.batches(cfg.batch), cfg.batch, progress, len(a), f"{name} features A")
        fb = features(ext, b.batches(cfg.batch), cfg.batch, progress, len(b), f"{name} features B")
        del ext
        report["features"][name] = statistics(fa, fb, groups, cfg, progress, name)
        if cfg.out:
            path = Path(cfg.out) / f"embedding-{name}.png"
            embedding_png(fa, fb, path, f"{name} features: A = {a.source.name}, B = {b.source.name}")
            files.append(str(path))
        report["features"][name]["seconds"] = round(time.perf_counter() - t0, 3)
    if cfg.out:
        files.append(str(Path(cfg.out) / REPORT))
        report["files"] = files
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(cfg.out) / REPORT, (json.dumps(report, indent=1, default=str) + "\n").encode())
    return report


def statistics(
    fa: Tensor,
    fb: Tensor,
    groups: Tensor | None,
    cfg: DiversityConfig,
    progress: Progress | None = None,
    name: str = "",
) -> dict[str, Any]:
    """The statistics of one feature space from features fa [n_a, D] and fb [n_b, D]."""
    tick = (lambda d: progress(f"{name} statistics", d, 2)) if progress else (lambda d: None)
    tick(0)
    z = torch.cat([fa, fb]).to(cfg.device, torch.float64)  # [N, D]
    n_a, n_b = fa.shape[0], fb.shape[0]
    gen = torch.Generator().manual_seed(cfg.seed)  # per space: results do not depend on the others
    out: dict[str, Any] = {"dim": int(z.shape[1]), "n_a": n_a, "n_b": n_b}
    k = poly_kernel(z, z, cfg.kid_degree, cfg.kid_gamma, cfg.kid_coef)  # [N, N]
    if cfg.kid:
        size = min(cfg.kid_subset_size, n_a, n_b)
        mean, std, _ = kid(k, n_a, cfg.kid_subsets, size, gen)
        out.update(kid_mean=mean, kid_std=std, kid_subsets=cfg.kid_subsets, kid_subset_size=size)
    if cfg.mmd:
        out["mmd2_poly"] = mmd2_pooled(k, n_a)
        if cfg.test_kernel == "poly":
            out.update(_test(k, n_a, groups, cfg, gen))
    del k
    tick(1)
    if cfg.mmd:
        sigma = cfg.bandwidth or median_bandwidth(z, gen)
        k = gaussian_kernel(z, z, sigma)  # [N, N]
        out.update(
            mmd2_gaussian=mmd2_pooled(k, n_a), bandwidth=sigma, bandwidth_rule="given" if cfg.bandwidth else "median"
        )
        if cfg.test_kernel == "gaussian":
            out.update(_test(k, n_a, groups, cfg, gen))
        del k
    tick(2)
    return out


def _test(k: Tensor, n_a: int, groups: Tensor | None, cfg: DiversityConfig, gen: torch.Generator) -> dict[str, Any]:
    """The permutation test on k [N, N], on one random sample per group when groups are given."""
    if cfg.permutations == 0:
        return {}
    if groups is not None:
        idx = one_per_group(groups, gen).to(k.device)  # [G] sorted: A's first
        k, n_a = k[idx][:, idx], int((idx < n_a).sum())
    _, p = permutation_test(k, n_a, cfg.permutations, gen)
    return {
        "p_value": p,
        "permutations": cfg.permutations,
        "test_kernel": cfg.test_kernel,
        "test_n_a": n_a,
        "test_n_b": int(k.shape[0]) - n_a,
    }


def one_per_group(groups: Tensor, generator: torch.Generator) -> Tensor:
    """groups [N] -> sorted indices [G] of one uniformly random member of every group."""
    _, g = torch.unique(groups.cpu(), return_inverse=True)  # [N] ids 0..G-1
    order = torch.randperm(g.numel(), generator=generator)  # [N]
    first = torch.full((int(g.max()) + 1,), g.numel(), dtype=torch.long)
    first.scatter_reduce_(0, g[order], torch.arange(g.numel()), reduce="amin")
    return order[first].sort().values


# --- 2D embedding ----------------------------------------------------------------------------


def pca_2d(z: Tensor) -> tuple[Tensor, Tensor]:
    """z [N, D] -> (coordinates [N, 2] on the top two principal axes, their explained variance
    fractions [2]). Exact (thin SVD of the centred features); axis signs fixed by the largest loading."""
    z = z.double()
    z = z - z.mean(0)
    _, s, vh = torch.linalg.svd(z, full_matrices=False)  # [k], [k, D], k = min(N, D)
    v = vh[:2].T  # [D, 2]
    if v.shape[1] < 2:
        v = torch.cat([v, torch.zeros(v.shape[0], 2 - v.shape[1], dtype=v.dtype)], 1)
    v = v * torch.where(v.gather(0, v.abs().argmax(0, keepdim=True)) < 0, -1.0, 1.0)
    var = torch.cat([s, s.new_zeros(2)])[:2] ** 2
    return z @ v, var / (float((s**2).sum()) or 1.0)


def embedding_png(fa: Tensor, fb: Tensor, path: Path, title: str = "", labels: tuple[str, str] = ("A", "B")) -> None:
    """Both sets on the pooled features' top two principal axes, coloured by set, as a PNG."""
    xy, frac = pca_2d(torch.cat([fa, fb]))
    is_a = torch.arange(xy.shape[0]) < fa.shape[0]
    names = [f"{labels[0]} ({fa.shape[0]})", f"{labels[1]} ({fb.shape[0]})"]
    img = scatter(
        xy,
        is_a,
        names,
        title or "2D embedding (PCA)",
        f"PC1 ({100 * float(frac[0]):.1f}% of variance)",
        f"PC2 ({100 * float(frac[1]):.1f}%)",
    )
    save_png(img, path)

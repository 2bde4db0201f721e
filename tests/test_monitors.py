"""Weight-free reward-hacking monitors: golden values on images whose answers are known by hand."""

import math

import pytest
import torch

from treegrpo_cli.rewards import jpeg
from treegrpo_cli.rewards.monitors import diversity, drift, image_stats, pixel_features

BLACK, WHITE, RED, GREEN = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)


def flat(colour: tuple[float, float, float], h: int = 8, w: int = 8) -> torch.Tensor:
    """One image [1, 3, h, w] of a single colour."""
    return torch.tensor(colour).view(1, 3, 1, 1).expand(1, 3, h, w).clone()


def half_black_half_white(h: int = 4, w: int = 8) -> torch.Tensor:
    """Left half black, right half white."""
    x = torch.zeros(1, 3, h, w)
    x[..., w // 2 :] = 1.0
    return x


def checkerboard(h: int = 8, w: int = 8) -> torch.Tensor:
    i, j = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return ((i + j) % 2).float().expand(1, 3, h, w).clone()


def stats(images: torch.Tensor) -> dict[str, float]:
    return {k: float(v[0]) for k, v in image_stats(images).items()}


def test_an_all_black_image():
    s = stats(flat(BLACK))
    assert s["dark_fraction"] == 1.0 and s["bright_fraction"] == 0.0
    assert s["colour_entropy"] == 0.0 and s["saturation"] == 0.0 and s["high_frequency"] == 0.0


def test_an_all_white_image_is_bright_and_unsaturated():
    s = stats(flat(WHITE))
    assert s["dark_fraction"] == 0.0 and s["bright_fraction"] == 1.0
    assert s["colour_entropy"] == 0.0 and s["saturation"] == 0.0


def test_half_black_half_white():
    # 4 x 8, left half black: each row has one black-white boundary among its 7 horizontal pairs, the 3 x 8
    # vertical pairs are all equal; per channel 4 ones among 4 * 7 + 3 * 8 = 52 pairs: 4 / 52 = 1 / 13
    s = stats(half_black_half_white(4, 8))
    assert s["dark_fraction"] == 0.5 and s["bright_fraction"] == 0.5
    assert s["colour_entropy"] == pytest.approx(1.0)  # two colours, half each: 1 bit
    assert s["saturation"] == 0.0
    assert s["high_frequency"] == pytest.approx(1 / 13)


def test_a_pure_red_image():
    s = stats(flat(RED))
    assert s["saturation"] == pytest.approx(1.0) and s["colour_entropy"] == 0.0
    # luminance 0.299: neither dark nor bright
    assert s["dark_fraction"] == 0.0 and s["bright_fraction"] == 0.0


def test_a_checkerboard_has_high_frequency_one():
    s = stats(checkerboard())
    assert s["high_frequency"] == pytest.approx(1.0)
    assert s["dark_fraction"] == 0.5 and s["colour_entropy"] == pytest.approx(1.0)


def test_four_colours_in_equal_areas_have_two_bits():
    x = torch.cat(
        [torch.cat([flat(BLACK, 4, 4), flat(WHITE, 4, 4)], 3), torch.cat([flat(RED, 4, 4), flat(GREEN, 4, 4)], 3)], 2
    )
    assert x.shape == (1, 3, 8, 8)
    s = stats(x)
    assert s["colour_entropy"] == pytest.approx(2.0)
    assert s["dark_fraction"] == 0.25 and s["bright_fraction"] == 0.25
    assert s["saturation"] == pytest.approx(0.5)  # red and green 1, black and white 0


def test_colours_in_one_quantisation_level_count_once():
    # 0 and 63/255 fall in the first of 4 levels per channel, 64/255 in the second
    x = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
    x[..., 0, 0] = 63
    assert stats(x)["colour_entropy"] == 0.0
    x[..., 0, 0] = 64
    assert stats(x)["colour_entropy"] == pytest.approx(-(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)))


def test_a_batch_gives_one_value_per_image():
    s = image_stats(torch.cat([flat(BLACK), flat(WHITE), flat(RED)]))
    assert set(s) == {"dark_fraction", "bright_fraction", "colour_entropy", "saturation", "high_frequency", "jpeg_kb"}
    for v in s.values():
        assert v.shape == (3,) and v.dtype == torch.float32
    assert s["dark_fraction"].tolist() == [1.0, 0.0, 0.0]
    assert s["saturation"].tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_jpeg_size_is_the_jpeg_rewards_and_grows_with_noise():
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    grey = flat((0.5, 0.5, 0.5), 64, 64)
    s_noise, s_grey = stats(noise)["jpeg_kb"], stats(grey)["jpeg_kb"]
    assert s_noise > 3 * s_grey > 0
    assert s_noise == pytest.approx(float(jpeg.jpeg_kb(noise, quality=95)[0]))


def test_uint8_and_float_inputs_give_the_same_numbers():
    u = torch.randint(0, 256, (2, 3, 12, 10), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    a, b = image_stats(u), image_stats(u.float() / 255)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_video_gives_the_mean_over_its_frames():
    video = torch.stack([flat(BLACK)[0], flat(WHITE)[0]], 1)[None]  # [1, 3, 2, 8, 8]: a black frame, a white frame
    s = stats(video)
    assert s["dark_fraction"] == 0.5 and s["bright_fraction"] == 0.5
    assert s["colour_entropy"] == 0.0  # each frame one colour: the mean of two zeros, not the clip's 1 bit
    assert s["high_frequency"] == 0.0
    one = image_stats(torch.cat([flat(BLACK), flat(WHITE)]))
    assert s["jpeg_kb"] == pytest.approx(float(one["jpeg_kb"].mean()))


@pytest.mark.parametrize("shape", [(3, 8, 8), (1, 4, 8, 8), (1, 3, 0, 8), (1, 3, 8), (1, 3, 2, 2, 8, 8)])
def test_a_wrong_shape_is_refused_naming_the_shape(shape):
    x = torch.zeros(shape)
    with pytest.raises(ValueError, match=str(list(shape)).replace("[", r"\[").replace("]", r"\]")):
        image_stats(x)
    with pytest.raises(ValueError, match="shape"):
        pixel_features(x)


def test_bad_values_and_types_are_refused():
    with pytest.raises(ValueError, match="int32"):
        image_stats(torch.zeros(1, 3, 4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="non-finite"):
        image_stats(torch.full((1, 3, 4, 4), float("nan")))
    with pytest.raises(ValueError, match="list"):
        image_stats([[0.0]])  # type: ignore[arg-type]


def test_pixel_features_pool_to_16_by_16():
    f = pixel_features(torch.cat([flat(BLACK, 32, 32), flat(RED, 32, 32)]))
    assert f.shape == (2, 3 * 16 * 16) and f.dtype == torch.float32
    assert f[0].abs().sum() == 0 and f[1].view(3, 16, 16)[0].eq(1).all() and f[1].view(3, 16, 16)[1:].eq(0).all()
    # 2 x 2 blocks of a 32 x 32 checkerboard average to 0.5
    assert torch.allclose(pixel_features(checkerboard(32, 32)), torch.full((1, 768), 0.5))
    assert pixel_features(torch.zeros(2, 3, 4, 8, 8)).shape == (2, 4 * 768)  # video: every frame


def test_diversity_on_hand_placed_points():
    # group 0: (0, 0), (0, 2): 2 apart, mean (0, 1); group 1: (4, 4), (4, -2): 6 apart, mean (4, 1);
    # group 2: the single point (0, 4). Within: (2 + 6) / 2 = 4 (a single sample has no pairs);
    # across: the means form a 3-4-5 triangle, (3 + 4 + 5) / 3 = 4
    x = torch.tensor([[0.0, 0.0], [4.0, 4.0], [0.0, 2.0], [0.0, 4.0], [4.0, -2.0]])
    d = diversity(x, torch.tensor([0, 1, 0, 2, 1]))
    assert d["within"] == pytest.approx(4.0) and d["across"] == pytest.approx(4.0)
    # three points of one group at 3, 4 and 5 apart: within 4; one group, no across
    d = diversity(torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]]), [7, 7, 7])
    assert d["within"] == pytest.approx(4.0) and math.isnan(d["across"])


def test_diversity_is_nan_where_undefined():
    d = diversity(torch.tensor([[0.0, 0.0], [3.0, 4.0]]), [0, 1])
    assert math.isnan(d["within"]) and d["across"] == pytest.approx(5.0)
    d = diversity(torch.zeros(0, 5), torch.zeros(0, dtype=torch.long))
    assert math.isnan(d["within"]) and math.isnan(d["across"])
    d = diversity(torch.ones(4, 3), [0, 0, 1, 1])  # identical samples: zero, not NaN
    assert d == {"within": 0.0, "across": 0.0}


def test_diversity_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match=r"\[4\]"):
        diversity(torch.zeros(4), [0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"\[3\]"):
        diversity(torch.zeros(4, 2), [0, 0, 1])
    with pytest.raises(ValueError, match="float"):
        diversity(torch.zeros(2, 2), torch.tensor([0.0, 1.0]))


def test_drift_golden_values():
    base = {"a": torch.tensor([0.0, 2.0]), "b": torch.tensor([1.0, 1.0]), "c": torch.tensor([1.0, 3.0])}
    now = {"a": torch.tensor([3.0, 5.0]), "b": torch.tensor([2.0, 4.0]), "c": torch.tensor([2.0, 0.0])}
    d = drift(now, base)
    assert d["a"] == pytest.approx(3.0)  # mean 1 -> 4, base std 1: three base spreads
    assert d["b"] == pytest.approx(2.0)  # the base does not vary: the raw difference 1 -> 3
    assert d["c"] == pytest.approx(-1.0)  # mean 2 -> 1, base std 1
    assert drift(base, base) == {"a": 0.0, "b": 0.0, "c": 0.0}


def test_drift_of_image_stats_keys_shared_only_and_same_images():
    base = image_stats(torch.cat([flat(BLACK), flat(WHITE)]))
    now = image_stats(torch.cat([flat(BLACK), flat(BLACK)]))
    d = drift(now, base)
    assert set(d) == set(base)
    assert d["dark_fraction"] == pytest.approx(1.0)  # 0.5 -> 1 over a base spread of 0.5
    assert drift({"x": torch.ones(2)}, {"y": torch.ones(2)}) == {}
    with pytest.raises(ValueError, match="3 images now but 2"):
        drift({"a": torch.ones(3)}, {"a": torch.ones(2)})

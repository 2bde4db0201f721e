"""The `ocr` reward (Flow-GRPO's text rendering): the score rule, the target's sources, RapidOCR on rendered text,
the missing-package error, `eval --images --metric ocr`, and docs/rewards.md's table being the benchmark's."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import one_line_error, run
from PIL import Image, ImageDraw, ImageFont

from treegrpo_cli.errors import ConfigError, TreegrpoError
from treegrpo_cli.rewards.base import get_reward, score_leaves
from treegrpo_cli.rewards.ocr import levenshtein, normalise, quoted_text, targets_of, text_score

ROOT = Path(__file__).resolve().parents[1]
SIGN = 'a shop sign that says "OPEN"'


def render(text: str, size: int = 48, width: int = 320, height: int = 128) -> Image.Image:
    """Black text in Pillow's built-in font (no system font needed) on white."""
    im = Image.new("RGB", (width, height), "white")
    if text:
        ImageDraw.Draw(im).text((16, (height - size) // 2), text, fill="black", font=ImageFont.load_default(size=size))
    return im


def batch(*texts: str) -> torch.Tensor:
    """[B, 3, H, W] float in [0, 1], as the rewards receive images."""
    arrs = np.stack([np.asarray(render(t)) for t in texts])
    return torch.from_numpy(arrs).permute(0, 3, 1, 2).float() / 255.0


@pytest.fixture(scope="module")
def ocr():
    pytest.importorskip("rapidocr_onnxruntime")
    return get_reward("ocr", threads="1")


def test_edit_distance():
    assert levenshtein("", "") == 0 and levenshtein("abc", "") == 3 and levenshtein("", "ab") == 2
    assert levenshtein("kitten", "sitting") == 3 == levenshtein("sitting", "kitten")
    assert levenshtein("open", "opfn") == 1 and levenshtein("flaw", "lawn") == 2


def test_score_rule_normalises_and_clips():
    assert normalise(" Hello\tWORLD \n") == "helloworld"
    assert text_score("OPEN", "open") == 1.0 and text_score("o p e n", "OPEN") == 1.0  # case and spaces ignored
    assert text_score("OPFN", "OPEN") == pytest.approx(0.75)
    assert text_score("HELLO WORLE", "hello world") == pytest.approx(0.9)
    assert text_score("WE ARE OPEN NOW", "OPEN") == 1.0  # the target inside longer text counts as found
    assert text_score("", "OPEN") == 0.0 and text_score("completely different", "OPEN") == 0.0  # clipped at 0
    assert text_score("anything", "") == 1.0


def test_target_comes_from_the_quotes_or_is_given():
    assert quoted_text(SIGN) == "OPEN" and quoted_text('“Café” in neon, then "bar"') == "Café"
    assert quoted_text('first "A B" then "C"') == "A B" and quoted_text("no quotes here") is None
    assert targets_of([SIGN, SIGN], ["CLOSED", None]) == ["CLOSED", "OPEN"]
    assert targets_of(["no quotes"], ["GIVEN"]) == ["GIVEN"]
    with pytest.raises(ConfigError, match="no text in double quotes"):
        targets_of(["a plain sign"], None)
    with pytest.raises(ConfigError, match="2 targets for 1 images"):
        targets_of([SIGN], ["A", "B"])


def test_rendered_text_scores_by_how_close_it_is(ocr):
    assert ocr.recognise(batch("OPEN", "")) == ["OPEN", ""]
    s = ocr(batch("OPEN", "OPFN", "SHUT", "", "HELLO WORLE"), [SIGN] * 4 + ['a poster reading "Hello World"'])
    assert s.dtype == torch.float32 and s.shape == (5,)
    assert s[0] == pytest.approx(1.0)  # the exact text
    assert s[1] == pytest.approx(1 - 1 / 4)  # one letter wrong of 4
    assert s[2] <= 0.25  # a wrong word
    assert s[3] == 0.0  # a blank image
    assert s[4] == pytest.approx(1 - 1 / 10)  # one letter wrong of 10 (the space does not count)


def test_an_explicit_target_overrides_the_prompt(ocr):
    images = batch("OPEN", "OPEN")
    assert ocr(images, ['a sign that says "SHUT"'] * 2).tolist() == [0.0, 0.0]
    assert ocr(images, ['a sign that says "SHUT"', "no quotes"], targets=["open", "OPEN"]).tolist() == [1.0, 1.0]
    assert ocr(images, ['a sign that says "SHUT"', SIGN], targets=[None, None]).tolist() == [0.0, 1.0]


def test_uint8_and_float_images_score_alike(ocr):
    x = batch("OPEN", "OPFN")
    as_uint8 = (x * 255).round().to(torch.uint8)
    got = score_leaves({"ocr": ocr}, as_uint8, [SIGN, SIGN])["ocr"]
    assert got.tolist() == ocr(x, [SIGN, SIGN]).tolist()


def test_a_missing_package_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # `import` raises ImportError
    with pytest.raises(TreegrpoError) as e:
        get_reward("ocr")
    assert "pip install 'treegrpo[ocr]'" in str(e.value) and "\n" not in str(e.value)
    _folder(tmp_path, {"0.png": ("OPEN", SIGN)})
    one_line_error(run("eval", "--images", tmp_path, "--metric", "ocr"), "pip install 'treegrpo[ocr]'")


def _folder(path: Path, items: dict[str, tuple[str, str]]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, (text, _) in items.items():
        render(text).save(path / name)
    (path / "prompts.json").write_text(json.dumps({name: prompt for name, (_, prompt) in items.items()}))
    return path


def test_eval_scores_an_image_folder_with_ocr(ocr, tmp_path):
    _folder(tmp_path, {"a.png": ("OPEN", SIGN), "b.png": ("OPFN", SIGN)})
    r = run("eval", "--images", tmp_path, "--metric", "ocr", "--reward-opt", "ocr.threads=1", "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.stdout)["metrics"]["ocr"]
    assert m["n"] == 2 and m["mean"] == pytest.approx((1.0 + 0.75) / 2)


def test_the_docs_table_is_the_benchmarks():
    """docs/rewards.md shows bench/results/ocr_reward.md as `python bench/ocr_table.py` wrote it."""
    table = (ROOT / "bench" / "results" / "ocr_reward.md").read_text()
    assert table in (ROOT / "docs" / "rewards.md").read_text()
    rows = json.loads((ROOT / "bench" / "results" / "ocr_reward.json").read_text())["rows"]
    assert len(table.strip().splitlines()) == len(rows) + 2  # a header, its rule and a row an image

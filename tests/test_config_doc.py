"""docs/config.md: every config key documented from its field's comment, and the page current."""

from dataclasses import dataclass
from pathlib import Path

import pytest
from clitools import run

from treegrpo_cli.cli.config_cmd import dotted
from treegrpo_cli.cli.config_doc import SECTION_DOCS, field_docs, markdown, reference
from treegrpo_cli.config import SECTIONS, Config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "config.md"


@dataclass
class Example:
    a: int = 1  # a's own
    # continues a (a has a trailing comment)
    b: int = 2  # b's own
    # above c (c has none of its own)
    c: int = 3
    d: str = "x"  # inside d's value
    e: int = 4  # e's own
    # after the last field

    def method(self) -> None:  # not a field
        pass


def test_comments_go_to_the_field_they_describe():
    assert field_docs(Example) == {
        "a": "a's own continues a (a has a trailing comment)",
        "b": "b's own",
        "c": "above c (c has none of its own)",
        "d": "inside d's value",
        "e": "e's own after the last field",
    }


def test_every_key_a_config_takes_is_documented():
    keys = set(dotted(Config().to_dict()))
    rows = {r["key"]: r for r in reference()}
    assert set(rows) == keys
    undocumented = sorted(k for k, r in rows.items() if len(r["doc"]) < 8)
    assert not undocumented, undocumented
    assert set(SECTION_DOCS) == set(SECTIONS)


@pytest.mark.slow
def test_the_page_is_current():
    assert PAGE.read_text() == markdown(), "run: treegrpo config reference > docs/config.md"
    assert "`rollout.max_tree_gib`" in PAGE.read_text()


@pytest.mark.slow
def test_the_command_prints_the_page_and_json():
    r = run("config", "reference")
    assert r.exit_code == 0 and r.stdout == markdown()
    r = run("config", "reference", "--json")
    import json

    rows = json.loads(r.stdout)
    lr = next(x for x in rows if x["key"] == "train.lr")
    assert lr["default"] == 1e-5 and lr["type"] == "float" and "AdamW" in lr["doc"]

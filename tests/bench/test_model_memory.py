"""docs/models.md's two tables (the adapters, the releases' memory) are bench/model_memory.py's output from what the
adapter files declare: a new model's rows come from its card, its class and its releases' configs, none by hand."""

import re
from pathlib import Path

from benchmods import load

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "models.md"


def test_the_models_page_tables_are_generated():
    from treegrpo_cli.models.hub import KNOWN

    mod = load("model_memory")
    text = DOCS.read_text()
    assert mod.page(text, mod.rows(mod.recorded())) == text, "run python bench/model_memory.py --docs"
    begin, end = mod.markers("memory table")
    table = text[text.index(begin) + len(begin) : text.index(end)]
    assert [re.search(r"`([^`]+)`", line).group(1) for line in table.splitlines()[2:]] == list(KNOWN)
    assert table == (ROOT / "bench" / "results" / "model_memory.md").read_text()  # the last full count's


def test_a_release_without_recorded_counts_is_counted_from_its_configs():
    """A release model_memory.json has no row of (a new model), or one at another LoRA rank than its adapter's,
    is counted from its configs on the meta device: the same numbers a full run records."""
    mod = load("model_memory")
    recorded = mod.recorded()
    fresh = {r["model"]: r for r in mod.rows({k: v for k, v in recorded.items() if k != "sd1.5"})}
    assert fresh["sd1.5"] == recorded["sd1.5"]
    stale = {**recorded, "sd1.5": {**recorded["sd1.5"], "lora_rank": 99, "params_b": 1e3}}
    assert {r["model"]: r for r in mod.rows(stale)}["sd1.5"] == recorded["sd1.5"]

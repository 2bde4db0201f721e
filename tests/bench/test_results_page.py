"""docs/results.md, its plots and README's results block are bench/results_page.py's output from bench/results/."""

import re
from pathlib import Path

import pytest
from benchmods import load

ROOT = Path(__file__).resolve().parents[2]


def _results_page():
    return load("results_page")


def test_the_results_page_is_what_the_results_files_give():
    mod = _results_page()
    text, images, _ = mod.page()
    assert (ROOT / "docs" / "results.md").read_text() == text, "run python bench/results_page.py"
    missing = [name for name in images if not (ROOT / "docs" / "results" / name).is_file()]
    assert not missing, f"plots not drawn: {missing}; run python bench/results_page.py"
    assert not re.search(r"\b20\d\d-\d\d-\d\d", text)  # no dates: the page says what was measured, not when


@pytest.mark.slow
def test_readmes_results_table_and_plot_are_generated():
    mod = _results_page()
    readme = (ROOT / "README.md").read_text()
    assert mod.splice(readme, mod.readme_block()) == readme, "run python bench/results_page.py"
    assert f"(docs/results/{mod.README_PLOT})" in readme and mod.README_PLOT in mod.page()[1]


def test_every_results_file_has_a_reader():
    """Each file in bench/results/ is read by the page, or is a bench script's own table of a file the page reads
    (study-PLAN.md beside study-PLAN.json.gz), or the source of one it reads, or one of the few read elsewhere."""
    mod = _results_page()
    read = mod.page()[2]
    files = {p.name for p in (ROOT / "bench" / "results").iterdir() if p.is_file()}
    tables_of_read = {n for n in files if n.endswith(".md") and {n[:-3] + ".json", n[:-3] + ".json.gz"} & read}
    sources_of_read = {n for n in files if n.endswith(".json") and n[:-5] + ".md" in read}
    elsewhere = {
        "study-runs.tsv",  # bench/check_runs.py: the raw runs' hashes
        "model_memory.md",  # docs/models.md's memory table (tests/bench/test_model_memory.py)
        "model_memory.json",  # its source
        "ocr_reward.md",  # docs/rewards.md's OCR table (tests/test_ocr_reward.py)
        "ocr_reward.json",  # its source
        "faults.md",  # bench/faults.py's crash campaign (docs/training.md shows it)
        "faults.json",  # its source
    }
    device_checks = {n for n in files if n.startswith("gpu_check-")}  # bench/gpu_check.py: a machine's record
    # bench/oracle_METHOD.py: a released code's outputs, the golden values of tests/test_METHOD.py
    oracles = {n for n in files if n.startswith("oracle_") and n.endswith(".json")}
    assert files - read - tables_of_read - sources_of_read - elsewhere - device_checks - oracles == set()


def test_every_method_of_the_wall_clock_table_has_its_papers_figures():
    import json

    _results_page()  # bench/ on the path
    import results_study

    result = json.loads((ROOT / "bench" / "results" / "methods.json").read_text())
    assert {g["label"] for g in result["compare"]["groups"]} == set(results_study.PAPERS)


def test_the_adaptive_charts_show_each_budget_beside_what_it_adds_to():
    _results_page()  # bench/ on the path
    import results_study as study

    labels = ["dance-grpo", "tree-grpo/budget", "branch-mix-flow", "tree-grpo", "tree-grpo@lr1e-4", "branch-mix-flow/x"]
    budgets, rules = study.chart_groups(labels, "branch-mix-flow")
    assert budgets == (
        "budgets",
        "per-prompt budgets",
        ["branch-mix-flow", "tree-grpo/budget", "tree-grpo", "tree-grpo@lr1e-4"],
    )
    assert rules[2] == ["branch-mix-flow", "dance-grpo", "tree-grpo", "tree-grpo@lr1e-4", "branch-mix-flow/x"]


def test_a_chart_draws_its_groups_in_the_order_it_names_them():
    """A group's colour is its place: the baseline named first is drawn first whatever the file's order."""
    _results_page()  # bench/ on the path
    import results_common

    cmp = {
        "groups": [{"label": "branch-mix-flow"}, {"label": "tree-grpo"}, {"label": "dance-grpo"}],
        "runs": [{"label": "branch-mix-flow", "seed": 0}, {"label": "tree-grpo", "seed": 0}],
    }
    cut = results_common.shown(cmp, ["tree-grpo", "dance-grpo"])
    assert [g["label"] for g in cut["groups"]] == ["tree-grpo", "dance-grpo"]
    assert cut["runs"] == [{"label": "tree-grpo", "seed": 0}]
    assert [g["label"] for g in cmp["groups"]] == ["branch-mix-flow", "tree-grpo", "dance-grpo"]  # not changed


def test_a_plan_timed_against_another_of_its_labels_gets_its_own_table():
    import gzip
    import json

    _results_page()  # bench/ on the path
    import results_study as study

    r = json.loads(gzip.decompress((ROOT / "bench" / "results" / "study-adaptive.json.gz").read_bytes()))
    md = study.against({**r, "baseline": "dance-grpo", "command": "python bench/study.py --baseline dance-grpo"})
    assert md.startswith("\nThe same runs timed against `dance-grpo` (`python bench/study.py --baseline dance-grpo`)")
    rows = [line.split(" | ")[0].strip("| ") for line in md.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [g["label"] for g in r["flops"]["groups"]]  # one row a variant, under the header
    text, _, read = _results_page().page()
    for name in (n for n in read if n.startswith("study-adaptive") and "-vs-" in n):
        assert f"timed against `{name.split('-vs-')[1].removesuffix('.json.gz')}`" in text

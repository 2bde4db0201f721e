"""The repository's own promises: CI runs README's test command; presets document how to launch."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_cmd = blocks[1].strip()
    assert "pytest" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    # the CI line is README's command with pip's -q flags added
    assert test_cmd == ci.strip().splitlines()[-1].replace("pip install -q ", "pip install ")


def test_every_preset_names_its_source_and_launch_command():
    for p in sorted((ROOT / "presets").glob("*.toml")):
        head = p.read_text().split("\n\n")[0]
        assert "arXiv" in head, p.name
        assert f"--preset {p.stem}" in head, p.name


def test_readmes_performance_table_is_generated_from_the_results_file():
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "bench" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (ROOT / "README.md").read_text()
    result = json.loads((ROOT / "bench" / "results" / "methods.json").read_text())
    assert mod.splice(readme, mod.render(result)) == readme, "run python bench/readme_table.py"
    assert {g["label"] for g in result["compare"]["groups"]} == set(mod.PAPERS)      # every method measured

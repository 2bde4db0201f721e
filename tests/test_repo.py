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

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


_OUTPUT_PATHS = {"bench/results/flux_iteration.json"}  # bench/flux_iteration.py's output; needs a GPU, not run yet
# Paths in other projects' repositories that docs/methods.md and docs/models.md cite as sources.
_UPSTREAM_PATHS = {
    "scripts/finetune/finetune_flux_branchgrpo_8gpus.sh",
    "scripts/finetune/finetune_flux_grpo_8gpus.sh",
    "scripts/finetune/finetune_flux_grpo_MixGRPO.sh",
    "scripts/preprocess/preprocess_flux_rl_embeddings.sh",
    "scripts/visualization/vis_flux.py",
    "scripts/train_sd3.py",
    "scripts/train_sd3_GRPO_Guard.py",
    "scripts/train_sd3_pr.py",
    "scripts/train_flux.py",
}
_REPO_DIRS = ("docs", "bench", "treegrpo_cli", "presets", "scripts", "tests")
_PACKAGE_DIRS = ("engine", "models", "rewards", "store", "world", "training", "report", "diversity", "cli")


def _markdown_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md"]
    return files + sorted((ROOT / "docs").rglob("*.md"))


def test_every_relative_link_in_the_markdown_resolves():
    """[text](target), ![alt](target), <img src="target"> and [label]: target in README, CHANGELOG,
    bench/README and docs/: every target that is not a URL or an anchor exists beside the markdown file."""
    dead = []
    for md in _markdown_files():
        text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)  # code blocks hold no links
        targets = re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
        targets += re.findall(r"<img\s[^>]*src=\"([^\"]+)\"", text)
        targets += re.findall(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", text, re.M)
        for target in targets:
            if re.match(r"(https?|mailto|ftp):", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if path and not (md.parent / path).exists():
                dead.append(f"{md.relative_to(ROOT)}: ({target})")
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_every_backticked_repository_path_in_the_docs_exists():
    """`docs/...`, `bench/...`, `treegrpo_cli/...`, `presets/...`, `scripts/...`, `tests/...` in README,
    bench/README and docs/ (relative to the repository), and `models/x.py`-style paths inside the package
    (relative to treegrpo_cli/), name files or folders that exist. Placeholders (`<run>`, `*`, `{a,b}`,
    RUN, N), the outputs in _OUTPUT_PATHS and other projects' files in _UPSTREAM_PATHS are not files of
    this repository."""
    missing = []
    for md in _markdown_files():
        if md.name == "CHANGELOG.md":  # history: names what was
            continue
        text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
        for span in re.findall(r"`([^`]+)`", text):  # a code span may wrap a line
            path = " ".join(span.split())
            if not re.fullmatch(r"[\w.\-/*<>{},]+", path) or "/" not in path:
                continue
            if not (path.endswith("/") or re.search(r"\.[A-Za-z][\w]*$", path)):
                continue
            if (
                re.search(r"[<>*{}]", path)
                or re.search(r"(?<![A-Za-z])(RUN|N)(?![A-Za-z])", path)
                or "runs/" in path
                or path in _OUTPUT_PATHS | _UPSTREAM_PATHS
            ):
                continue
            top = path.split("/")[0]
            if top in _REPO_DIRS:
                where = ROOT / path
            elif top in _PACKAGE_DIRS and path.endswith(".py"):
                where = ROOT / "treegrpo_cli" / path
            else:
                continue
            if not where.exists():
                missing.append(f"{md.relative_to(ROOT)}: `{path}`")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_preset_headers_carry_no_study_figures():
    """A preset's header says where it comes from, how it departs and how to launch it; what it measured lives in
    bench/results and docs/results.md (figures in a header go stale with every study)."""
    figures = re.compile(r"[+-]0\.\d\d|±|\+- ?0\.\d|\d(\.\d+)?x \(\d|held-out gain of")
    for p in sorted((ROOT / "presets").glob("*.toml")):
        head = "\n".join(line for line in p.read_text().splitlines() if line.startswith("#"))
        assert not figures.search(head), f"{p.name}: {figures.search(head).group(0)!r}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def test_every_anchor_in_a_markdown_link_names_a_heading():
    """[text](page.md#anchor) and [text](#anchor) in README, CHANGELOG, bench/README and docs/ point at a heading."""
    dead = []
    for md in _markdown_files():
        text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(\s*<?([^)\s>]*#[^)\s>]+)>?\s*\)", text):
            if re.match(r"(https?|mailto|ftp):", target):
                continue
            page, _, anchor = target.partition("#")
            path = md if not page else md.parent / page
            if not path.is_file() or path.suffix != ".md":
                continue
            body = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", body, re.M)}
            if anchor not in slugs:
                dead.append(f"{md.relative_to(ROOT)}: ({target})")
    assert not dead, "anchors that name no heading:\n" + "\n".join(dead)


def test_no_dates_session_history_or_internal_issue_numbers_where_a_user_reads():
    """README, docs/, CHANGELOG and the preset headers describe the tool as it is: no dates of runs, no sessions, no
    issue numbers of this project (other projects' issues, `owner/repo#N` in code spans, are sources)."""
    files = _markdown_files() + sorted((ROOT / "presets").glob("*.toml"))
    bad = []
    for f in files:
        text = re.sub(r"`[^`\n]*`", "", f.read_text())  # code spans: commands, other projects' paths and issues
        for pattern in (r"\b20\d\d-\d\d-\d\d\b", r"\bsessions?\b", r"\b[Ii]ssues? \d+", r"(?<![\w/])#\d+\b"):
            bad += [f"{f.relative_to(ROOT)}: {m.group(0)!r}" for m in re.finditer(pattern, text)]
    assert not bad, "\n".join(bad)

"""The config reference (docs/config.md, `treegrpo config reference`): every key with its type, default and the
comment its dataclass field carries, read from the source so the page and the code cannot drift apart.

A field's description is its trailing comment plus the comment lines that continue it; comment lines between two
fields belong to the next field when that one has no trailing comment of its own (a comment above it), else to the
previous one (a continuation).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
from collections.abc import Callable
from typing import Any

from ..config import SECTIONS, TOP_LEVEL, Config
from ..engine.advantages import choices

TOP_DOCS = {
    "name": "the run's name: runs/<name>-<time> when no --run-dir is given (a preset sets its own)",
    "description": "one line about the config, shown by `treegrpo presets` (a preset sets its own)",
    "model": "built-in model name, released model name (flux-dev, sd3.5-medium, ...) or a local diffusers folder",
    "seed": "the run's seed: trees, noises, minibatch order and held-out samples all derive from it",
}

LAYERS = """Each value comes from the last of these layers that sets it (`treegrpo config show --explain` names it):

1. the defaults below;
2. the preset (`--preset`, a file under `presets/`);
3. the model's defaults (an adapter's resolution, grid and LoRA rank, the world models' prompts and reward);
4. a released model's task: its preset's paper reward and the shipped general prompts;
5. the preset's `[for_model.NAME]` table, then the `--config` file's;
6. the `--config FILE` (a TOML file of the same sections);
7. `--set section.key=value` items, and the options that stand for keys (`--reward`, `--prompts`, `--iterations`,
   `--seed`, `--model`, ...).

A non-static `[schedule]` sets `tree.sde_steps` (and with `schedule.split`, `tree.split_steps`) every iteration;
`train` warns when it overrides a value you set. A key that its switch ignores (`tree.stop_tol` with `tree.dynamic =
"off"`) warns when you set it in the switch's layer or a later one; turning a preset's feature off with `--set`
leaves the preset's tuning of it unused and says nothing."""


# keys whose description is generated from a registry rather than their field's comment (it would go stale)
GENERATED_DOCS: dict[str, Callable[[], str]] = {
    "advantage.estimator": lambda: f"{choices()} (a key below that the estimator does not read warns when set)",
}


def field_docs(cls: type) -> dict[str, str]:
    """{field: description} of a dataclass, from the comments around its fields in the source (of the class and
    of the dataclasses it is made of: the [train] section joins the update's keys and the run's)."""
    out: dict[str, str] = {}
    for base in _made_of(cls):
        out.update(_own_field_docs(base))
    return out


def _made_of(cls: type) -> list[type]:
    """The dataclasses whose fields `cls` holds, the first-declared last (each declares its own in its source)."""
    return [b for b in reversed(cls.__mro__) if dataclasses.is_dataclass(b) and "__annotations__" in vars(b)]


def _own_field_docs(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    fields = [(_name(n), n.lineno, n.end_lineno or n.lineno) for n in body.body if _is_field(n)]
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), alone)
    out: dict[str, list[str]] = {name: [] for name, _, _ in fields}
    for i, (name, first, last) in enumerate(fields):
        own = [text for line, (text, alone) in sorted(comments.items()) if first <= line <= last]
        out[name] += own
        nxt_first = fields[i + 1][1] if i + 1 < len(fields) else None
        between = [
            text
            for line, (text, alone) in sorted(comments.items())
            if alone and line > last and (nxt_first is None or line < nxt_first)
        ]
        if nxt_first is None:
            between = _continuation(comments, last, body)
        nxt_has_own = nxt_first is not None and any(
            not alone and fields[i + 1][1] <= line <= fields[i + 1][2] for line, (_, alone) in comments.items()
        )
        if nxt_first is not None and not nxt_has_own:
            out[fields[i + 1][0]] = between + out[fields[i + 1][0]]
        else:
            out[name] += between
    return {k: " ".join(v).strip() for k, v in out.items()}


def _is_field(node: ast.stmt) -> bool:
    return isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)


def _name(node: ast.stmt) -> str:
    assert isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    return node.target.id


def _continuation(comments: dict[int, tuple[str, bool]], last: int, body: ast.ClassDef) -> list[str]:
    """The comment lines right after a class's last field (before its first method)."""
    stop = min((n.lineno for n in body.body if not _is_field(n) and n.lineno > last), default=10**9)
    return [text for line, (text, alone) in sorted(comments.items()) if alone and last < line < stop]


def reference() -> list[dict[str, Any]]:
    """[{key, type, default, doc}] for every key a config takes, top-level keys first, then section by section."""
    rows = [
        {"key": k, "type": t.__name__, "default": getattr(Config, k), "doc": TOP_DOCS.get(k, "")}
        for k, t in TOP_LEVEL.items()
    ]
    for section, cls in SECTIONS.items():
        docs, hints = field_docs(cls), _annotations(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            key = f"{section}.{f.name}"
            doc = GENERATED_DOCS[key]() if key in GENERATED_DOCS else docs[f.name]
            rows.append({"key": key, "type": hints[f.name], "default": default, "doc": doc})
    return rows


def _annotations(cls: type) -> dict[str, str]:
    out: dict[str, str] = {}
    for base in _made_of(cls):
        body = ast.parse(textwrap.dedent(inspect.getsource(base))).body[0]
        assert isinstance(body, ast.ClassDef)
        out.update({_name(n): ast.unparse(n.annotation) for n in body.body if isinstance(n, ast.AnnAssign)})
    return out


SECTION_DOCS = {
    "sampler": "The denoising grid and the SDE that samples each step (engine/sde.py).",
    "tree": "The shape of each prompt's tree: where it splits, how many children, which steps are stochastic "
    "(engine/rollout.py).",
    "advantage": "How leaf rewards become edge advantages: flat groups, BranchGRPO fusion, TreeGRPO backup, TreePO "
    "sub-groups (engine/advantages.py).",
    "pruning": "Which edges are trained: width and depth pruning, timestep fraction (engine/pruning.py).",
    "reward": "What scores the leaves and how several rewards combine (rewards/).",
    "rollout": "Prompts per iteration, batch sizes and the rollout's memory caps.",
    "schedule": "SDE windows that move with training: MixGRPO's progressive window, TreeGRPO's (engine/schedules.py).",
    "splits": "Split steps that move with training: TMPO's progress schedule and its per-prompt adaptive one "
    "(engine/splits.py).",
    "budget": "Per-prompt leaf budgets from each prompt's estimated reward spread, tied prompts replaced "
    "(engine/budgets.py).",
    "train": "The update, its optimizer and schedule, the EMA, checkpoints, held-out evaluation and budgets "
    "(engine/grpo.py).",
    "nft": 'DiffusionNFT, used when train.objective = "nft" (engine/nft.py).',
    "awm": 'Advantage Weighted Matching, used when train.objective = "awm" (engine/awm.py).',
    "dgpo": 'Direct Group Preference Optimization, used when train.objective = "dgpo" (engine/dgpo.py).',
    "policy": "How a diffusers model is loaded and trained; the built-in models ignore it (models/base.py).",
    "guard": "Reward hacking watched at each held-out evaluation: gold rewards, image statistics and diversity as "
    "drift from the base model; rules that warn or stop; the best checkpoint (training/guard.py, docs/rewards.md).",
}


def toml_value(v: Any) -> str:
    """A default as a TOML file writes it."""
    import json

    if v is None:
        return "(none)"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float) and v == float("inf"):
        return "inf"
    if isinstance(v, tuple):
        return json.dumps(list(v))
    return json.dumps(v)


def markdown() -> str:
    """docs/config.md."""
    lines = [
        "# Config reference",
        "",
        "<!-- generated by `treegrpo config reference > docs/config.md`; tests/test_config_doc.py checks it -->",
        "",
        "Every key a preset, a `--config` file or `--set` may give, with its default. In a TOML file a key",
        "`section.key` is `key` under `[section]`; on the command line it is `--set section.key=value` (strings in",
        "double quotes: `--set model=\"flux-dev\"`; lists in brackets, `--set 'tree.split_steps=[0, 3]'`, or comma",
        "separated: `--set reward.names=shapes,jpeg-compressibility`).",
        "",
        LAYERS,
    ]
    rows = reference()
    for section in ["(top level)", *SECTIONS]:
        mine = [r for r in rows if ("." not in r["key"]) == (section == "(top level)") and _in(r["key"], section)]
        lines += ["", f"## {'Top level' if section == '(top level)' else f'[{section}]'}", ""]
        if section in SECTIONS:
            lines += [SECTION_DOCS.get(section, ""), ""]
        lines += ["| key | type | default | what it does |", "|---|---|---|---|"]
        for r in mine:
            doc = r["doc"].replace("|", "\\|")
            lines.append(f"| `{r['key']}` | `{r['type']}` | `{toml_value(r['default'])}` | {doc} |")
    return "\n".join(lines) + "\n"


def _in(key: str, section: str) -> bool:
    return section == "(top level)" or key.startswith(section + ".")

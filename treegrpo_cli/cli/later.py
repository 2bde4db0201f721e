"""Commands whose engines land in later releases: they exist, explain themselves and exit 2."""

from __future__ import annotations

import typer

from .common import fail

_PENDING = "is not available in this release yet (see CHANGELOG.md); use `treegrpo rollout` and `treegrpo score`"


def eval_(ctx: typer.Context) -> None:
    """Evaluate a model or checkpoint with reward metrics (ODE sampling)."""
    fail(f"`treegrpo eval` {_PENDING}", 2)


COMMANDS = {"eval": eval_}

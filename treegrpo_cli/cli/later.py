"""Commands whose engines land in later releases: they exist, explain themselves and exit 2.

Empty in this release (`eval` has landed in eval_cmd.py); app.py registers whatever is listed here.
"""

from __future__ import annotations

from typing import Callable

from .common import fail

_PENDING = "is not available in this release yet (see CHANGELOG.md)"


def pending(name: str) -> None:
    """Fail with the one-line 'not available yet' message of command `name` (exit code 2)."""
    fail(f"`treegrpo {name}` {_PENDING}", 2)


COMMANDS: dict[str, Callable[..., None]] = {}

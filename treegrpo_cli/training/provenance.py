"""The code that writes a run: this treegrpo's version and, in a git checkout, its commit (run.json records
them; a resume under other code warns, resumecheck.code_change)."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from .. import __version__


@functools.lru_cache(maxsize=1)
def code_version() -> dict[str, str | None]:
    """This treegrpo's version and, when the package is a git checkout, its commit (else None)."""
    pkg = Path(__file__).resolve().parents[1]
    commit = None
    try:
        r = subprocess.run(
            ["git", "-C", str(pkg), "rev-parse", "--show-toplevel", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
        lines = r.stdout.split()
        # the package's own checkout only (not a git repository that happens to hold an installed copy)
        if r.returncode == 0 and len(lines) == 2 and Path(lines[0]).resolve() == pkg.parent:
            commit = lines[1]
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return {"version": __version__, "commit": commit}

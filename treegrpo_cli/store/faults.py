"""Named points inside the writers where the crash tests stop a process on purpose.

    TREEGRPO_FAULT="checkpoint.shard"          SIGKILL at the first time that point is reached
    TREEGRPO_FAULT="checkpoint.shard@3"        ... at the third time
    TREEGRPO_FAULT="train.close:TERM"          SIGTERM (or INT, KILL) instead; a SIGTERM's handler runs
                                               right after, as for a signal sent from outside

Unset (every user's case) a point costs one dictionary lookup. The points, by writer:
    checkpoint.shard, checkpoint.written, checkpoint.renamed, checkpoint.retire   (store/checkpoint.py)
    rollout.shard, score.cleared, score.shard                                   (training/stages.py)
    eval.file, export.file, train.close, train.summary                          (report/, training/, cli/)
"""

from __future__ import annotations

import os
import signal

VARIABLE = "TREEGRPO_FAULT"
_SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}
_hits: dict[str, int] = {}


def point(name: str) -> None:
    """Stop this process here when TREEGRPO_FAULT names this point (and this is its n-th hit)."""
    spec = os.environ.get(VARIABLE)
    if not spec:
        return
    where, _, sig = spec.partition(":")
    target, _, nth = where.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(nth or 1):
        os.kill(os.getpid(), _SIGNALS.get(sig or "KILL", signal.SIGKILL))

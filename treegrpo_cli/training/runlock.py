"""The run folder's lock: one process writes a run at a time (RUN/.lock, held with flock)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from ..errors import TreegrpoError

LOCK = ".lock"


class RunLock:
    """An exclusive OS lock (flock) on RUN/.lock, held by the one process that writes the run folder (a new
    run, a resume, a staged update; rank 0 of a data-parallel run). The file holds the holder's pid. The OS
    drops the lock when the process ends, however it ends: a SIGKILLed run can be resumed at once."""

    def __init__(self, run: Path, create: bool = False):
        self.run, self.path, self.fd = Path(run), Path(run) / LOCK, -1
        try:
            import fcntl
        except ImportError:  # Windows has no flock: no lock there
            return
        if create:
            try:
                self.run.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise TreegrpoError(f"{self.run}: cannot create the run folder ({e.strerror})") from None
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise TreegrpoError(f"{self.path}: cannot create the run's lock file ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = _lock_holder(fd)
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise TreegrpoError(f"{self.path}: cannot lock the run folder ({e.strerror})") from None
                raise TreegrpoError(
                    f"{self.run} is in use by another treegrpo process (pid {holder}); wait for it to end "
                    "or stop it, then try again"
                ) from None
            try:  # the last holder may have removed the file between our open and our lock: lock the new one
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)  # while still held: a process that opened it meanwhile sees it gone and retries
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock(run: Path, create: bool = False) -> RunLock:
    """Hold RUN's lock (create: make the folder first) or refuse in one line naming the holder's pid."""
    return RunLock(run, create)


def _lock_holder(fd: int) -> str:
    """The pid the holder wrote into the lock file (it writes it just after locking: wait a moment for it)."""
    for _ in range(20):
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return text
        time.sleep(0.01)
    return "unknown"

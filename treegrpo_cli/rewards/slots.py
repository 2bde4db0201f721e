"""The connection slots of `treegrpo serve-reward` (rewards/remote.py RewardServer): at most `n` connections are
served at once. When every slot is taken, a new connection takes the slot of the oldest connection still sending
its request line and headers, which is cut (its thread reads the end of its stream and ends, giving the slot
back): connections that never finish their headers cannot keep out a client that sends its request. Only when
every slot serves a connection whose headers are in is a new one refused."""

from __future__ import annotations

import socket
import threading
from typing import Any


class Slots:
    def __init__(self, n: int, wait: float = 1.0):
        self.free = threading.BoundedSemaphore(n)
        self.wait = wait  # seconds a new connection waits for the slot of the one cut for it
        self.waiting: dict[Any, None] = {}  # connections still sending their headers, oldest first
        self.lock = threading.Lock()

    def take(self, conn: Any) -> bool:
        """A slot for `conn` (counted as sending its headers until headers_in): a free one, else the slot of the
        oldest connection still sending its headers; False when every slot serves a connection past them."""
        if not self.free.acquire(blocking=False) and not self._cut_oldest():
            return False
        with self.lock:
            self.waiting[conn] = None
        return True

    def _cut_oldest(self) -> bool:
        with self.lock:
            oldest = next(iter(self.waiting), None)
            self.waiting.pop(oldest, None)
        if oldest is None:
            return False
        try:
            oldest.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # it ended meanwhile: its slot is coming back
        return self.free.acquire(timeout=self.wait)

    def headers_in(self, conn: Any) -> None:
        """`conn` has sent its request line and headers (or ended): it is no longer cut for a new connection."""
        with self.lock:
            self.waiting.pop(conn, None)

    def give(self, conn: Any) -> None:
        """`conn` has ended: its slot is free."""
        self.headers_in(conn)
        self.free.release()

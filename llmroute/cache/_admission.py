"""How often a prompt was asked lately: the pure counter behind the cache's admission rule."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["PopularityCounter"]


class PopularityCounter:
    """Counts asks per key in a fixed window, in bounded memory.

    A key's window starts at its first ask and restarts with the first ask after ``window``
    seconds. At most ``max_keys`` keys are remembered (as 16-byte digests, not the strings); the
    least recently asked key is forgotten first. Safe to share between threads.
    """

    def __init__(self, max_keys: int = 65536, clock: Callable[[], float] = time.monotonic) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys}")
        self._max_keys = max_keys
        self._clock = clock
        self._windows: OrderedDict[bytes, tuple[float, int]] = OrderedDict()
        self._lock = threading.Lock()

    def hit(self, key: str, window: float) -> int:
        """Count one ask of ``key``; return the asks in its current window, this one included."""
        digest = hashlib.blake2b(key.encode(), digest_size=16).digest()
        with self._lock:
            now = self._clock()
            started, count = self._windows.get(digest, (now, 0))
            if now - started >= window:
                started, count = now, 0
            self._windows[digest] = (started, count + 1)
            self._windows.move_to_end(digest)
            if len(self._windows) > self._max_keys:
                self._windows.popitem(last=False)
            return count + 1

    def clear(self) -> None:
        """Forget every key."""
        with self._lock:
            self._windows.clear()

    def __len__(self) -> int:
        return len(self._windows)

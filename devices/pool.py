"""An object pool for a session's reusable native objects (``Pool``)."""

from __future__ import annotations

import threading
from typing import Callable


class Pool:
    """Reusable native objects (infer requests, interpreters), one per concurrent call: ``first``
    made at load so the first call pays nothing, more made on demand up to ``limit``."""

    def __init__(self, make: Callable[[], object], limit: int, first=None):
        self._make = make
        self._limit = max(1, int(limit))
        self._free = [make() if first is None else first]
        self._made = 1
        self._cv = threading.Condition()

    def acquire(self):
        with self._cv:
            while not self._free:
                if self._made < self._limit:
                    self._made += 1
                    break
                self._cv.wait()
            else:
                return self._free.pop()
        try:
            return self._make()
        except BaseException:
            with self._cv:
                self._made -= 1
                self._cv.notify()
            raise

    def release(self, item) -> None:
        with self._cv:
            self._free.append(item)
            self._cv.notify()

    def clear(self) -> None:
        with self._cv:
            self._free = []

    @property
    def size(self) -> int:
        return self._made

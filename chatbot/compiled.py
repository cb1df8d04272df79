"""A bounded cache of traced and compiled functions.

Owns: `CompiledCache`, which keeps at most a fixed number of functions built per static setting
(a sampler, an n-gram size, a candidate count), evicting the least recently used. Each one holds
its traced graphs and XLA executables (tens of MB), and the static settings that key them are
valid user options, so an unbounded dictionary let any caller grow a server's memory without limit.
Must not import TensorFlow: it stores whatever it is given.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable


class CompiledCache:
    """`get(key, build)`: the function stored under `key`, built by `build()` on a miss. At most `size`
    are kept; on a miss beyond that the least recently used is dropped (and garbage collected with its
    graphs once no caller still runs it)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        function = build()  # tracing happens on the first call, outside the lock
        with self._lock:
            function = self._items.setdefault(key, function)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return function

    def peek(self, key: Hashable, default=None):
        """The function stored under `key`, without building one or counting it as used."""
        return self._items.get(key, default)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __iter__(self):
        return iter(list(self._items))

    def values(self) -> list:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

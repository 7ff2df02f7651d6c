"""vLLM v1's free-queue order, exactly.

Cached blocks become evictable when their last user releases them and are evicted in that
order (least recently released first). The block cache releases a request's blocks tail
first, so among blocks freed together the deepest goes first. Keyless blocks never reach the
policy: the structure reuses them before any cached block (vLLM's ``prepend_n``). A hit
takes a block out of the queue (``touch``); its next release puts it at the back.
"""

from __future__ import annotations

from prefixlab.cache.view import EntryView
from prefixlab.policies._segments import SegmentQueue
from prefixlab.policies.base import EvictionPolicy, register
from prefixlab.types import I64


@register("vllm")
class VLLM(EvictionPolicy):
    """vLLM v1 block pool: least recently released first, tail blocks of a request first."""

    structures = frozenset({"block"})

    reads_access_metadata = False

    def bind(self, view: EntryView) -> None:
        super().bind(view)
        self._queue = SegmentQueue(view.num_entries)

    def on_evictable(self, entries: I64) -> None:
        self._queue.push(entries)

    def on_pinned(self, entries: I64) -> None:
        self._queue.drop(entries)

    on_remove = on_pinned

    def evict(self, n: int) -> I64:
        return self._queue.pop(n)

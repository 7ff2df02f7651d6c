"""Independent reference model of vLLM v1's prefix-caching ``BlockPool``.

This module is a test oracle. It is written from a reading of vLLM's
``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``) and
``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, ``FreeKVCacheBlockQueue``)
and re-implements their bookkeeping in plain, stdlib-only Python. It shares no
code with the project under test.

What is modelled
----------------
* ``KVCacheBlock``: ``block_id``, ``ref_cnt``, ``block_hash`` (``None`` when the
  block holds no reusable content) and the two free-list links.
* ``FreeKVCacheBlockQueue``: a doubly linked list with sentinel head and tail
  nodes, so that a block in the middle can be removed in O(1) (needed when a
  prefix hit revives a free block). Allocation pops from the front; the front
  is the next eviction victim.
* The hash -> blocks map. vLLM does not de-duplicate: several blocks may hold
  the same hash. They are kept in registration order and a lookup returns the
  earliest-registered block that still holds the hash.
* ``touch`` (ref_cnt += 1, unlinking the block from the free queue if it was a
  free eviction candidate), ``get_new_blocks`` (pop from the front; a popped
  block that still has a hash is evicted: dropped from the map and its hash
  cleared), ``cache_full_blocks`` and ``free_blocks`` (ref_cnt -= 1; blocks
  reaching 0 without a hash are put back at the FRONT of the queue in the order
  given, blocks with a hash are appended at the BACK in the order given).

Deliberate difference from vLLM
-------------------------------
vLLM's ``BlockPool.__init__`` pops block 0 off the free queue and keeps it as a
``null_block`` placeholder that is never allocated or freed, so a pool of
``num_gpu_blocks`` has ``num_gpu_blocks - 1`` usable blocks. This model does NOT
reserve a null block: all ``num_blocks`` blocks (ids ``0 .. num_blocks - 1``) are
usable and the free queue starts as ``[0, 1, ..., num_blocks - 1]``. A vLLM pool
with ``num_gpu_blocks = n + 1`` behaves like this model with ``num_blocks = n``
(block ids shifted by one).

Other simplifications: one KV-cache group, no KV events, no metrics, no
chained token hashing (the caller supplies the block keys).

Trace replay
------------
``replay_mooncake`` replays a Mooncake-style JSONL trace one request at a time
(see its docstring for the exact contract).

Run ``python tests/reference/vllm_pool_ref.py`` to execute the self-checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence

# The trace's ``hash_ids`` are used as block keys as they are.
BlockHash = int


class KVCacheBlock:
    """Metadata of one KV-cache block."""

    __slots__ = ("block_hash", "block_id", "next_free", "prev_free", "ref_cnt")

    def __init__(self, block_id: int) -> None:
        self.block_id: int = block_id
        self.ref_cnt: int = 0
        self.block_hash: BlockHash | None = None
        # Free-list links; only FreeKVCacheBlockQueue touches them. Both are
        # None exactly when the block is not linked into the free queue
        # (sentinels aside).
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={self.block_hash!r})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, front = next block to hand out."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)  # sentinel before the first free block
        self._tail = KVCacheBlock(-1)  # sentinel after the last free block
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks: int = 0
        self.append_n(list(blocks))

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the front block."""
        first = self._head.next_free
        if first is None or first is self._tail:
            raise ValueError("no free blocks available")
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the ``n`` front blocks, front first."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks, only {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it sits in the queue (O(1))."""
        before, after = block.prev_free, block.next_free
        if before is None or after is None:
            raise RuntimeError(f"{block!r} is not in the free queue")
        before.next_free = after
        after.prev_free = before
        block.prev_free = None
        block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` at the back."""
        self.append_n([block])

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` at the back, keeping their order (last one ends up last)."""
        self._link_after(self._tail.prev_free, blocks)

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Link ``blocks`` at the front, keeping their order (``blocks[0]`` ends up first)."""
        self._link_after(self._head, blocks)

    def _link_after(self, anchor: KVCacheBlock | None, blocks: Sequence[KVCacheBlock]) -> None:
        assert anchor is not None
        follower = anchor.next_free
        assert follower is not None
        prev = anchor
        for block in blocks:
            assert block.prev_free is None and block.next_free is None, block
            prev.next_free = block
            block.prev_free = prev
            prev = block
        prev.next_free = follower
        follower.prev_free = prev
        self.num_free_blocks += len(blocks)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free

    def block_ids(self) -> list[int]:
        """Ids of the free blocks, front (next to be evicted) first."""
        return [b.block_id for b in self]


class BlockPool:
    """Allocation, prefix-cache lookup, caching and freeing of KV-cache blocks.

    Unlike vLLM no null block is reserved: all ``num_blocks`` blocks are usable.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError("num_blocks must be positive")
        self.num_blocks: int = num_blocks
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # hash -> {block_id: block}; dicts keep insertion order, so the first
        # entry is the earliest-registered block still holding the hash.
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}

    # -- lookup -----------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """Earliest-registered block holding ``block_hash``, or None on a miss."""
        holders = self.cached_block_hash_to_block.get(block_hash)
        if not holders:
            return None
        return next(iter(holders.values()))

    # -- reference counting -----------------------------------------------
    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks; free ones leave the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` blocks from the front, evicting any cached content."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"cannot get {num_blocks} free blocks, only {self.num_free_blocks} free"
            )
        new_blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in new_blocks:
            self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, block
            block.ref_cnt = 1
        return new_blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block`` from the hash map and clear its hash, if it has one."""
        block_hash = block.block_hash
        if block_hash is None:
            return False
        holders = self.cached_block_hash_to_block.get(block_hash)
        if holders is None or holders.pop(block.block_id, None) is None:
            return False
        if not holders:
            del self.cached_block_hash_to_block[block_hash]
        block.block_hash = None
        return True

    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register ``blocks[j]`` under ``block_hashes[j]`` for cached <= j < full.

        A block that already has a hash (a prefix hit) is left alone. A hash that
        some other block already holds is registered again (a duplicate).
        """
        for j in range(num_cached_blocks, num_full_blocks):
            block = blocks[j]
            block_hash = block_hashes[j]
            if block.block_hash is not None:
                assert block.block_hash == block_hash, (block, block_hash)
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block, given in eviction-priority order.

        Blocks reaching ref_cnt 0 go back to the free queue: those without a hash
        to the front (handed out first), those with a hash to the back, each
        group keeping the given order.
        """
        blocks = list(ordered_blocks)
        for block in blocks:
            assert block.ref_cnt > 0, block
            block.ref_cnt -= 1
        released = [b for b in blocks if b.ref_cnt == 0]
        self.free_block_queue.prepend_n([b for b in released if b.block_hash is None])
        self.free_block_queue.append_n([b for b in released if b.block_hash is not None])

    # -- introspection ----------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def check_invariants(self) -> None:
        """Assert the pool's internal consistency (used by the self-checks)."""
        free_ids = self.free_block_queue.block_ids()
        free_set = set(free_ids)
        assert len(free_ids) == len(free_set) == self.num_free_blocks
        for block in self.blocks:
            assert block.ref_cnt >= 0
            assert (block.ref_cnt == 0) == (block.block_id in free_set), block
            if block.block_hash is not None:
                holders = self.cached_block_hash_to_block[block.block_hash]
                assert holders[block.block_id] is block
        for block_hash, holders in self.cached_block_hash_to_block.items():
            assert holders
            for block in holders.values():
                assert block.block_hash == block_hash


# -- trace replay ---------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def serve_request(
    pool: BlockPool,
    hash_ids: Sequence[BlockHash],
    input_length: int,
    output_length: int,
    block_tokens: int = 512,
    min_recompute_tokens: int = 1,
) -> int:
    """Run one request to completion on ``pool``; return its prefix-hit tokens.

    Steps: prefix lookup (capped), touch the hits, allocate the rest, then at
    finish register the new full input blocks and free every block tail-first.
    """
    num_full = input_length // block_tokens
    if len(hash_ids) < num_full:
        raise ValueError(f"{len(hash_ids)} hash_ids for {num_full} full input blocks")
    max_hit_blocks = max(0, (input_length - min_recompute_tokens) // block_tokens)

    hits: list[KVCacheBlock] = []
    for j in range(min(num_full, max_hit_blocks)):
        block = pool.get_cached_block(hash_ids[j])
        if block is None:
            break
        hits.append(block)

    num_new = _cdiv(input_length + output_length, block_tokens) - len(hits)
    # Capacity check before any state change: hits that are free eviction
    # candidates will leave the free queue when touched.
    num_free_after_touch = pool.num_free_blocks - sum(b.ref_cnt == 0 for b in hits)
    if num_new > num_free_after_touch:
        raise ValueError(
            f"request needs {num_new} new blocks but only {num_free_after_touch} are free"
        )
    # Touch first so that get_new_blocks cannot evict the blocks just hit.
    pool.touch(hits)
    req_blocks = hits + pool.get_new_blocks(num_new)

    # Request finished: cache its new full input blocks, release tail first.
    pool.cache_full_blocks(req_blocks, hash_ids, len(hits), num_full)
    pool.free_blocks(reversed(req_blocks))
    return len(hits) * block_tokens


def replay_mooncake(
    path: str,
    num_blocks: int,
    block_tokens: int = 512,
    min_recompute_tokens: int = 1,
) -> tuple[int, int]:
    """Replay a Mooncake JSONL trace sequentially; return (hit_tokens, input_tokens).

    Each line has ``input_length``, ``output_length`` and ``hash_ids`` (one id
    per ``block_tokens``-token input block, the last possibly partial; equal
    ids mean equal prefixes). Requests run one at a time, in file order, on a
    fresh ``BlockPool(num_blocks)``:

    * full keyed blocks are ``j < input_length // block_tokens``, key ``hash_ids[j]``;
    * lookup walks them in order and stops at the first miss; at most
      ``(input_length - min_recompute_tokens) // block_tokens`` blocks can hit;
    * the request holds ``ceil((input_length + output_length) / block_tokens)``
      blocks: the hits (touched) plus new blocks; too few free blocks raises
      ``ValueError``;
    * at finish the new full input blocks are registered (duplicates allowed)
      and all blocks are freed in reverse position order.
    """
    pool = BlockPool(num_blocks)
    num_hit_tokens = 0
    num_input_tokens = 0
    with open(path, encoding="utf-8") as trace:
        for line in trace:
            if not line.strip():
                continue
            req = json.loads(line)
            num_hit_tokens += serve_request(
                pool,
                req["hash_ids"],
                req["input_length"],
                req["output_length"],
                block_tokens,
                min_recompute_tokens,
            )
            num_input_tokens += req["input_length"]
    return num_hit_tokens, num_input_tokens


# -- self-checks ----------------------------------------------------------


def _selftest() -> None:
    """Hand-computed 4-block scenario (block_tokens = 4)."""
    pool = BlockPool(4)
    free = pool.free_block_queue.block_ids
    assert free() == [0, 1, 2, 3]

    # A: 8 input + 4 output tokens, keys [10, 11]. Miss; 3 blocks: 0, 1, 2.
    # Finish: 0<-10, 1<-11. Free tail first: 2 (no hash) -> front; 1, 0 -> back.
    assert serve_request(pool, [10, 11], 8, 4, block_tokens=4) == 0
    assert free() == [2, 3, 1, 0], free()  # hashless first, then tail-first order
    assert pool.get_cached_block(10) is pool.blocks[0]
    assert pool.get_cached_block(11) is pool.blocks[1]
    pool.check_invariants()

    # B: 8 input tokens, keys [10, 11]. Cap (8 - 1) // 4 = 1: hit block 0 only.
    # 2 blocks: block 0 (hit) + new block 2 at position 1, which is registered
    # under 11 although block 1 still holds 11 (a duplicate).
    assert serve_request(pool, [10, 11], 8, 0, block_tokens=4) == 4
    assert [b.block_id for b in pool.cached_block_hash_to_block[11].values()] == [1, 2]
    assert pool.get_cached_block(11) is pool.blocks[1]  # earliest registration wins
    # Free tail first: 2 (hash 11), then 0 (hash 10), both to the back.
    assert free() == [3, 1, 2, 0], free()
    pool.check_invariants()

    # C: 4 input + 4 output tokens, key [20]. Cap (4 - 1) // 4 = 0: no lookup.
    # New blocks: 3 (hashless), then 1, whose hash 11 is evicted.
    # Finish: 3<-20; free 1 (no hash) -> front, 3 (hash 20) -> back.
    assert serve_request(pool, [20], 4, 4, block_tokens=4) == 0
    assert pool.blocks[1].block_hash is None
    assert pool.get_cached_block(11) is pool.blocks[2]  # falls back to the later duplicate
    assert free() == [1, 2, 0, 3], free()
    pool.check_invariants()

    # D: 9 input tokens, keys [10, 11, 30]. Two full blocks, cap 2: both hit
    # (0 and the duplicate 2). 3 blocks: 0, 2 + new block 1 (partial, no hash).
    assert serve_request(pool, [10, 11, 30], 9, 0, block_tokens=4) == 8
    assert free() == [1, 3, 2, 0], free()
    pool.check_invariants()

    # E: needs 5 blocks from a 4-block pool -> error, pool untouched.
    try:
        serve_request(pool, [40, 41, 42, 43, 44], 20, 0, block_tokens=4)
    except ValueError:
        pass
    else:
        raise AssertionError("over-capacity request must raise")
    assert free() == [1, 3, 2, 0], free()
    pool.check_invariants()
    print("vllm_pool_ref self-test passed")


if __name__ == "__main__":
    _selftest()

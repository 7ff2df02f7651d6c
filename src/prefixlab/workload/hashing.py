"""Chained block keys, computed for a whole trace at once with numpy.

A block key names a whole prefix: key(i) = hash(key(i-1), tokens of block i, extra_key).
We use a chaining function that is *linear* in the previous state, so the chain becomes a
prefix scan that numpy evaluates without a Python loop per block::

    x_j   = mix(token_j)                       per-token 64-bit scramble
    H(L)  = sum_{j<L} x_j * r^(L-1-j)  mod 2^64   polynomial hash of the first L tokens
          = H(L-B) * r^B + sum over the block's tokens    (the chain: depends on key i-1)
    key   = mix(H(L) xor mix(L xor salt(extra_key)))      64-bit finaliser

    tokens   t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9        block_tokens = 4
    keys         k0      |     k1      | (k2 partial, only if asked)

With r odd, r is invertible mod 2^64, so H(L) = r^(L-1) * S(L-1) where S is a cumulative sum
of x_j * r^-j: one ``cumsum`` over the flattened trace gives every prefix hash. The length L
enters the finaliser, so a trailing partial block never collides with a full one.
"""

from __future__ import annotations

import numpy as np

from prefixlab.types import I64, U64

_MASK = (1 << 64) - 1
_R = 0x9E3779B97F4A7C15 | 1  # odd multiplier of the polynomial
_R_INV = pow(_R, -1, 1 << 64)
_TOKEN_SALT = np.uint64(0x5851F42D4C957F2D)


def splitmix64(x: U64) -> U64:
    """Vectorised splitmix64 finaliser (a bijection on 64-bit integers)."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))  # type: ignore[no-any-return]


def _powers(base: int, n: int) -> U64:
    """base^0 .. base^(n-1) mod 2^64."""
    out = np.empty(max(n, 1), dtype=np.uint64)
    out[0] = 1
    if n > 1:
        steps = np.full(n - 1, base, dtype=np.uint64)
        with np.errstate(over="ignore"):
            out[1:] = np.cumprod(steps, dtype=np.uint64)
    return out[:n]


def extra_key_salt(extra_key: int | str | None) -> int:
    """Salt of an extra key (LoRA adapter, tenant, multimodal id); 0 when there is none."""
    if extra_key is None or extra_key == 0:
        return 0
    value: int
    if isinstance(extra_key, str):
        acc = 0xCBF29CE484222325  # FNV-1a, stable across runs (unlike hash())
        for byte in extra_key.encode():
            acc = ((acc ^ byte) * 0x100000001B3) & _MASK
        value = acc
    else:
        value = int(extra_key) & _MASK
    return int(splitmix64(np.array([value], dtype=np.uint64))[0])


def prefix_hashes(tokens: I64, offsets: I64) -> U64:
    """Polynomial hash H(L) of every prefix of every sequence, flattened like ``tokens``.

    Entry ``offsets[s] + L - 1`` holds the hash of sequence s's first L tokens.
    """
    n = int(tokens.shape[0])
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    lengths = np.diff(offsets)
    seq_of = np.repeat(np.arange(lengths.shape[0]), lengths)
    local = np.arange(n, dtype=np.int64) - offsets[seq_of]
    max_len = int(lengths.max())
    x = splitmix64(tokens.astype(np.uint64) ^ _TOKEN_SALT)
    with np.errstate(over="ignore"):
        scaled = x * _powers(_R_INV, max_len)[local]
        total = np.cumsum(scaled, dtype=np.uint64)
        # Segmented cumsum: subtract the running total before each sequence's start.
        starts = offsets[:-1]
        before = np.zeros(lengths.shape[0], dtype=np.uint64)
        nonzero = starts > 0
        before[nonzero] = total[starts[nonzero] - 1]
        seg = total - before[seq_of]
        return seg * _powers(_R, max_len)[local]  # type: ignore[no-any-return]


def chained_block_keys(
    tokens: I64,
    offsets: I64,
    block_tokens: int,
    extra_key: int | str | None = None,
    include_partial: bool = False,
    salts: U64 | None = None,
) -> tuple[U64, I64]:
    """Chained keys of every block of every sequence.

    Args:
        tokens: all sequences' token ids, concatenated.
        offsets: ``len(sequences) + 1`` start offsets into ``tokens``.
        block_tokens: tokens per block.
        extra_key: salt mixed into every key (LoRA / tenant); ``None`` for none.
        include_partial: also key each sequence's trailing partial block.
        salts: one extra salt per sequence (per-request LoRA / tenant keys), or None.

    Returns:
        ``(keys, key_offsets)``: keys of sequence s are ``keys[key_offsets[s]:key_offsets[s+1]]``.
    """
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    lengths = np.diff(offsets)
    full = lengths // block_tokens
    partial = (lengths % block_tokens > 0) if include_partial else np.zeros_like(full, bool)
    counts = full + partial.astype(np.int64)
    key_offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=key_offsets[1:])
    total_keys = int(key_offsets[-1])
    if total_keys == 0:
        return np.zeros(0, dtype=np.uint64), key_offsets
    seq_of = np.repeat(np.arange(lengths.shape[0]), counts)
    block_idx = np.arange(total_keys, dtype=np.int64) - key_offsets[seq_of]
    covered = np.minimum((block_idx + 1) * block_tokens, lengths[seq_of])
    hashes = prefix_hashes(tokens, offsets)[offsets[seq_of] + covered - 1]
    salt = np.uint64(extra_key_salt(extra_key))
    if salts is not None:
        length_mix = splitmix64(covered.astype(np.uint64) ^ salt ^ salts[seq_of])
    else:
        length_mix = splitmix64(covered.astype(np.uint64) ^ salt)
    return splitmix64(hashes ^ length_mix), key_offsets


def salt_hash_ids(hash_ids: U64, extra_key: int | str | None) -> U64:
    """Apply an extra-key salt to ready-made block ids (hash-form traces)."""
    salt = extra_key_salt(extra_key)
    if salt == 0:
        return hash_ids
    return splitmix64(hash_ids ^ np.uint64(salt))


def request_salts(extra_keys: list[str | None]) -> U64 | None:
    """One salt per request from per-request extra keys (None when no request has one)."""
    if all(k is None for k in extra_keys):
        return None
    return np.array([extra_key_salt(k) for k in extra_keys], dtype=np.uint64)


def salt_per_key(raw: U64, salts: U64) -> U64:
    """Salt each ready-made id with its request's salt (zero salt: unchanged)."""
    mixed = splitmix64(raw ^ salts)
    return np.where(salts != 0, mixed, raw)

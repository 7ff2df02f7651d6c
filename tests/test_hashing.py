"""Chained block keys: vectorised result equals a plain Python chain; prefix semantics; a
per-request extra key (LoRA adapter, tenant) keeps equal prompts apart in every form."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefixlab.runner import ReplayConfig, replay
from prefixlab.workload import Request, Trace, load_trace
from prefixlab.workload.hashing import chained_block_keys, extra_key_salt

M = (1 << 64) - 1
R = 0x9E3779B97F4A7C15 | 1
TOKEN_SALT = 0x5851F42D4C957F2D


def py_splitmix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def py_chain(tokens: list[int], block_tokens: int, salt: int, partial: bool) -> list[int]:
    """The chain written the slow, obvious way: key(i) from H(i-1) and block i's tokens."""
    keys: list[int] = []
    h = 0
    n_full = len(tokens) // block_tokens
    ends = [(i + 1) * block_tokens for i in range(n_full)]
    if partial and len(tokens) % block_tokens:
        ends.append(len(tokens))
    pos = 0
    for end in ends:
        for t in tokens[pos:end]:  # H(L) = H(L-1) * r + x_L  (mod 2^64)
            h = (h * R + py_splitmix(t ^ TOKEN_SALT)) & M
        pos = end
        keys.append(py_splitmix(h ^ py_splitmix(end ^ salt)))
    return keys


def _keys(seqs: list[list[int]], bt: int, extra: int | str | None = None, partial: bool = False):
    flat = np.array([t for s in seqs for t in s], dtype=np.int64)
    offs = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offs[1:])
    keys, koffs = chained_block_keys(flat, offs, bt, extra, partial)
    return [keys[koffs[i] : koffs[i + 1]].tolist() for i in range(len(seqs))]


def test_vectorised_chain_equals_python_chain() -> None:
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50_000, n).tolist() for n in (0, 1, 3, 4, 5, 17, 64, 130)]
    for partial in (False, True):
        got = _keys(seqs, 4, partial=partial)
        want = [py_chain(s, 4, 0, partial) for s in seqs]
        assert got == want


def test_equal_prefix_equal_keys_then_diverge() -> None:
    a = list(range(40))
    b = [*range(24), 999, *range(25, 40)]  # differs in block 3 (tokens 24..31)
    ka, kb = _keys([a, b], 8)
    assert ka[:3] == kb[:3]
    assert all(x != y for x, y in zip(ka[3:], kb[3:], strict=True))  # chained: all later differ


def test_same_block_content_at_other_prefix_gets_other_key() -> None:
    block = [7, 7, 7, 7]
    ka, kb = _keys([[1, 2, 3, 4, *block], [5, 6, 7, 8, *block]], 4)
    assert ka[1] != kb[1]


def test_partial_block_key_differs_from_full_block_key() -> None:
    full, part = _keys([list(range(8)), list(range(7))], 4, partial=True)
    assert len(full) == 2 and len(part) == 2
    assert full[0] == part[0] and full[1] != part[1]


def test_extra_key_salts_every_key_and_is_stable() -> None:
    seq = [list(range(12))]
    plain = _keys(seq, 4)[0]
    lora = _keys(seq, 4, "lora-a")[0]
    assert all(x != y for x, y in zip(plain, lora, strict=True))
    assert _keys(seq, 4, "lora-a")[0] == lora
    assert extra_key_salt(None) == 0 and extra_key_salt(0) == 0
    # FNV-1a + splitmix64: stable across processes and versions (a golden value).
    assert extra_key_salt("lora-a") == py_splitmix(_fnv1a(b"lora-a"))


def _fnv1a(data: bytes) -> int:
    acc = 0xCBF29CE484222325
    for byte in data:
        acc = ((acc ^ byte) * 0x100000001B3) & M
    return acc


def test_golden_key_does_not_drift() -> None:
    assert _keys([[1, 2, 3, 4]], 4)[0] == [py_chain([1, 2, 3, 4], 4, 0, False)[0]]
    assert _keys([[1, 2, 3, 4]], 4)[0][0] == 12200409876713647492


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_tokens"):
        _keys([[1, 2]], 0)


def test_per_request_extra_key_isolates_tenants(tmp_path: Path) -> None:
    from prefixlab.workload import write_native
    from prefixlab.workload.trace import to_hash_form

    tokens = list(range(40))

    def req(i: int, key: str | None) -> Request:
        return Request(float(i), 40, 0, input_tokens=tokens, extra_key=key)

    trace = Trace.from_requests(
        [req(0, "lora-a"), req(1, "lora-b"), req(2, "lora-a"), req(3, None)]
    )
    cfg = ReplayConfig(capacity_blocks=64, block_tokens=8)
    # Same tokens: only the request with the same adapter reuses them (4 blocks, capped).
    assert replay(trace, "lru", cfg).hit_tokens.tolist() == [0, 0, 32, 0]
    hashed = to_hash_form(trace, 8)
    assert replay(hashed, "lru", ReplayConfig(capacity_blocks=64)).hit_tokens.tolist() == [
        0,
        0,
        32,
        0,
    ]
    path = tmp_path / "t.jsonl"
    write_native(trace, path)
    back = load_trace(path)
    assert back.extra_key == ["lora-a", "lora-b", "lora-a", None]
    assert replay(back, "lru", cfg).hit_tokens.tolist() == [0, 0, 32, 0]
    # Hash form: ids are salted per request too.
    h = Trace.from_requests(
        [
            Request(float(i), 32, 0, hash_ids=[1, 2], extra_key=k)
            for i, k in enumerate(["t1", "t2", "t1"])
        ],
        block_tokens=16,
    )
    assert replay(h, "lru", ReplayConfig(capacity_blocks=8)).hit_tokens.tolist() == [0, 0, 16]

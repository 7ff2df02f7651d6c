"""Admission policies: what a cache stores of a new sequence (DESIGN §2-3).

The hybrid cache (:class:`prefixlab.cache.hybrid.HybridCache`) asks its policy's admission
object, before it inserts a sequence, how many of its tokens to store and which
recurrent-state checkpoints to leave; it then emits ``Admitted`` (the checkpoints stored)
or ``Rejected`` (the sequence refused: by the admission, or because it cannot fit).

============== ========= ==========================================================
admission      systems   checkpoints of a sequence of ``n`` tokens
============== ========= ==========================================================
``none``       vanilla   none: nothing is stored
``all-blocks`` vLLM+     one every ``block_tokens`` (and at ``n`` with partial blocks)
``judicious``  Marconi,  the branch point (speculative insertion: where the sequence
               SGLang+   leaves an existing edge, rounded down to ``chunk_tokens``) and
                         the state after the last decoded token (``n``)
============== ========= ==========================================================

An admission object is immutable and holds its own parameters; the compiled replay reads
:attr:`Admission.code` and the same parameters, so a third-party admission (a subclass)
runs on the object tree only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

#: the compiled replay's admission codes, by name
CODES = {"none": 0, "all-blocks": 1, "judicious": 2}
#: which match gives the branch point: the whole sequence's (input + output, as Marconi's
#: simulator places it) or the input's (the paper's Sec. 4.1 words)
BRANCHES = ("sequence", "input")


@dataclass(frozen=True, slots=True)
class Admission:
    """Base: store every token, no checkpoint."""

    name: ClassVar[str] = "base"
    #: the compiled replay's code (-1: none; the object tree only)
    code: ClassVar[int] = -1

    def branch_match(self) -> str:
        """Which match's divergence is the branch point: "sequence", "input", or "" (the
        admission places no branch checkpoint and needs no match)."""
        return ""

    def admit(self, seq_tokens: int) -> bool:
        """Whether anything of a sequence of ``seq_tokens`` tokens is stored."""
        return seq_tokens > 0

    def stored_tokens(self, seq_tokens: int) -> int:
        """How many of the sequence's tokens are stored (its first ones)."""
        return seq_tokens

    def checkpoints(self, seq_tokens: int, branch_at: int | None) -> list[int]:
        """Token positions that get a checkpoint, ascending. ``branch_at``: where the
        sequence (or its input, see :attr:`branch`) leaves an edge strictly inside it, or
        None when it leaves at a node boundary (or the model has no state to keep)."""
        return []

    def reusable(self, tokens: int, has_state: bool) -> int:
        """Of ``tokens`` matched and reusable, those the engine reuses (vLLM+ on a model
        without state reuses KV in whole blocks)."""
        return tokens

    @property
    def fills_partial_blocks(self) -> bool:
        """A stored partial block that a new sequence extends is filled in place."""
        return False


@dataclass(frozen=True, slots=True)
class NoAdmission(Admission):
    """Store nothing (the vanilla baseline: every prompt prefilled in full)."""

    name: ClassVar[str] = "none"
    code: ClassVar[int] = CODES["none"]

    def admit(self, seq_tokens: int) -> bool:
        return False

    def stored_tokens(self, seq_tokens: int) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class AllBlocks(Admission):
    """vLLM+ (Marconi, Sec. 5.1): a checkpoint at every block boundary."""

    block_tokens: int = 32
    #: also store a trailing partial block, with a checkpoint at its end
    partial_blocks: bool = False
    name: ClassVar[str] = "all-blocks"
    code: ClassVar[int] = CODES["all-blocks"]

    def __post_init__(self) -> None:
        if isinstance(self.block_tokens, bool) or not isinstance(self.block_tokens, int):
            raise ValueError(f"block_tokens must be an integer, got {self.block_tokens!r}")
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")

    def stored_tokens(self, seq_tokens: int) -> int:
        if self.partial_blocks:
            return seq_tokens
        return seq_tokens - seq_tokens % self.block_tokens

    def checkpoints(self, seq_tokens: int, branch_at: int | None) -> list[int]:
        b, n = self.block_tokens, seq_tokens
        out = list(range(b, n - n % b + 1, b)) if n >= b else []
        if self.partial_blocks and n % b:
            out.append(n)  # the trailing partial block has a state too
        return out

    def reusable(self, tokens: int, has_state: bool) -> int:
        return tokens if has_state else tokens - tokens % self.block_tokens

    @property
    def fills_partial_blocks(self) -> bool:
        return self.partial_blocks


@dataclass(frozen=True, slots=True)
class Judicious(Admission):
    """Marconi (Sec. 4.1): checkpoint the branch point and the last decoded token only."""

    #: round the branch point down to a multiple of this (0: exact), as chunked prefill
    #: can only keep a state at a chunk's end
    chunk_tokens: int = 0
    #: the branch point of the whole sequence's match or of the input's (:data:`BRANCHES`)
    branch: str = "sequence"
    name: ClassVar[str] = "judicious"
    code: ClassVar[int] = CODES["judicious"]

    def __post_init__(self) -> None:
        if self.branch not in BRANCHES:
            raise ValueError(f"branch must be one of {', '.join(BRANCHES)}, got {self.branch!r}")
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int):
            raise ValueError(f"chunk_tokens must be an integer, got {self.chunk_tokens!r}")

    def branch_match(self) -> str:
        return self.branch

    def checkpoints(self, seq_tokens: int, branch_at: int | None) -> list[int]:
        out = []
        if branch_at is not None:
            q = branch_at - branch_at % self.chunk_tokens if self.chunk_tokens else branch_at
            if q > 0:
                out.append(q)
        out.append(seq_tokens)
        return sorted(set(out))

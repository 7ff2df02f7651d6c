"""The rules of a prefixlab trace request, one place for every format that carries them.

The native JSONL loader and the Parquet loader read a request's fields through
:func:`read_request` (a :class:`~prefixlab.workload.loaders.base.FieldReader` over a line's
object, or a :class:`RowReader` over a Parquet row's) and check each request against the
previous one with :func:`check_order`, so both accept and refuse the same traces with the
same words; only the place differs (``file:line`` for JSONL, ``row N`` for Parquet).
"""

from __future__ import annotations

from prefixlab.errors import TraceFormatError
from prefixlab.workload.loaders.base import FieldReader, check_hash_ids
from prefixlab.workload.trace import Request

#: every field (JSONL) or column (Parquet) a prefixlab trace request may have
FIELDS = frozenset(
    {
        "arrival_s",
        "input_length",
        "output_length",
        "input_tokens",
        "output_tokens",
        "hash_ids",
        "hashed_tokens",
        "session_id",
        "turn",
        "task",
        "prompt_text",
        "reply_text",
        "extra_key",
        "think_s",
    }
)


class RowReader(FieldReader):
    """A :class:`FieldReader` over one Parquet row (``lineno`` holds the 0-based row): its
    errors name the file, the row and the column."""

    __slots__ = ()

    def fail(self, field: str, message: str) -> TraceFormatError:
        return TraceFormatError(str(self.path), None, field, message, row=self.lineno)


def unknown_fields(names: set[str] | frozenset[str]) -> str | None:
    """The first name that is not a request field, or None."""
    unknown = sorted(names - FIELDS)
    return unknown[0] if unknown else None


def known_fields() -> str:
    return "known: " + ", ".join(sorted(FIELDS))


def read_request(f: FieldReader, block_tokens: int | None) -> Request:
    """One request from its fields, every value checked (a missing or null optional field
    takes its default)."""
    unknown = unknown_fields(set(f.obj))
    if unknown is not None:
        # A misspelt field would otherwise vanish without a word (e.g. sesion_id).
        raise f.fail(unknown, f"unknown field; {known_fields()}")
    inp_tokens = f.int_list("input_tokens", required=False)
    hash_ids = f.int_list("hash_ids", required=False, limit=1 << 64)
    if (inp_tokens is None) == (hash_ids is None):
        raise f.fail("input_tokens", "give exactly one of 'input_tokens' or 'hash_ids'")
    out_tokens = f.int_list("output_tokens", required=False)
    inp = _length(f, "input_length", inp_tokens)
    out = _length(f, "output_length", out_tokens)
    hashed = None
    if hash_ids is not None:
        if block_tokens is None:
            raise f.fail("hash_ids", "hash-form requests need a header line with block_tokens")
        hashed = f.int_("hashed_tokens", required=False, default=inp)
        if hashed > inp + out:
            raise f.fail("hashed_tokens", f"{hashed} exceeds input+output ({inp + out})")
        check_hash_ids(f, hash_ids, hashed, block_tokens)
    return Request(
        arrival_s=f.float_("arrival_s", required=False),
        input_length=inp,
        output_length=out,
        session_id=f.str_("session_id"),
        turn=f.int_("turn", required=False),
        task=f.str_("task"),
        input_tokens=inp_tokens,
        output_tokens=out_tokens,
        hash_ids=hash_ids,
        hashed_tokens=hashed,
        prompt_text=f.str_("prompt_text"),
        reply_text=f.str_("reply_text"),
        extra_key=f.str_("extra_key"),
        think_s=f.float_("think_s") if f.obj.get("think_s") is not None else None,
    )


def _length(f: FieldReader, field: str, tokens: list[int] | None) -> int:
    """A length field: required, unless the tokens are given, whose count it must equal."""
    if tokens is None:
        return f.int_(field)
    n = f.int_(field, required=False, default=len(tokens))
    if n != len(tokens):
        what = field.replace("_length", "_tokens")
        raise f.fail(field, f"{n} but {what} has {len(tokens)}")
    return n


def check_order(f: FieldReader, req: Request, previous: Request | None) -> None:
    """Requests come in arrival order, all in one form (tokens or hash ids)."""
    if previous is None:
        return
    if req.arrival_s < previous.arrival_s:
        raise f.fail(
            "arrival_s",
            f"{req.arrival_s} is earlier than the previous request's "
            f"{previous.arrival_s}: requests must be in arrival order",
        )
    if (req.hash_ids is None) != (previous.hash_ids is None):
        raise f.fail("hash_ids", "mixes token and hash forms")

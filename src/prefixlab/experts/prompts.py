"""Prompts and tokenizers for recording expert routing (``prefixlab experts record``)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from prefixlab.errors import ConfigError, TraceFormatError
from prefixlab.types import I64
from prefixlab.workload.tokenizers import Tokenizer, as_tokenizer, to_csr


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a text file (one per non-blank line) or JSONL (``.jsonl``/``.json``)
    whose lines are objects with a string ``prompt`` or ``text`` field.

    Raises:
        ConfigError: the file is missing or holds no prompt.
        TraceFormatError: a JSONL line is not an object with a string prompt (names the line).
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"prompts file not found: {p}")
    jsonl = p.suffix.lower() in (".jsonl", ".json")
    prompts: list[str] = []
    with p.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            prompts.append(_json_prompt(p, line_no, line) if jsonl else line.rstrip("\r\n"))
    if not prompts:
        raise ConfigError(f"prompts file {p} holds no prompt")
    return prompts


def _json_prompt(path: Path, line_no: int, line: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(str(path), line_no, None, f"not valid JSON: {exc.msg}") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(str(path), line_no, None, "expected a JSON object")
    field = "prompt" if "prompt" in obj else "text" if "text" in obj else None
    if field is None:
        raise TraceFormatError(str(path), line_no, "prompt", "missing 'prompt' or 'text'")
    if not isinstance(obj[field], str):
        raise TraceFormatError(str(path), line_no, field, "must be a string")
    return str(obj[field])


class ModelTokenizer(Tokenizer):
    """A model's own transformers tokenizer; adds its special tokens (e.g. BOS) as the model
    expects in front of a prompt."""

    def __init__(self, hf_tokenizer: object, name: str) -> None:
        self._tok: Any = cast(Any, hf_tokenizer)  # Any: a transformers tokenizer (optional)
        self.name = name
        self.vocab_size = len(self._tok)

    def encode_batch(self, texts: Sequence[str]) -> tuple[I64, I64]:
        return to_csr(self._tok(list(texts), add_special_tokens=True)["input_ids"] if texts else [])


def load_tokenizer(model_id_or_path: str, spec: str | None = None) -> Tokenizer:
    """The tokenizer for recording: ``spec`` (a prefixlab tokenizer spec such as ``bytes``
    or ``llama3``) if given, else the model's own tokenizer via ``AutoTokenizer``.

    Raises:
        ConfigError: the model has no loadable tokenizer (the reason is quoted) and no spec.
    """
    if spec is not None:
        return as_tokenizer(spec)
    from prefixlab.experts.hf_model import import_backend

    _, transformers = import_backend()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(model_id_or_path)
    except Exception as exc:  # OSError, ValueError, ImportError from tokenizer backends
        reason = " ".join(str(exc).split())
        raise ConfigError(
            f"model '{model_id_or_path}' has no tokenizer AutoTokenizer can load "
            f"({type(exc).__name__}: {reason}); pass a tokenizer spec such as 'bytes' or 'llama3'"
        ) from None
    return ModelTokenizer(tok, model_id_or_path)


def tokenize_prompts(
    prompts: Sequence[str], tokenizer: str | Tokenizer, *, vocab_size: int | None = None
) -> list[list[int]]:
    """Token ids of each prompt; with ``vocab_size``, ids beyond the model's vocabulary raise.

    Raises:
        ConfigError: an id ``>= vocab_size`` (names the prompt, the id and the tokenizer).
    """
    tok = as_tokenizer(tokenizer)
    ids, offsets = tok.encode_batch(list(prompts))
    lists = [ids[a:b].tolist() for a, b in itertools.pairwise(offsets)]
    if vocab_size is not None:
        for i, p in enumerate(lists):
            bad = [t for t in p if t >= vocab_size]
            if bad:
                raise ConfigError(
                    f"prompt {i}: tokenizer {tok.name} gave id {bad[0]} but the model's "
                    f"vocabulary has {vocab_size} ids; use the model's own tokenizer"
                )
    return lists

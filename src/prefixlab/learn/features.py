"""LPC's features: what a conversation says about whether it will continue.

For each request: the current user prompt and the previous ``history`` (4) user prompts of
its conversation, cut to a ``token_budget`` (512, the embedder's input size) split evenly
across those prompts, each taking half of its share from the head of the prompt and half
from the tail; plus the turn count. Model replies are not used unless ``replies`` is set:
then each turn of the window is its prompt followed by the model's reply (``reply_text``),
the turn's share split evenly between the two (a short one leaves the rest to the other),
each cut head-and-tail. A request's own reply counts: LPC ranks a sequence's blocks when it
finishes, when the reply is known.

The label of a request is whether its conversation continues after it (a later turn of
the same session exists in the trace). Requests without a session are one-turn
conversations: they never continue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixlab.errors import ConfigError
from prefixlab.types import B1, I64
from prefixlab.workload.tokenizers import Tokenizer, as_tokenizer
from prefixlab.workload.trace import Trace


@dataclass(frozen=True, slots=True)
class FeatureConfig:
    history: int = 4
    token_budget: int = 512
    replies: bool = False

    def validate(self) -> None:
        if not isinstance(self.replies, bool):
            raise ConfigError(f"replies must be true or false, got {self.replies!r}")
        for name in ("history", "token_budget"):
            v = getattr(self, name)
            low = 0 if name == "history" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {v!r}")
        if self.token_budget < self.history + 1:
            raise ConfigError(
                f"token_budget {self.token_budget} cannot give each of {self.history + 1} "
                "prompts a token"
            )


@dataclass(slots=True)
class Features:
    """Per request: the windowed prompt tokens (ragged), the turn count, the label."""

    ids: I64
    offsets: I64
    turns: I64
    labels: B1
    sessions: list[str]
    #: boundaries of the window's parts (each prompt, each reply) in ``ids``; request i's
    #: parts are ``part_offsets[row_parts[i]] .. part_offsets[row_parts[i + 1]]``
    part_offsets: I64 | None = None
    row_parts: I64 | None = None

    def __len__(self) -> int:
        return int(self.turns.shape[0])

    def tokens(self, i: int) -> I64:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]


def conversations(trace: Trace) -> tuple[list[str], list[list[int]]]:
    """Each request's conversation key, and every conversation's requests in turn order."""
    # a request without a session is its own conversation (a NUL never appears in ids)
    keys = [s if s is not None else f"\0request-{i}" for i, s in enumerate(trace.session_id)]
    order: dict[str, list[int]] = {}
    for i in np.lexsort((np.arange(len(trace)), trace.arrival_s)).tolist():
        order.setdefault(keys[i], []).append(i)
    return keys, list(order.values())


def continuation_labels(trace: Trace) -> B1:
    """True where the conversation has a later request."""
    labels = np.zeros(len(trace), dtype=bool)
    for rows in conversations(trace)[1]:
        labels[rows[:-1]] = True
    return labels


def head_tail(ids: I64, share: int) -> I64:
    """At most ``share`` tokens: the first ceil(share/2) and the last floor(share/2)."""
    n = int(ids.shape[0])
    if n <= share:
        return ids
    head = share - share // 2
    tail = share // 2
    return np.concatenate([ids[:head], ids[n - tail :]]) if tail else ids[:head]


def split_share(prompt_len: int, reply_len: int, share: int) -> tuple[int, int]:
    """Tokens kept of a turn's prompt and of its reply within ``share``: half each, the
    shorter one giving what it does not use to the other."""
    half_p, half_r = share - share // 2, share // 2
    if prompt_len <= half_p:
        prompt = prompt_len
        reply = min(reply_len, share - prompt)
    elif reply_len <= half_r:
        reply = reply_len
        prompt = min(prompt_len, share - reply)
    else:
        prompt, reply = half_p, half_r
    return prompt, reply


def build_features(
    trace: Trace, tokenizer: str | Tokenizer = "llama3", config: FeatureConfig | None = None
) -> Features:
    """The windowed prompts of every request (oldest prompt first, current last)."""
    cfg = config or FeatureConfig()
    cfg.validate()
    _require_texts(trace, cfg)
    per, rep = _encode_turns(trace, as_tokenizer(tokenizer), cfg)
    keys, convs = conversations(trace)
    position = np.zeros(len(trace), dtype=np.int64)
    prev: dict[int, list[int]] = {}
    for rows in convs:
        for j, r in enumerate(rows):
            position[r] = j
            prev[r] = rows[max(0, j - cfg.history) : j]
    share = cfg.token_budget // (cfg.history + 1)
    parts: list[I64] = []
    lengths = np.zeros(len(trace), dtype=np.int64)
    part_lengths: list[int] = []
    row_parts = np.zeros(len(trace) + 1, dtype=np.int64)
    for r in range(len(trace)):
        window = _window(per, rep, [*prev[r], r], share)
        joined = np.concatenate(window) if window else np.zeros(0, dtype=np.int64)
        parts.append(joined)
        lengths[r] = joined.shape[0]
        part_lengths += [int(w.shape[0]) for w in window]
        row_parts[r + 1] = len(part_lengths)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    part_offsets = np.concatenate([[0], np.cumsum(part_lengths, dtype=np.int64)]).astype(np.int64)
    return Features(
        ids.astype(np.int64),
        offsets,
        position + 1,
        continuation_labels(trace),
        keys,
        part_offsets,
        row_parts,
    )


def _require_texts(trace: Trace, cfg: FeatureConfig) -> None:
    """Raise unless the trace has the prompts' text (and the replies', with ``replies``)."""
    if trace.prompt_text is None or all(t is None for t in trace.prompt_text):
        raise ConfigError(
            f"{trace.name}: LPC needs the prompts' text (a text format such as sharegpt, or "
            "the lpc generator); this trace has none"
        )
    if cfg.replies and all(t is None for t in trace.reply_text):
        raise ConfigError(
            f"{trace.name}: replies=true needs the replies' text (reply_text); this trace has "
            "none (conversation loaders such as sharegpt keep it)"
        )


def _encode_turns(
    trace: Trace, tok: Tokenizer, cfg: FeatureConfig
) -> tuple[list[I64], list[I64] | None]:
    """Each request's prompt tokens, and its reply tokens with ``replies`` (else None)."""
    n = len(trace)
    texts = [t or "" for t in trace.prompt_text]
    if cfg.replies:
        texts += [t or "" for t in trace.reply_text]
    flat, offs = tok.encode_batch(texts)
    per = [flat[offs[i] : offs[i + 1]] for i in range(n)]
    rep = [flat[offs[n + i] : offs[n + i + 1]] for i in range(n)] if cfg.replies else None
    return per, rep


def _window(per: list[I64], rep: list[I64] | None, turns: list[int], share: int) -> list[I64]:
    """The window's parts for ``turns`` (oldest first): each prompt cut to ``share``, or,
    with replies, each prompt and its reply sharing it."""
    window: list[I64] = []
    for q in turns:
        if rep is None:
            window.append(head_tail(per[q], share))
            continue
        keep_p, keep_r = split_share(int(per[q].shape[0]), int(rep[q].shape[0]), share)
        window += [head_tail(per[q], keep_p), head_tail(rep[q], keep_r)]
    return window


def window_texts(features: Features, tokenizer: str | Tokenizer) -> list[str]:
    """Each request's window as text for a text model: its parts decoded one by one (a cut
    that splits a character gives U+FFFD) and joined by newlines, oldest first; empty parts
    (a missing reply) are left out."""
    tok = as_tokenizer(tokenizer)
    if features.part_offsets is None or features.row_parts is None:
        return tok.decode_batch(features.ids, features.offsets)
    decoded = tok.decode_batch(features.ids, features.part_offsets)
    rp = features.row_parts.tolist()
    return ["\n".join(t for t in decoded[rp[i] : rp[i + 1]] if t) for i in range(len(features))]

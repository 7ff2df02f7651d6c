"""More checks of the seeded generators, the arrival models, the registry and the CLI.

Statistical checks recover parameters from large, fixed-seed samples; tolerances are either
the project's (5% on fitted parameters, 2 points on mix proportions) or a few standard errors
of the estimate at the sample size used.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from prefixlab.analysis import trace_stats
from prefixlab.cli import app
from prefixlab.errors import ConfigError
from prefixlab.workload import load_trace
from prefixlab.workload.arrivals import (
    GAP_PRESETS,
    LPCArrivals,
    SessionArrivals,
    make_arrivals,
    max_concurrent,
)
from prefixlab.workload.generators import (
    GENERATORS,
    generate_lpc,
    generate_mix,
    generate_random_pool,
    generate_sessions,
    generate_templated,
)
from prefixlab.workload.generators.base import zipf_weights
from prefixlab.workload.generators.lpc import (
    CLOSING_TEMPLATES,
    FILLERS,
    OPEN_TEMPLATES,
    SYSTEM_PROMPT,
    TOPICS,
)
from prefixlab.workload.generators.mix import MIX_PRESETS
from prefixlab.workload.generators.templated import TASKS
from prefixlab.workload.loaders._chat import render
from prefixlab.workload.sources import open_trace
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Request, Trace, TraceBuilder, to_hash_form

runner = CliRunner()
SIZE_PARAMS = ("num_sessions", "num_conversations", "num_requests")
MULTI_TURN_TASKS = {"chat", "agentic"}


# ----------------------------------------------------------------------------- helpers
def _assert_identical(a: Trace, b: Trace) -> None:
    """Every column equal, floats bit for bit (NaN think times included)."""
    assert len(a) == len(b)
    assert a.arrival_s.tobytes() == b.arrival_s.tobytes()
    assert a.think_s.tobytes() == b.think_s.tobytes()
    for col in ("input_length", "output_length", "turn"):
        assert np.array_equal(getattr(a, col), getattr(b, col)), col
    for col in ("session_id", "task", "prompt_text", "extra_key"):
        assert getattr(a, col) == getattr(b, col), col
    assert (a.input_tokens is None) == (b.input_tokens is None)
    if a.input_tokens is not None and b.input_tokens is not None:
        for x, y in zip(a.input_tokens, b.input_tokens, strict=True):
            assert np.array_equal(x, y)
    assert (a.output_tokens is None) == (b.output_tokens is None)
    if a.output_tokens is not None and b.output_tokens is not None:
        for x, y in zip(a.output_tokens, b.output_tokens, strict=True):
            assert np.array_equal(x, y)


def _content_equal(a: Trace, b: Trace) -> bool:
    """Same requests, same order (Request objects compared field by field)."""
    return len(a) == len(b) and list(a) == list(b)


def _by_session(tr: Trace) -> dict[str | None, list[int]]:
    """Row indices of every session, in turn order."""
    out: dict[str | None, list[int]] = {}
    for i, s in enumerate(tr.session_id):
        out.setdefault(s, []).append(i)
    for rows in out.values():
        rows.sort(key=lambda i: int(tr.turn[i]))
    return out


def _inp(tr: Trace, i: int) -> np.ndarray:
    assert tr.input_tokens is not None
    v, o = tr.input_tokens
    return v[o[i] : o[i + 1]]


def _out(tr: Trace, i: int) -> np.ndarray:
    assert tr.output_tokens is not None
    v, o, present = tr.output_tokens
    assert present[i]
    return v[o[i] : o[i + 1]]


def _half_open_peak(starts: list[float], ends: list[float]) -> int:
    """Peak of active intervals [start, end): at a tie an end is processed before a start."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    active = best = 0
    for _, delta in events:
        active += delta
        best = max(best, active)
    return best


def _schedule_many(
    model: Any, n: int, seed: int, turns: tuple[int, int] = (1, 6), decode: float = 30.0
) -> tuple[list[float], list[float], list[np.ndarray]]:
    """Starts, ends (last turn + the session's output at ``decode`` tok/s) and gaps."""
    rng = np.random.default_rng(seed)
    starts, ends, gaps = [], [], []
    for _ in range(n):
        num_turns = int(rng.integers(turns[0], turns[1] + 1))
        out_tokens = int(rng.integers(10, 400))
        times, g = model.schedule(num_turns, rng, output_tokens=out_tokens)
        assert times.shape == (num_turns,) and g[0] == 0.0
        assert np.allclose(times, times[0] + np.cumsum(g))
        starts.append(float(times[0]))
        ends.append(float(times[-1]) + out_tokens / decode)
        gaps.append(g[1:])
    return starts, ends, gaps


# ----------------------------------------------------------------------------- 1. arrivals
@pytest.mark.parametrize("preset", ["chat", "agentic"])
def test_session_arrivals_recover_rate_and_lognormal_preset(preset: str) -> None:
    rate = 0.5
    model = SessionArrivals(session_rate_per_s=rate, preset=preset)
    starts, _, gaps = _schedule_many(model, 6000, seed=11, turns=(4, 6))
    inter = np.diff(starts)
    assert np.all(inter > 0)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    assert inter.std() == pytest.approx(1 / rate, rel=0.07)  # exponential: std == mean
    logs = np.log(np.concatenate(gaps))
    assert logs.size > 15_000
    mu, sigma = GAP_PRESETS[preset]
    assert logs.mean() == pytest.approx(mu, rel=0.05)
    assert logs.std() == pytest.approx(sigma, rel=0.05)


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"gap_mu": 2.5, "gap_sigma": 0.4}, (2.5, 0.4)),
        ({"preset": "agentic", "gap_mu": 3.0, "gap_sigma": 0.7}, (3.0, 0.7)),
        ({"preset": "agentic", "gap_mu": 3.0}, (3.0, GAP_PRESETS["agentic"][1])),
        ({"gap_sigma": 0.5}, (GAP_PRESETS["chat"][0], 0.5)),
    ],
)
def test_session_arrivals_explicit_gap_parameters(
    kwargs: dict[str, Any], want: tuple[float, float]
) -> None:
    model = SessionArrivals(**kwargs)
    assert model.mu_sigma == want
    _, _, gaps = _schedule_many(model, 4000, seed=12, turns=(5, 6))
    logs = np.log(np.concatenate(gaps))
    assert logs.mean() == pytest.approx(want[0], rel=0.05)
    assert logs.std() == pytest.approx(want[1], rel=0.05)


def test_lpc_arrivals_gaps_exponential_and_start_spacing_with_large_n_conv() -> None:
    lam, rate = 40.0, 4.0
    model = LPCArrivals(lambda_chat=lam, n_conv=10**9, session_rate_per_s=rate)
    starts, ends, gaps = _schedule_many(model, 6000, seed=13)
    g = np.concatenate(gaps)
    assert g.size > 10_000
    assert g.mean() == pytest.approx(lam, rel=0.05)
    assert g.std() == pytest.approx(lam, rel=0.05)  # exponential: std == mean
    inter = np.diff(starts)
    assert np.all(inter >= 0)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    # Never held back: far more than a handful are active at once.
    assert max_concurrent(starts, ends) > 20
    assert _half_open_peak(starts, ends) > 20


@pytest.mark.parametrize("n_conv", [1, 3, 8])
def test_lpc_arrivals_small_n_conv_bounds_active_conversations(n_conv: int) -> None:
    rate = 5.0
    model = LPCArrivals(lambda_chat=10.0, n_conv=n_conv, session_rate_per_s=rate)
    starts, ends, _ = _schedule_many(model, 1500, seed=14)
    assert np.all(np.diff(starts) >= 0)
    # The bound binds (demand far exceeds n_conv) and is never exceeded.
    assert _half_open_peak(starts, ends) == n_conv
    # Held back: starts are spread out much more than 1 / rate.
    assert np.diff(starts).mean() > 3 / rate


def test_lpc_arrivals_max_concurrent_never_exceeds_n_conv() -> None:
    n_conv = 3
    model = LPCArrivals(lambda_chat=10.0, n_conv=n_conv, session_rate_per_s=5.0)
    starts, ends, _ = _schedule_many(model, 500, seed=14)
    assert max_concurrent(starts, ends) <= n_conv


def test_max_concurrent_basic_counts() -> None:
    assert max_concurrent([0, 1, 2], [10, 3, 4]) == 3
    assert max_concurrent([0, 5], [1, 6]) == 1
    assert max_concurrent([], []) == 0


def test_known_gaps_override_drawn_gaps_without_shifting_the_stream() -> None:
    model_a = SessionArrivals(session_rate_per_s=1.0)
    model_b = SessionArrivals(session_rate_per_s=1.0)
    rng_a = np.random.default_rng(3)
    t_a, g_a = model_a.schedule(5, rng_a)
    rng_b = np.random.default_rng(3)
    t_b, g_b = model_b.schedule(5, rng_b, known=[123.0, 7.5, None, 0.25])
    assert g_b[0] == 0.0  # known[0] is ignored: the first turn has no gap
    assert g_b[1] == 7.5 and g_b[3] == 0.25
    assert g_b[2] == g_a[2] and g_b[4] == g_a[4]  # drawn gaps unchanged
    assert t_b[0] == t_a[0]
    # Open loop, a known (measured) think time is a floor under the drawn arrival gap.
    assert np.allclose(t_b, t_b[0] + np.cumsum(np.maximum(g_a, g_b)))
    # Same draws consumed: the next session is identical in both.
    t_a2, g_a2 = model_a.schedule(3, rng_a)
    t_b2, g_b2 = model_b.schedule(3, rng_b)
    assert np.array_equal(t_a2, t_b2) and np.array_equal(g_a2, g_b2)
    lpc = LPCArrivals(lambda_chat=50.0)
    _, g = lpc.schedule(3, np.random.default_rng(0), known=[None, 1.0, 2.0, 3.0, 4.0])
    assert g.tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("cls", [SessionArrivals, LPCArrivals])
def test_closed_loop_think_times(cls: type) -> None:
    rng = np.random.default_rng(0)
    closed = cls(closed_loop=True)
    _, gaps = closed.schedule(4, rng)
    thinks = closed.think_times(gaps)
    assert thinks[0] is None
    assert thinks[1:] == [float(g) for g in gaps[1:]]
    assert all(t > 0 for t in thinks[1:])
    open_ = cls()
    assert open_.think_times(gaps) == [None] * 4


def test_make_arrivals_parses_specs_and_defaults() -> None:
    m = make_arrivals("sessions:session_rate_per_s=0.5,preset=agentic")
    assert isinstance(m, SessionArrivals)
    assert m.session_rate_per_s == 0.5 and m.preset == "agentic"
    m2 = make_arrivals("lpc:lambda_chat=50,n_conv=7", closed_loop=True, preset="x")
    assert isinstance(m2, LPCArrivals)
    assert (m2.lambda_chat, m2.n_conv, m2.closed_loop) == (50, 7, True)
    # The spec wins over the defaults; defaults the model lacks are ignored.
    m3 = make_arrivals("sessions:preset=chat", preset="agentic", n_conv=3)
    assert isinstance(m3, SessionArrivals) and m3.preset == "chat"
    assert make_arrivals("sessions", preset="agentic").preset == "agentic"  # type: ignore[attr-defined]
    assert make_arrivals(m2) is m2


def test_make_arrivals_rejects_unknown_model_and_parameter() -> None:
    with pytest.raises(ConfigError, match="unknown arrival model 'poisson'") as exc:
        make_arrivals("poisson:rate=1")
    assert "lpc" in str(exc.value) and "sessions" in str(exc.value)
    with pytest.raises(ConfigError, match="has no parameter 'nope'") as exc:
        make_arrivals("lpc:nope=1")
    for name in ("lambda_chat", "n_conv", "session_rate_per_s", "decode_tokens_per_s"):
        assert name in str(exc.value)


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("lpc:lambda_chat=-1", "lambda_chat"),
        ("lpc:lambda_chat=0", "lambda_chat"),
        ("lpc:n_conv=0", "n_conv"),
        ("lpc:n_conv=2.5", "n_conv"),
        ("lpc:decode_tokens_per_s=0", "decode_tokens_per_s"),
        ("lpc:session_rate_per_s=-3", "session_rate_per_s"),
        ("sessions:session_rate_per_s=0", "session_rate_per_s"),
        ("sessions:gap_sigma=0", "gap_sigma"),
        ("sessions:preset=slow", "preset"),
        ("sessions:gap_mu=abc", "gap_mu"),
    ],
)
def test_make_arrivals_rejects_bad_values(spec: str, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        make_arrivals(spec)


# ----------------------------------------------------------------------------- 2. sessions
SMALL_SESSIONS = {
    "num_sessions": 400,
    "system_tokens": 8,
    "mean_user_tokens": 6,
    "mean_output_tokens": 6,
    "seed": 4,
}


def test_sessions_closed_loop_think_times_are_the_gaps() -> None:
    closed = generate_sessions(closed_loop=True, **SMALL_SESSIONS)
    open_ = generate_sessions(closed_loop=False, **SMALL_SESSIONS)
    assert np.isnan(open_.think_s).all()
    assert np.isnan(closed.think_s[closed.turn == 0]).all()
    later = closed.turn > 0
    assert later.sum() > 500 and not np.isnan(closed.think_s[later]).any()
    checked = 0
    for rows in _by_session(closed).values():
        for prev, cur in itertools.pairwise(rows):
            gap = closed.arrival_s[cur] - closed.arrival_s[prev]
            assert closed.think_s[cur] == pytest.approx(gap, rel=1e-9, abs=1e-9)
            checked += 1
    assert checked == int(later.sum())
    # Everything but think_s is identical with and without closed loop.
    closed.think_s = open_.think_s
    _assert_identical(closed, open_)


# ----------------------------------------------------------------------------- 3. lpc
def _template_regex(templates: list[str]) -> re.Pattern[str]:
    things = "|".join(re.escape(t) for ts in TOPICS.values() for t in ts)
    topics = "|".join(re.escape(t) for t in TOPICS)
    alts = []
    for t in templates:
        parts = re.split(r"(\{thing\}|\{topic\})", t)
        alts.append(
            "".join(
                f"(?:{things})"
                if p == "{thing}"
                else f"(?:{topics})"
                if p == "{topic}"
                else re.escape(p)
                for p in parts
            )
        )
    fillers = "|".join(re.escape(f) for f in FILLERS if f)
    return re.compile(f"(?:{fillers})?(?:{'|'.join(alts)})")


OPEN_RE = _template_regex(OPEN_TEMPLATES)
CLOSING_RE = _template_regex(CLOSING_TEMPLATES)


def _is_open(text: str) -> bool:
    is_open = OPEN_RE.fullmatch(text) is not None
    is_closing = CLOSING_RE.fullmatch(text) is not None
    assert is_open != is_closing, f"prompt matches {'both' if is_open else 'no'} kind: {text!r}"
    return is_open


def _continuation_counts(tr: Trace, max_turns: int) -> dict[bool, list[int]]:
    """{open?: [continued, total]} over turns that were free to continue (not the cap)."""
    counts = {True: [0, 0], False: [0, 0]}
    for rows in _by_session(tr).values():
        for k, i in enumerate(rows):
            if k == max_turns - 1:
                continue
            text = tr.prompt_text[i]
            assert text
            c = counts[_is_open(text)]
            c[0] += k + 1 < len(rows)
            c[1] += 1
    return counts


def test_lpc_continuation_follows_prompt_kind() -> None:
    p_open, p_closed, max_turns = 0.8, 0.15, 60
    tr = generate_lpc(
        num_conversations=2000, p_continue_open=p_open, p_continue_closed=p_closed,
        max_turns=max_turns, mean_output_tokens=4, seed=31, cue="templates",
    )  # fmt: skip
    assert all(isinstance(t, str) and t for t in tr.prompt_text)
    assert set(tr.task) == {"chat"}
    assert len(set(tr.session_id)) == 2000
    counts = _continuation_counts(tr, max_turns)
    for is_open, want in ((True, p_open), (False, p_closed)):
        hits, n = counts[is_open]
        assert n > 1000
        se = math.sqrt(want * (1 - want) / n)
        assert abs(hits / n - want) < 3 * se, (is_open, hits / n, want)
    # open_share: the share of open prompts among all prompts.
    kinds = [_is_open(t) for t in tr.prompt_text if t]
    # Each prompt's kind is its own coin (Wald: the share is unbiased despite the stops).
    share = float(np.mean(kinds))
    assert abs(share - 0.5) < 3 * math.sqrt(0.25 / len(kinds))


def test_lpc_templates_label_is_sharp() -> None:
    tr = generate_lpc(seed=5, cue="templates")
    counts = _continuation_counts(tr, 12)
    p_open = counts[True][0] / counts[True][1]
    p_closed = counts[False][0] / counts[False][1]
    assert p_open - p_closed > 0.5


def test_lpc_latent_cues_are_informative_but_noisy() -> None:
    """The default model: the clause a prompt carries leans the right way, not reliably;
    most conversations are short, as in the paper's datasets (94-99% have five turns or
    fewer, A.2 of the summary)."""
    from prefixlab.workload.generators.lpc import CLOSE_CUES, OPEN_CUES

    tr = generate_lpc(num_conversations=3000, mean_output_tokens=4, seed=8)
    by = _by_session(tr)
    stats = {"open": [0, 0], "close": [0, 0], "none": [0, 0]}
    for rows in by.values():
        for k, i in enumerate(rows):
            text = tr.prompt_text[i] or ""
            kind = ("open" if any(text.endswith(c) for c in OPEN_CUES) else
                    "close" if any(text.endswith(c) for c in CLOSE_CUES) else "none")  # fmt: skip
            stats[kind][0] += k + 1 < len(rows)
            stats[kind][1] += 1
    rate = {k: a / b for k, (a, b) in stats.items()}
    assert stats["none"][1] < 0.3 * len(tr)  # cue_rate 0.8
    assert rate["open"] > rate["none"] > rate["close"]
    assert 0.2 < rate["open"] - rate["close"] < 0.6, rate  # informative, far from certain
    short = np.mean([len(r) <= 5 for r in by.values()])
    assert short > 0.9, short


def test_lpc_max_turns_respected() -> None:
    tr = generate_lpc(
        num_conversations=200, open_share=1.0, p_continue_open=1.0, max_turns=3,
        mean_output_tokens=3, seed=2, cue="templates",
    )  # fmt: skip
    assert len(tr) == 600
    for rows in _by_session(tr).values():
        assert [int(tr.turn[i]) for i in rows] == [0, 1, 2]
    tr2 = generate_lpc(num_conversations=300, max_turns=4, mean_output_tokens=3, seed=3)
    assert int(tr2.turn.max()) == 3
    assert all(len(r) <= 4 for r in _by_session(tr2).values())


def test_lpc_gaps_exponential_and_closed_loop() -> None:
    lam = 25.0
    tr = generate_lpc(
        num_conversations=1500, open_share=1.0, p_continue_open=0.9, max_turns=50,
        mean_output_tokens=3, lambda_chat=lam, closed_loop=True, seed=9, cue="templates",
    )  # fmt: skip
    gaps = []
    for rows in _by_session(tr).values():
        assert np.isnan(tr.think_s[rows[0]])
        t = tr.arrival_s[rows]
        d = np.diff(t)
        assert np.allclose(tr.think_s[rows[1:]], d, rtol=1e-9, atol=1e-9)
        gaps.append(d)
    g = np.concatenate(gaps)
    assert g.size > 10_000
    assert g.mean() == pytest.approx(lam, rel=0.05)
    assert g.std() == pytest.approx(lam, rel=0.05)
    assert np.all(np.diff(tr.arrival_s) >= 0)


def _lpc_intervals(tr: Trace, decode: float) -> tuple[list[float], list[float]]:
    starts, ends = [], []
    for rows in _by_session(tr).values():
        starts.append(float(tr.arrival_s[rows[0]]))
        out = int(tr.output_length[rows].sum())
        ends.append(float(tr.arrival_s[rows[-1]]) + out / decode)
    return starts, ends


def test_lpc_generator_bounds_active_conversations() -> None:
    decode = 30.0
    small = generate_lpc(
        num_conversations=400, n_conv=4, lambda_chat=5.0, session_rate_per_s=20.0,
        decode_tokens_per_s=decode, mean_output_tokens=20, seed=6,
    )  # fmt: skip
    starts, ends = _lpc_intervals(small, decode)
    assert _half_open_peak(starts, ends) == 4
    large = generate_lpc(
        num_conversations=400, n_conv=10_000, lambda_chat=5.0, session_rate_per_s=20.0,
        decode_tokens_per_s=decode, mean_output_tokens=20, seed=6,
    )  # fmt: skip
    starts_l, ends_l = _lpc_intervals(large, decode)
    assert max_concurrent(starts_l, ends_l) > 4
    assert _half_open_peak(starts_l, ends_l) > 4
    # Held back: the small pool stretches the same conversations over more time.
    assert max(starts) > 2 * max(starts_l)


def test_lpc_prefix_property_and_prompt_tokens() -> None:
    tr = generate_lpc(num_conversations=150, mean_output_tokens=12, seed=12)
    tok = get_tokenizer("llama3")
    system = tok.encode(render("system", SYSTEM_PROMPT))
    texts = [t or "" for t in tr.prompt_text]
    ids, offs = tok.encode_batch([render("user", t) for t in texts])
    assert ids.size and np.array_equal(tok.encode(render("user", texts[0])), ids[offs[0] : offs[1]])
    multi = 0
    for rows in _by_session(tr).values():
        history = system
        for i in rows:
            user = ids[offs[i] : offs[i + 1]]
            assert np.array_equal(_inp(tr, i), np.concatenate([history, user]))
            assert tr.input_length[i] == history.size + user.size
            history = np.concatenate([_inp(tr, i), _out(tr, i)])
        multi += len(rows) > 1
    assert multi > 20


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"open_share": 1.2}, "open_share"),
        ({"p_continue_open": -0.1}, "p_continue_open"),
        ({"p_continue_closed": 2.0}, "p_continue_closed"),
        ({"n_conv": 0}, "n_conv"),
        ({"lambda_chat": 0.0}, "lambda_chat"),
        ({"max_turns": 0}, "max_turns"),
        ({"num_conversations": 2.5}, "num_conversations"),
        ({"closed_loop": 1}, "closed_loop"),
        ({"tokenizer": "nope"}, "tokenizer"),
        ({"cue": "words"}, "cue"),
        ({"cue_rate": 1.5}, "cue_rate"),
    ],
)
def test_lpc_bad_parameters(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        generate_lpc(**{"num_conversations": 3, **kwargs})


# ----------------------------------------------------------------------------- 4. templated
TEMPLATED_SMALL = {
    "system_tokens": 32,
    "templates_per_task": 5,
    "program_tokens": 256,
    "tool_tokens": 256,
    "document_tokens": 256,
}


@pytest.mark.parametrize(
    ("weights", "want"),
    [("", [0.25] * 4), ("1,2,3,4", [0.1, 0.2, 0.3, 0.4]), ("0, 1, 1, 2", [0, 0.25, 0.25, 0.5])],
)
def test_templated_task_proportions(weights: str, want: list[float]) -> None:
    tr = generate_templated(num_requests=8000, task_weights=weights, seed=17, **TEMPLATED_SMALL)
    assert len(tr) == 8000
    counts = Counter(tr.task)
    assert set(counts) <= set(TASKS)
    for task, w in zip(TASKS, want, strict=True):
        assert abs(counts[task] / 8000 - w) < 0.02, task
        if w == 0:
            assert counts[task] == 0
    assert np.all(np.diff(tr.arrival_s) > 0)
    assert set(tr.session_id) == {None} and set(tr.turn.tolist()) == {0}


def test_templated_structure_zipf_and_lengths() -> None:
    p = dict(TEMPLATED_SMALL, template_zipf=1.0, query_tokens=64, output_tokens=200)
    tr = generate_templated(num_requests=8000, seed=23, **p)
    st = p["system_tokens"]
    heads: dict[str, set[tuple[int, ...]]] = {t: set() for t in TASKS}
    template_keys: dict[str, Counter[tuple[int, ...]]] = {t: Counter() for t in TASKS}
    query_lens = []
    tails = set()
    for i, task in enumerate(tr.task):
        assert task is not None
        x = _inp(tr, i)
        heads[task].add(tuple(x[:st].tolist()))
        if task == "untemplated":
            query_lens.append(x.size - st)
            tails.add(tuple(x[st:].tolist()))
        else:
            template_keys[task][tuple(x[st : st + 16].tolist())] += 1
    # One system prompt per task, distinct across tasks.
    assert all(len(h) == 1 for h in heads.values())
    assert len(set().union(*heads.values())) == 4
    # Untemplated: system + a unique query of the configured mean length.
    assert len(tails) == len(query_lens) > 1500
    assert np.mean(query_lens) == pytest.approx(64, rel=0.05)
    # Templated tasks: 5 templates with Zipf popularity.
    want = zipf_weights(5, 1.0)
    pooled = np.zeros(5)
    for task in TASKS[1:]:
        counts = np.sort(np.array(list(template_keys[task].values())))[::-1]
        assert counts.size == 5
        n = counts.sum()
        se = math.sqrt(want[0] * (1 - want[0]) / n)
        assert abs(counts[0] / n - want[0]) < 3 * se, task
        pooled += counts
    assert np.abs(pooled / pooled.sum() - want).max() < 0.02
    # Templated prompts hold a template between the system prompt and the query.
    templ = tr.input_length[np.array([t != "untemplated" for t in tr.task])]
    assert templ.min() > st + 16
    assert tr.output_length.mean() == pytest.approx(200, rel=0.05)
    assert tr.output_length.min() >= 1


@pytest.mark.parametrize("weights", ["a,b,c,d", "1,2,3", "1,2,3,4,5", "-1,1,1,1", "0,0,0,0", "1;2;3;4", "1,2,3,nan"])  # fmt: skip
def test_templated_bad_task_weights(weights: str) -> None:
    with pytest.raises(ConfigError, match="task_weights"):
        generate_templated(num_requests=5, task_weights=weights)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_templated_infinite_task_weight_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="task_weights"):
        generate_templated(num_requests=5, task_weights="1,1,1,inf")


# ----------------------------------------------------------------------------- 5. mix
MIX_SMALL = {"system_tokens": 16, "mean_user_tokens": 8, "mean_output_tokens": 8}


@pytest.mark.parametrize("trace", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mix_multi_turn_share_exact(trace: int, seed: int) -> None:
    n = 1001
    tr = generate_mix(trace=trace, num_requests=n, seed=seed, **MIX_SMALL)
    assert len(tr) == n
    multi = np.array([t in MULTI_TURN_TASKS for t in tr.task])
    f = MIX_PRESETS[trace]
    assert multi.sum() == round(f * n)
    assert abs(multi.mean() - f) < 0.02
    assert {t for t in tr.task if t not in MULTI_TURN_TASKS} <= set(TASKS)
    # Sorted by arrival; single-turn arrivals inside the multi-turn span.
    assert np.all(np.diff(tr.arrival_s) >= 0)
    single_t = tr.arrival_s[~multi]
    assert single_t.min() >= 0.0
    assert single_t.max() <= tr.arrival_s[multi].max()
    # Single-turn requests carry no session; multi-turn ones do.
    assert all(tr.session_id[i] is None for i in np.flatnonzero(~multi))
    assert all(tr.session_id[i] is not None for i in np.flatnonzero(multi))


def test_mix_agentic_share_of_sessions_and_gaps() -> None:
    frac = 0.3
    tr = generate_mix(num_requests=6000, mean_turns=2, agentic_fraction=frac, seed=3, **MIX_SMALL)
    sessions: dict[str, str] = {}
    for s, t in zip(tr.session_id, tr.task, strict=True):
        if s is not None:
            assert t in MULTI_TURN_TASKS
            assert sessions.setdefault(s, t) == t  # one preset per session
    n = len(sessions)
    assert n > 1500
    share = sum(t == "agentic" for t in sessions.values()) / n
    assert abs(share - frac) < 3 * math.sqrt(frac * (1 - frac) / n)
    # Each session's gaps follow its preset: agentic gaps are far shorter.
    logs: dict[str, list[float]] = {"chat": [], "agentic": []}
    for s, rows in _by_session(tr).items():
        if s is not None and len(rows) > 1:
            logs[sessions[s]].extend(np.log(np.diff(tr.arrival_s[rows])).tolist())
    for preset, (mu, _) in GAP_PRESETS.items():
        assert np.mean(logs[preset]) == pytest.approx(mu, rel=0.1)


@pytest.mark.parametrize("fraction", [0.0, 0.35, 1.0])
def test_mix_multi_turn_fraction_override(fraction: float) -> None:
    n = 500
    tr = generate_mix(trace=3, multi_turn_fraction=fraction, num_requests=n, seed=5, **MIX_SMALL)
    assert len(tr) == n
    multi = sum(t in MULTI_TURN_TASKS for t in tr.task)
    assert multi == round(fraction * n)
    assert np.all(np.diff(tr.arrival_s) >= 0)
    if fraction == 0.0:
        assert set(tr.session_id) == {None}
        assert tr.arrival_s.max() > 0
    if fraction == 1.0:
        assert None not in set(tr.session_id)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"trace": 4}, "trace"),
        ({"trace": 0}, "trace"),
        ({"multi_turn_fraction": 1.5}, "multi_turn_fraction"),
        ({"multi_turn_fraction": -0.5}, "multi_turn_fraction"),
        ({"agentic_fraction": 1.01}, "agentic_fraction"),
        ({"num_requests": 0}, "num_requests"),
        ({"task_weights": "1,2"}, "task_weights"),
    ],
)
def test_mix_bad_parameters(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        generate_mix(**{"num_requests": 20, **kwargs})


# ----------------------------------------------------------------------------- 6. random-pool
def _prompts(tr: Trace) -> list[tuple[int, ...]]:
    return [tuple(_inp(tr, i).tolist()) for i in range(len(tr))]


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9])
def test_random_pool_shares_and_content(p: float) -> None:
    n, pool_size = 4000, 10
    tr = generate_random_pool(num_requests=n, p=p, pool_size=pool_size, prompt_tokens=15, seed=7)
    assert len(tr) == n
    assert np.all(tr.input_length == 15)
    prompts = _prompts(tr)
    assert all(len(x) == 15 for x in prompts)
    pooled = [x for x, t in zip(prompts, tr.task, strict=True) if t == "pool"]
    random_ = [x for x, t in zip(prompts, tr.task, strict=True) if t == "random"]
    assert len(pooled) + len(random_) == n
    assert abs(len(pooled) / n - p) < 3 * math.sqrt(p * (1 - p) / n)
    assert len(set(pooled)) == pool_size  # every pooled prompt drawn at this sample size
    assert len(set(random_)) == len(random_)
    assert not set(random_) & set(pooled)
    assert np.all(tr.output_length == 16)


def test_random_pool_edges_and_zipf() -> None:
    none = generate_random_pool(num_requests=1500, p=0.0, seed=1)
    assert set(none.task) == {"random"}
    assert len(set(_prompts(none))) == 1500
    only = generate_random_pool(num_requests=1500, p=1.0, pool_size=6, seed=1)
    assert set(only.task) == {"pool"}
    assert len(set(_prompts(only))) == 6
    zipf = generate_random_pool(num_requests=4000, p=1.0, pool_size=4, pool_zipf=1.0, seed=2)
    counts = np.sort(np.array(list(Counter(_prompts(zipf)).values())))[::-1]
    want = zipf_weights(4, 1.0)
    se = np.sqrt(want * (1 - want) / 4000)
    assert np.all(np.abs(counts / 4000 - want) < 3 * se)


def test_random_pool_hit_ratio_increases_with_p() -> None:
    ratios = [
        trace_stats(generate_random_pool(num_requests=1000, p=p, seed=3), block_tokens=1)[
            "infinite_cache_token_hit_ratio"
        ]
        for p in (0.0, 0.2, 0.5, 0.9, 1.0)
    ]
    assert all(a < b for a, b in itertools.pairwise(ratios))
    assert ratios[0] < 0.01 and ratios[-1] > 0.85


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"p": 1.5}, "p"), ({"p": -0.1}, "p"), ({"pool_size": 0}, "pool_size"),
     ({"prompt_tokens": 0}, "prompt_tokens"), ({"request_rate_per_s": 0.0}, "request_rate_per_s")],
)  # fmt: skip
def test_random_pool_bad_parameters(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=rf"\b{name} must"):
        generate_random_pool(num_requests=5, **kwargs)


# ----------------------------------------------------------------------------- 7. registry
def _small(name: str, **kw: Any) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(GENERATORS[name].params)}
    out = {k: 25 for k in SIZE_PARAMS if k in fields}
    for k, v in {"system_tokens": 8, "mean_user_tokens": 5, "mean_output_tokens": 5}.items():
        if k in fields:
            out[k] = v
    return out | kw


def test_registry_has_every_generator() -> None:
    assert set(GENERATORS) == {"sessions", "lpc", "templated", "mix", "random-pool"}
    for name, info in GENERATORS.items():
        assert info.name == name and info.summary
        fields = dataclasses.fields(info.params)
        assert sum(f.name in SIZE_PARAMS for f in fields) == 1
        assert "seed" in {f.name for f in fields}
        assert all(f.metadata.get("help") for f in fields)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_is_deterministic(name: str) -> None:
    fn = GENERATORS[name].fn
    a = fn(**_small(name, seed=11))
    b = fn(**_small(name, seed=11))
    c = fn(**_small(name, seed=12))
    assert len(a) >= 25
    _assert_identical(a, b)
    assert not _content_equal(a, c)
    assert np.all(np.diff(a.arrival_s) >= 0)
    # A params object and overrides give the same trace.
    params = GENERATORS[name].params(**_small(name, seed=11))
    _assert_identical(fn(params), a)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_rejects_bad_generic_parameters(name: str) -> None:
    fn = GENERATORS[name].fn
    with pytest.raises(ConfigError, match="no parameter 'bogus'") as exc:
        fn(bogus=1)
    assert "seed" in str(exc.value)
    with pytest.raises(ConfigError, match="seed must be"):
        fn(**_small(name, seed=-1))
    with pytest.raises(ConfigError, match="seed must be an integer"):
        fn(**_small(name, seed="x"))
    size = next(
        f.name for f in dataclasses.fields(GENERATORS[name].params) if f.name in SIZE_PARAMS
    )
    with pytest.raises(ConfigError, match=size):
        fn(**_small(name, **{size: 0}))


@pytest.mark.parametrize("fn", [generate_sessions, generate_mix])
def test_infinite_mean_turns_is_a_config_error(fn: Any) -> None:
    with pytest.raises(ConfigError, match="mean_turns"):
        fn(mean_turns=float("inf"))


def test_gen_source_rejects_unknown_parameter_listing_parameters() -> None:
    with pytest.raises(ConfigError, match="no parameter 'nope'") as exc:
        open_trace("gen:lpc:nope=1")
    for name in ("lambda_chat", "n_conv", "p_continue_open", "tokenizer", "seed"):
        assert name in str(exc.value)
    with pytest.raises(ConfigError, match="unknown generator 'nosuch'"):
        open_trace("gen:nosuch")
    tr = open_trace("gen:random-pool:num_requests=30,p=0.5,seed=4")
    _assert_identical(tr, generate_random_pool(num_requests=30, p=0.5, seed=4))


CLI_CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    (
        "sessions",
        ["--num-sessions", "20", "--system-tokens", "8", "--preset", "agentic", "--closed-loop",
         "--gap-mu", "-0.5", "--seed", "3"],
        {"num_sessions": 20, "system_tokens": 8, "preset": "agentic", "closed_loop": True,
         "gap_mu": -0.5, "seed": 3},
    ),
    (
        "lpc",
        ["--num-conversations", "15", "--n-conv", "3", "--lambda-chat", "7.5", "--closed-loop",
         "--mean-output-tokens", "9", "--seed", "2"],
        {"num_conversations": 15, "n_conv": 3, "lambda_chat": 7.5, "closed_loop": True,
         "mean_output_tokens": 9, "seed": 2},
    ),
    (
        "templated",
        ["--num-requests", "30", "--task-weights", "1,0,2,1", "--templates-per-task", "3",
         "--document-tokens", "40", "--seed", "8"],
        {"num_requests": 30, "task_weights": "1,0,2,1", "templates_per_task": 3,
         "document_tokens": 40, "seed": 8},
    ),
    (
        "mix",
        ["--trace", "2", "--num-requests", "40", "--agentic-fraction", "0.7",
         "--multi-turn-fraction", "0.6", "--system-tokens", "8", "--seed", "5"],
        {"trace": 2, "num_requests": 40, "agentic_fraction": 0.7, "multi_turn_fraction": 0.6,
         "system_tokens": 8, "seed": 5},
    ),
    (
        "random-pool",
        ["--num-requests", "50", "--p", "0.3", "--pool-size", "4", "--prompt-tokens", "7",
         "--seed", "6"],
        {"num_requests": 50, "p": 0.3, "pool_size": 4, "prompt_tokens": 7, "seed": 6},
    ),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "args", "kwargs"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_generate_writes_the_generated_trace(
    tmp_path: Path, kind: str, args: list[str], kwargs: dict[str, Any]
) -> None:
    out = tmp_path / f"{kind}.jsonl"
    res = runner.invoke(app, ["trace", "generate", kind, "-o", str(out), *args])
    assert res.exit_code == 0, res.stderr
    want = GENERATORS[kind].fn(**kwargs)
    assert f"wrote {len(want):,} requests" in res.stdout
    got = load_trace(out)
    assert _content_equal(got, want)
    if kwargs.get("closed_loop"):
        assert (~np.isnan(got.think_s)).sum() > 0


def test_cli_generate_parquet_and_no_closed_loop(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    out = tmp_path / "x.parquet"
    args = ["--num-conversations", "12", "--closed-loop", "--seed", "4"]
    res = runner.invoke(app, ["trace", "generate", "lpc", "-o", str(out), *args])
    assert res.exit_code == 0, res.stderr
    assert out.read_bytes()[:4] == b"PAR1"
    want = generate_lpc(num_conversations=12, closed_loop=True, seed=4)
    got = load_trace(out, "parquet")
    assert _content_equal(got, want)
    assert not np.isnan(got.think_s).all()
    # --no-closed-loop: no think times at all.
    out2 = tmp_path / "y.jsonl"
    res = runner.invoke(
        app, ["trace", "generate", "sessions", "-o", str(out2), "--num-sessions", "10",
              "--no-closed-loop"],
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    got2 = load_trace(out2)
    assert np.isnan(got2.think_s).all()
    assert _content_equal(got2, generate_sessions(num_sessions=10))


@pytest.mark.parametrize(
    ("kind", "args", "name"),
    [
        ("random-pool", ["--p", "1.5"], "p must be"),
        ("mix", ["--trace", "9"], "trace must be"),
        ("lpc", ["--n-conv", "0"], "n_conv must be"),
        ("sessions", ["--preset", "slow"], "preset 'slow'"),
        ("templated", ["--task-weights", "1,2"], "task_weights"),
    ],
)
def test_cli_generate_bad_value_exits_2_without_file(
    tmp_path: Path, kind: str, args: list[str], name: str
) -> None:
    out = tmp_path / "bad.jsonl"
    res = runner.invoke(app, ["trace", "generate", kind, "-o", str(out), *args])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert name in lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert list(tmp_path.iterdir()) == []


def test_cli_error_echoes_the_value_verbatim(tmp_path: Path) -> None:
    out = tmp_path / "bad.jsonl"
    args = ["trace", "generate", "templated", "-o", str(out), "--task-weights", "[x]1"]
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert "'[x]1'" in res.stderr


# ----------------------------------------------------------------------------- 8. Trace tools
def _mixed_output_trace() -> Trace:
    """Token form, some requests without output tokens, ties in arrival time."""
    reqs = []
    for i in range(12):
        has_out = i % 3 != 0
        reqs.append(
            Request(
                arrival_s=float(i // 3),
                input_length=i + 1,
                output_length=2,
                session_id=f"s{i % 4}",
                turn=i // 4,
                task="t" if i % 2 else None,
                input_tokens=list(range(i, 2 * i + 1)),
                output_tokens=[100 + i, 200 + i] if has_out else None,
                prompt_text=f"p{i}" if i % 2 else None,
                extra_key="k" if i == 5 else None,
                think_s=0.5 * i if i % 4 else None,
            )
        )
    return Trace.from_requests(reqs, name="mixed")


def _permutation_traces() -> list[Trace]:
    gen = generate_sessions(num_sessions=30, **{k: 6 for k in ("system_tokens", "mean_user_tokens", "mean_output_tokens")}, closed_loop=True, seed=2)  # fmt: skip
    return [gen, _mixed_output_trace(), to_hash_form(gen, 4)]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["sessions", "mixed-outputs", "hash-form"])
def test_take_permutation_preserves_each_request(which: int) -> None:
    tr = _permutation_traces()[which]
    perm = np.random.default_rng(which).permutation(len(tr))
    taken = tr.take(perm)
    assert len(taken) == len(tr)
    assert [taken[j] for j in range(len(tr))] == [tr[int(i)] for i in perm]
    assert taken.is_hash_form == tr.is_hash_form and taken.block_tokens == tr.block_tokens
    # Taking the inverse permutation restores the original exactly.
    _assert_identical(taken.take(np.argsort(perm)), tr)
    # Negative rows and repeats work; out-of-range rows do not.
    sub = tr.take([-1, 0, 0])
    assert list(sub) == [tr[len(tr) - 1], tr[0], tr[0]]
    with pytest.raises(IndexError):
        tr.take([len(tr)])
    if tr.is_hash_form:
        assert tr.hashed_tokens is not None and taken.hashed_tokens is not None
        assert np.array_equal(taken.hashed_tokens, tr.hashed_tokens[perm])


def test_sorted_by_arrival_and_builder_sort_are_stable() -> None:
    base = _mixed_output_trace()
    order = np.random.default_rng(5).permutation(len(base))
    shuffled = base.take(order)
    srt = shuffled.sorted_by_arrival()
    want = np.argsort(shuffled.arrival_s, kind="stable")
    assert list(srt) == [shuffled[int(i)] for i in want]
    assert np.all(np.diff(srt.arrival_s) >= 0)
    # Ties keep their order in the shuffled trace.
    for t in np.unique(srt.arrival_s):
        got = [r.input_length for r in srt if r.arrival_s == t]
        assert got == [r.input_length for r in shuffled if r.arrival_s == t]
    assert srt.sorted_by_arrival() is srt
    builder = TraceBuilder(sort_by_arrival=True, name="b")
    for r in shuffled:
        builder.append(r)
    built = builder.build()
    assert list(built) == list(srt)
    assert built.name == "b"
    unsorted = TraceBuilder()
    for r in shuffled:
        unsorted.append(r)
    assert list(unsorted.build()) == list(shuffled)

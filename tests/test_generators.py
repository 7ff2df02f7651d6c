"""The seeded generators (sessions, LPC, templated, mix, random-pool) and their registry:
parameters recovered from large samples, each generator's structure and errors, determinism.

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
from typing import Any

import numpy as np
import pytest

from prefixlab.analysis import trace_stats
from prefixlab.errors import ConfigError
from prefixlab.workload.arrivals import max_concurrent
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
from prefixlab.workload.generators.sessions import GAP_PRESETS
from prefixlab.workload.generators.templated import TASKS
from prefixlab.workload.loaders._chat import render
from prefixlab.workload.sources import open_trace
from prefixlab.workload.tokenizers import get_tokenizer
from prefixlab.workload.trace import Trace
from tests.helpers import assert_identical, content_equal, half_open_peak


def _gaps(trace_session: list[str | None], arrival: np.ndarray) -> np.ndarray:
    by_session: dict[str | None, list[float]] = {}
    for s, t in zip(trace_session, arrival.tolist(), strict=True):
        by_session.setdefault(s, []).append(t)
    return np.concatenate([np.diff(np.sort(ts)) for ts in by_session.values() if len(ts) > 1])


SIZE_PARAMS = ("num_sessions", "num_conversations", "num_requests")
MULTI_TURN_TASKS = {"chat", "agentic"}


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


@pytest.mark.parametrize("preset", ["chat", "agentic"])
def test_inter_turn_gaps_are_lognormal_with_the_preset(preset: str) -> None:
    tr = generate_sessions(
        num_sessions=3000,
        preset=preset,
        mean_turns=6,
        system_tokens=8,
        mean_user_tokens=4,
        mean_output_tokens=4,
        seed=21,
    )
    logs = np.log(_gaps(tr.session_id, tr.arrival_s))
    mu, sigma = GAP_PRESETS[preset]
    assert logs.size > 10_000
    assert logs.mean() == pytest.approx(mu, rel=0.05)
    assert logs.std() == pytest.approx(sigma, rel=0.05)


def test_session_starts_are_poisson_and_turns_geometric() -> None:
    rate, mean_turns = 2.0, 5.0
    tr = generate_sessions(
        num_sessions=4000,
        session_rate_per_s=rate,
        mean_turns=mean_turns,
        max_turns=1000,
        system_tokens=8,
        mean_user_tokens=4,
        mean_output_tokens=4,
        seed=5,
    )
    first = np.sort(tr.arrival_s[tr.turn == 0])
    inter = np.diff(first)
    assert inter.mean() == pytest.approx(1 / rate, rel=0.05)
    assert inter.std() == pytest.approx(1 / rate, rel=0.07)  # exponential: std == mean
    turns = np.bincount(np.unique(tr.session_id, return_counts=True)[1])
    num_turns = np.repeat(np.arange(turns.size), turns)
    assert num_turns.mean() == pytest.approx(mean_turns, rel=0.05)


def test_system_prompt_popularity_is_zipf() -> None:
    tr = generate_sessions(
        num_sessions=6000,
        num_system_prompts=4,
        system_zipf=1.0,
        system_tokens=16,
        mean_user_tokens=4,
        mean_output_tokens=4,
        mean_turns=1,
        max_turns=1,
        seed=8,
    )
    assert tr.input_tokens is not None
    vals, offs = tr.input_tokens
    heads = [tuple(vals[offs[i] : offs[i] + 16].tolist()) for i in range(len(tr))]
    _, counts = np.unique(np.array(heads), axis=0, return_counts=True)
    shares = np.sort(counts)[::-1] / counts.sum()
    want = np.array([1, 1 / 2, 1 / 3, 1 / 4]) / sum([1, 1 / 2, 1 / 3, 1 / 4])
    assert np.abs(shares - want).max() < 0.02


# ----------------------------------------------------------------------------- sessions
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
    assert_identical(closed, open_)


# ----------------------------------------------------------------------------- lpc
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
        num_conversations=2000,
        p_continue_open=p_open,
        p_continue_closed=p_closed,
        max_turns=max_turns,
        mean_output_tokens=4,
        seed=31,
        cue="templates",
    )
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
            kind = (
                "open"
                if any(text.endswith(c) for c in OPEN_CUES)
                else "close"
                if any(text.endswith(c) for c in CLOSE_CUES)
                else "none"
            )
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
        num_conversations=200,
        open_share=1.0,
        p_continue_open=1.0,
        max_turns=3,
        mean_output_tokens=3,
        seed=2,
        cue="templates",
    )
    assert len(tr) == 600
    for rows in _by_session(tr).values():
        assert [int(tr.turn[i]) for i in rows] == [0, 1, 2]
    tr2 = generate_lpc(num_conversations=300, max_turns=4, mean_output_tokens=3, seed=3)
    assert int(tr2.turn.max()) == 3
    assert all(len(r) <= 4 for r in _by_session(tr2).values())


def test_lpc_gaps_exponential_and_closed_loop() -> None:
    lam = 25.0
    tr = generate_lpc(
        num_conversations=1500,
        open_share=1.0,
        p_continue_open=0.9,
        max_turns=50,
        mean_output_tokens=3,
        lambda_chat=lam,
        closed_loop=True,
        seed=9,
        cue="templates",
    )
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
        num_conversations=400,
        n_conv=4,
        lambda_chat=5.0,
        session_rate_per_s=20.0,
        decode_tokens_per_s=decode,
        mean_output_tokens=20,
        seed=6,
    )
    starts, ends = _lpc_intervals(small, decode)
    assert half_open_peak(starts, ends) == 4
    large = generate_lpc(
        num_conversations=400,
        n_conv=10_000,
        lambda_chat=5.0,
        session_rate_per_s=20.0,
        decode_tokens_per_s=decode,
        mean_output_tokens=20,
        seed=6,
    )
    starts_l, ends_l = _lpc_intervals(large, decode)
    assert max_concurrent(starts_l, ends_l) > 4
    assert half_open_peak(starts_l, ends_l) > 4
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


# ----------------------------------------------------------------------------- templated
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


@pytest.mark.parametrize(
    "weights", ["a,b,c,d", "1,2,3", "1,2,3,4,5", "-1,1,1,1", "0,0,0,0", "1;2;3;4", "1,2,3,nan"]
)
def test_templated_bad_task_weights(weights: str) -> None:
    with pytest.raises(ConfigError, match="task_weights"):
        generate_templated(num_requests=5, task_weights=weights)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_templated_infinite_task_weight_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="task_weights"):
        generate_templated(num_requests=5, task_weights="1,1,1,inf")


# ----------------------------------------------------------------------------- mix
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


# ----------------------------------------------------------------------------- random-pool
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
    [
        ({"p": 1.5}, "p"),
        ({"p": -0.1}, "p"),
        ({"pool_size": 0}, "pool_size"),
        ({"prompt_tokens": 0}, "prompt_tokens"),
        ({"request_rate_per_s": 0.0}, "request_rate_per_s"),
    ],
)
def test_random_pool_bad_parameters(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=rf"\b{name} must"):
        generate_random_pool(num_requests=5, **kwargs)


# ----------------------------------------------------------------------------- registry
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
    assert_identical(a, b)
    assert not content_equal(a, c)
    assert np.all(np.diff(a.arrival_s) >= 0)
    # A params object and overrides give the same trace.
    params = GENERATORS[name].params(**_small(name, seed=11))
    assert_identical(fn(params), a)


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
    assert_identical(tr, generate_random_pool(num_requests=30, p=0.5, seed=4))

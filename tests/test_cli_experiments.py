"""The experiment commands: ``compare``, ``sweep``, ``demo`` and ``results list|show|query``.

Every workload is tiny (6 sessions, 15 requests; or 200 one-block random-pool prompts), so
each command runs in well under a second; the numbers checked are those of the library
(a direct replay, the stored parquet tables), never wall-clock times.
"""

from __future__ import annotations

import csv
import io
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

from prefixlab.cli.common import secs
from prefixlab.cli.main import app
from tests.tables import table

runner = CliRunner()

GEN = "gen:sessions:num_sessions=6"
#: 2 policies x 2 capacities: the 4 cells every compare test below reads
COMPARE = [GEN, "-p", "lru", "-p", "fifo", "-c", "0.5ws", "-c", "3000", "--block-tokens", "16"]
ENGINE = [
    "--runner",
    "engine",
    "--model",
    "llama-3.1-8b",
    "--gpu",
    "h100",
    "--timing",
    "power:preset=llama-3.1-8b-h100",
    "--timing",
    "tpot:s=0.02",
]
CELLS = {("0.5ws", "lru"), ("0.5ws", "fifo"), ("3000", "lru"), ("3000", "fifo")}

#: random-pool: each request reuses one of 10 pooled prompts with probability p, else a fresh
#: one; a 15-token prompt is one partial block, cached whole (cache_partial, no recompute)
VARY_TOML = """\
name = "vary"
policies = ["lru"]

[workload]
source = "gen:random-pool"
params = { output_ids = false, num_requests = 200 }
vary = { p = [0.2, 0.8] }

[cache]
capacities = [64]
block_tokens = 16
cache_partial = true
min_recompute_tokens = 0
"""

VARY_YAML = """\
name: vary
policies: [lru]
workload:
  source: gen:random-pool
  params: {output_ids: false, num_requests: 200}
  vary: {p: [0.2, 0.8]}
cache:
  capacities: [64]
  block_tokens: 16
  cache_partial: true
  min_recompute_tokens: 0
"""


def _invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def _rows(folder: Path, table: str = "results") -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(folder / f"{table}.parquet").to_pylist()
    return rows


def _same(a: Any, b: Any) -> bool:
    """Bit-for-bit equal rows: JSON keeps each float's repr, and NaN equals NaN."""
    return json.dumps(a) == json.dumps(b)


def _csv_rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def _assert_one_line_error(result: Result, *fragments: str) -> str:
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1, out
    assert out.startswith("error:"), out
    assert "Traceback" not in out
    for fragment in fragments:
        assert fragment in out, out
    return out


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the two compare runs below (for `results list`)."""
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="module")
def replay_run(parent: Path) -> tuple[Path, str]:
    folder = parent / "replay"
    result = _invoke("compare", *COMPARE, "--out", str(folder))
    assert result.exit_code == 0, result.output
    return folder, result.output


@pytest.fixture(scope="module")
def engine_run(parent: Path) -> tuple[Path, str]:
    folder = parent / "engine"
    result = _invoke("compare", *COMPARE, *ENGINE, "--detail", "--out", str(folder))
    assert result.exit_code == 0, result.output
    return folder, result.output


# ------------------------------------------------------------------ compare (replay)
def test_compare_table_has_every_policy_and_capacity(replay_run: tuple[Path, str]) -> None:
    folder, output = replay_run
    body = table(output)
    assert {(r["capacity"], r["policy"]) for r in body} == CELLS
    # no model, no engine: no FLOPs or latency columns
    assert list(body[0]) == ["capacity", "blocks", "policy", "token hit", "req hit"]
    assert "4 cells: 4 run, 0 already done" in output
    assert f"results: {folder}/results.parquet" in output
    # the printed ratios are the stored ones, rounded
    stored = {(r["capacity"], r["policy"]): r for r in _rows(folder)}
    for shown in body:
        row = stored[(shown["capacity"], shown["policy"])]
        assert shown["blocks"] == f"{row['capacity_blocks']:,}"
        assert shown["token hit"] == f"{row['token_hit_ratio']:.4f}"
        assert shown["req hit"] == f"{row['request_hit_ratio']:.4f}"


def test_compare_writes_four_rows_in_plan_order(replay_run: tuple[Path, str]) -> None:
    folder, _ = replay_run
    rows = _rows(folder)
    assert len(rows) == 4
    assert [(r["capacity"], r["policy"]) for r in rows] == [
        ("0.5ws", "lru"),
        ("0.5ws", "fifo"),
        ("3000", "lru"),
        ("3000", "fifo"),
    ]
    assert {r["experiment"] for r in rows} == {"compare"}
    assert {r["runner"] for r in rows} == {"replay"}
    assert {r["block_tokens"] for r in rows} == {16}
    assert len({r["cell_id"] for r in rows}) == 4
    for r in rows:
        assert r["num_hit_tokens"] <= r["num_input_tokens"]
        assert r["token_hit_ratio"] == r["num_hit_tokens"] / r["num_input_tokens"]
        assert math.isnan(r["flops_saved_ratio"]) and math.isnan(r["p95_ttft_s"])
    assert len((folder / "results.csv").read_text().splitlines()) == 5
    assert not (folder / "cdf.parquet").exists()  # replay: no latencies
    assert not (folder / "requests.parquet").exists()  # no --detail


def test_compare_cell_equals_a_direct_replay(replay_run: tuple[Path, str]) -> None:
    """compare adds no arithmetic: each cell is the replay runner on the generated trace."""
    from prefixlab.runner.replay import ReplayConfig, replay
    from prefixlab.workload.generators import GENERATORS

    folder, _ = replay_run
    trace = GENERATORS["sessions"].fn(num_sessions=6, seed=0)
    ws = int(trace.block_layout(16).num_distinct_keys)
    for row in _rows(folder):
        assert row["num_requests"] == len(trace)
        assert row["working_set_blocks"] == ws
        expected_blocks = int(0.5 * ws) if row["capacity"] == "0.5ws" else 3000
        assert row["capacity_blocks"] == expected_blocks
        res = replay(trace, row["policy"], ReplayConfig(row["capacity_blocks"], block_tokens=16))
        assert res.metrics["token_hit_ratio"] == row["token_hit_ratio"]
        assert res.metrics["num_hit_tokens"] == row["num_hit_tokens"]
        assert res.metrics["num_evictions"] == row["num_evictions"]
    # a cache as large as the working set never evicts, so lru and fifo agree there
    big = [r for r in _rows(folder) if r["capacity"] == "3000"]
    assert big[0]["num_evictions"] == 0 and big[0]["token_hit_ratio"] == big[1]["token_hit_ratio"]


def test_second_compare_runs_nothing_and_keeps_the_results(
    replay_run: tuple[Path, str],
) -> None:
    folder, _ = replay_run
    before = _rows(folder)
    result = _invoke("compare", *COMPARE, "--out", str(folder))
    assert result.exit_code == 0, result.output
    assert "4 cells: 0 run, 4 already done" in result.output
    assert _same(_rows(folder), before)


def test_compare_quiet_prints_only_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "q"
    result = _invoke(
        "compare",
        GEN,
        "-p",
        "lru",
        "-c",
        "3000",
        "--block-tokens",
        "16",
        "--out",
        str(out),
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [str(out)]
    assert len(_rows(out)) == 1


def test_compare_table_is_the_mean_over_seeds(tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    result = _invoke(
        "compare",
        GEN,
        "-p",
        "lru",
        "-c",
        "3000",
        "--block-tokens",
        "16",
        "--seed",
        "0",
        "--seed",
        "1",
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "compare (mean and sd of 2 seeds)" in result.output
    rows = _rows(out)
    assert [r["seed"] for r in rows] == [0, 1]
    assert rows[0]["token_hit_ratio"] != rows[1]["token_hit_ratio"]  # two different traces
    (shown,) = table(result.output)
    mean = (rows[0]["token_hit_ratio"] + rows[1]["token_hit_ratio"]) / 2
    assert shown["token hit"] == f"{mean:.4f}"
    sd = abs(rows[0]["token_hit_ratio"] - rows[1]["token_hit_ratio"]) / 2**0.5  # two seeds
    assert shown["± sd"] == f"{sd:.4f}"


# ------------------------------------------------------------------ compare (engine)
def test_engine_compare_fills_latency_and_flops(engine_run: tuple[Path, str]) -> None:
    folder, output = engine_run
    rows = _rows(folder)
    stored = {(r["capacity"], r["policy"]): r for r in rows}
    for shown in table(output):
        row = stored[(shown["capacity"], shown["policy"])]
        assert shown["FLOPs saved"] == f"{row['flops_saved_ratio']:.1%}"
        assert shown["TTFT mean s"] == secs(row["mean_ttft_s"])
        assert shown["TTFT P95 s"] == secs(row["p95_ttft_s"])
    assert len(rows) == 4 and {r["runner"] for r in rows} == {"engine"}
    for r in rows:
        assert r["timing"]
        assert 0 < r["p5_ttft_s"] <= r["p50_ttft_s"] <= r["p95_ttft_s"] <= r["p99_ttft_s"]
        assert r["mean_ttft_s"] > 0 and r["throughput_tokens_per_s"] > 0
        # FLOPs saved differs from the token hit ratio only by the attention's square term
        assert 0.0 <= r["flops_saved_ratio"] <= 1.0
        assert r["flops_saved_ratio"] == pytest.approx(r["token_hit_ratio"], abs=0.03)
        assert r["flops_saved"] == pytest.approx(
            sum(r[f"flops_saved_{t}"] for t in ("attention", "mlp", "moe", "ssm"))
        )
        assert r["flops_saved"] == pytest.approx(r["flops_saved_ratio"] * r["flops_total"])


def test_engine_cdf_has_101_monotone_quantiles(engine_run: tuple[Path, str]) -> None:
    folder, _ = engine_run
    cdf = _rows(folder, "cdf")
    assert len(cdf) == 4 * 101
    for row in _rows(folder):
        points = [c for c in cdf if c["cell_id"] == row["cell_id"]]
        assert len(points) == 101
        assert [p["quantile"] for p in points] == [round(i / 100, 6) for i in range(101)]
        ttft = np.array([p["ttft_s"] for p in points])
        prefill = np.array([p["prefill_s"] for p in points])
        assert (np.diff(ttft) >= 0).all() and (np.diff(prefill) >= 0).all()
        assert (ttft >= prefill).all()  # queueing only adds: arrival <= scheduled
        assert points[95]["ttft_s"] == pytest.approx(row["p95_ttft_s"], rel=1e-9)
        assert points[50]["ttft_s"] == pytest.approx(row["p50_ttft_s"], rel=1e-9)


def test_engine_detail_requests_add_up_to_the_row(engine_run: tuple[Path, str]) -> None:
    folder, _ = engine_run
    requests = _rows(folder, "requests")
    rows = _rows(folder)
    assert len(requests) == sum(r["num_requests"] for r in rows)
    for row in rows:
        mine = [q for q in requests if q["cell_id"] == row["cell_id"]]
        assert len(mine) == row["num_requests"] == 15
        assert [q["request"] for q in mine] == list(range(15))
        assert {q["policy"] for q in mine} == {row["policy"]}
        assert sum(q["hit_tokens"] for q in mine) == row["num_hit_tokens"]
        assert sum(q["input_length"] for q in mine) == row["num_input_tokens"]
        mean_ttft = float(np.mean([q["ttft_s"] for q in mine]))
        assert mean_ttft == pytest.approx(row["mean_ttft_s"], rel=1e-12)
        for q in mine:  # TTFT counts from arrival; prefill from the first schedule
            assert q["ttft_s"] == pytest.approx(q["first_token_s"] - q["arrival_s"], abs=1e-12)
            assert q["prefill_s"] == pytest.approx(q["first_token_s"] - q["scheduled_s"], abs=1e-12)
            assert q["queue_s"] == pytest.approx(q["scheduled_s"] - q["arrival_s"], abs=1e-12)


# ------------------------------------------------------------------ one-line errors
@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        ([GEN, "-p", "nope", "-c", "3000"], ["--policy", "unknown policy 'nope'"]),
        ([GEN, "-p", "lru", "-c", "1"], ["1 blocks cannot hold request", "give at least"]),
        ([GEN, "-p", "lru", "-c", "half"], ["--capacity[0]", "'half' is not a capacity"]),
        ([GEN, "-p", "lru", "-c", "0"], ["--capacity[0]", "must be positive"]),
        ([GEN, "-p", "lru", "-c", "0.5A"], ["'A'", "needs --model"]),
        ([GEN, "-p", "lru", "-c", "3000", "--runner", "engine"], ["--runner", "needs --timing"]),
        ([GEN, "-p", "lru", "-c", "3000", "--runner", "gpu"], ["--runner", "'gpu' unknown"]),
        (
            ["gen:sessions:num_sesions=3", "-p", "lru", "-c", "3000"],
            ["generator 'sessions' has no parameter 'num_sesions'"],
        ),
        ([GEN, "-p", "lru", "-p", "lru", "-c", "3000"], ["twice"]),
    ],
    ids=[
        "policy",
        "capacity-too-small",
        "capacity-string",
        "capacity-zero",
        "capacity-A",
        "engine-no-timing",
        "runner",
        "generator-param",
        "duplicate-policy",
    ],
)
def test_compare_errors_are_one_line(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    out = tmp_path / "o"
    result = _invoke("compare", *args, "--block-tokens", "16", "--out", str(out))
    _assert_one_line_error(result, *fragments)
    assert not (out / "results.parquet").exists()
    assert not (out / "cells").is_dir() or not list((out / "cells").iterdir())


@pytest.mark.parametrize(
    ("args", "key", "flag"),
    [
        pytest.param(
            ["-c", "1"],
            "cache.capacities",
            "--capacity",
            id="capacity-too-small",
        ),
        pytest.param(
            ["-c", "3000", "--runner", "engine", "--model", "llama-3.1-8b"],
            "model.gpu",
            "--gpu",
            id="engine-without-gpu",
        ),
        (["-p", "nope", "-c", "3000"], "policies[", "--policy"),
        (["-c", "half"], "cache.capacities", "--capacity"),
    ],
)
def test_compare_errors_name_flags_not_config_keys(
    tmp_path: Path, args: list[str], key: str, flag: str
) -> None:
    result = _invoke(
        "compare", GEN, "-p", "lru", *args, "--block-tokens", "16", "--out", str(tmp_path / "o")
    )
    out = _assert_one_line_error(result)
    assert key not in out and flag in out


def test_rerun_with_detail_writes_the_requests_table(tmp_path: Path) -> None:
    out = tmp_path / "d"
    args = ["compare", GEN, "-p", "lru", "-c", "3000", "--block-tokens", "16", "--out", str(out)]
    assert _invoke(*args, "--quiet").exit_code == 0
    result = _invoke(*args, "--quiet", "--detail")
    assert result.exit_code == 0, result.output
    assert (out / "requests.parquet").is_file()


# ------------------------------------------------------------------ results
def test_results_list_shows_every_results_folder(
    parent: Path, replay_run: tuple[Path, str], engine_run: tuple[Path, str]
) -> None:
    result = _invoke("results", "list", str(parent))
    assert result.exit_code == 0, result.output
    body = table(result.output)
    assert sorted(body, key=lambda r: r["folder"]) == [
        {
            "folder": str(folder),
            "study": "compare",
            "runner": kind,
            "rows": "4",
            "policies": "lru, fifo",
            "capacities": "0.5ws, 3000",
            "seeds": "1",
        }
        for folder, kind in ((engine_run[0], "engine"), (replay_run[0], "replay"))
    ]


def test_results_commands_serve_an_experts_study_too(tmp_path: Path) -> None:
    """results list / show / query on an expert-cache study's folder (it has no runner
    column: the list says its kind)."""
    from prefixlab.experts.config import parse_sweep_config
    from prefixlab.experts.sweep import run_expert_sweep

    cfg = parse_sweep_config(
        {
            "name": "zipf-small",
            "workload": {
                "trace": "gen:zipf",
                "params": {"num_layers": 2, "num_experts": 3, "num_tokens": 20},
            },
            "cache": {"capacities": [2, 4], "policies": ["lru", "opt"]},
        }
    )
    run_expert_sweep(cfg, tmp_path / "z")
    listed = table(_invoke("results", "list", str(tmp_path)).output)
    assert [(r["study"], r["runner"], r["rows"], r["policies"]) for r in listed] == [
        ("zipf-small", "experts", "4", "lru, opt")
    ]
    shown = _invoke("results", "show", str(tmp_path / "z"), "--csv")
    assert shown.exit_code == 0 and shown.output.splitlines()[0].startswith("variant,")
    sql = "select policy, sum(num_faults) as f from results group by policy order by policy"
    queried = table(_invoke("results", "query", str(tmp_path / "z"), sql).output)
    opt = [r for r in queried if r["policy"] == "opt"]
    lru = [r for r in queried if r["policy"] == "lru"]
    assert int(opt[0]["f"]) <= int(lru[0]["f"])  # Belady faults no more than LRU


def test_results_list_errors(tmp_path: Path) -> None:
    _assert_one_line_error(_invoke("results", "list", str(tmp_path / "none")), "no such folder")
    _assert_one_line_error(_invoke("results", "list", str(tmp_path)), "no results folders")


def test_results_show_csv_filters_rows(replay_run: tuple[Path, str]) -> None:
    folder, _ = replay_run
    result = _invoke(
        "results",
        "show",
        str(folder),
        "--where",
        "policy=lru",
        "--columns",
        "policy,capacity,token_hit_ratio",
        "--csv",
    )
    assert result.exit_code == 0, result.output
    lines = _csv_rows(result.output)
    assert lines[0] == ["policy", "capacity", "token_hit_ratio"]
    stored = [r for r in _rows(folder) if r["policy"] == "lru"]
    assert lines[1:] == [["lru", r["capacity"], repr(r["token_hit_ratio"])] for r in stored]
    # filters combine; the results file itself names its folder; --limit caps the rows
    result = _invoke(
        "results",
        "show",
        str(folder / "results.parquet"),
        "--where",
        "policy=fifo",
        "--where",
        "capacity_blocks=3000",
        "--columns",
        "policy,capacity",
        "--csv",
    )
    assert _csv_rows(result.output) == [["policy", "capacity"], ["fifo", "3000"]]
    result = _invoke("results", "show", str(folder), "--limit", "3", "--csv")
    assert len(_csv_rows(result.output)) == 1 + 3


def test_results_show_table_of_cdf(engine_run: tuple[Path, str]) -> None:
    folder, _ = engine_run
    result = _invoke("results", "show", str(folder), "--table", "cdf", "--where", "quantile=1.0")
    assert result.exit_code == 0, result.output
    assert "cdf (4 rows shown)" in " ".join(result.output.split())  # the title may wrap
    body = table(result.output)
    assert {(r["capacity"], r["policy"]) for r in body} == CELLS
    assert {r["quantile"] for r in body} == {"1"}
    # quantile 1 is the slowest request of the cell (seconds in at most six characters)
    slowest: dict[tuple[str, str], float] = {}
    for q in _rows(folder, "requests"):
        key = (q["capacity"], q["policy"])
        slowest[key] = max(slowest.get(key, 0.0), q["ttft_s"])
    for shown in body:
        assert shown["ttft_s"] == secs(slowest[(shown["capacity"], shown["policy"])])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--columns", "policy,nope"], ["--columns: no column 'nope' in results"]),
        (["--where", "policy"], ["--where 'policy': expected column=value"]),
        (["--where", "nope=1"], ["--where 'nope=1'"]),
        (["--table", "requests"], ["no requests table (run with --detail)"]),
        (["--table", "nope"], ["unknown table 'nope'"]),
    ],
    ids=["column", "where-no-equals", "where-column", "missing-table", "unknown-table"],
)
def test_results_show_errors_are_one_line(
    replay_run: tuple[Path, str], args: list[str], fragments: list[str]
) -> None:
    folder, _ = replay_run
    _assert_one_line_error(_invoke("results", "show", str(folder), *args), *fragments)


def test_results_show_of_a_folder_without_results(tmp_path: Path) -> None:
    _assert_one_line_error(_invoke("results", "show", str(tmp_path)), "no results.parquet here")


def test_results_query_counts_and_sums(
    replay_run: tuple[Path, str], engine_run: tuple[Path, str]
) -> None:
    pytest.importorskip("duckdb")
    folder, _ = replay_run
    sql = "select policy, count(*) as n from results group by policy order by policy"
    result = _invoke("results", "query", str(folder), sql, "--csv")
    assert result.exit_code == 0, result.output
    assert _csv_rows(result.output) == [["policy", "n"], ["fifo", "2"], ["lru", "2"]]
    # the requests view exists with --detail and adds up to the results rows
    engine, _ = engine_run
    sql = (
        "select r.policy, r.capacity, sum(q.hit_tokens) = r.num_hit_tokens as same "
        "from requests q join results r using (cell_id) "
        "group by r.policy, r.capacity, r.num_hit_tokens "
        "order by r.capacity, r.policy"
    )
    result = _invoke("results", "query", str(engine), sql, "--csv")
    assert result.exit_code == 0, result.output
    assert _csv_rows(result.output) == [
        ["policy", "capacity", "same"],
        ["fifo", "0.5ws", "True"],
        ["lru", "0.5ws", "True"],
        ["fifo", "3000", "True"],
        ["lru", "3000", "True"],
    ]


@pytest.mark.parametrize(
    ("sql", "fragments"),
    [
        ("selec policy from results", ["query failed:", "syntax error"]),
        ("select * from requests", ["query failed:", "requests"]),
        ("select nope from results", ["query failed:", "nope"]),
    ],
    ids=["syntax", "missing-table", "missing-column"],
)
def test_results_query_errors_are_one_line(
    replay_run: tuple[Path, str], sql: str, fragments: list[str]
) -> None:
    pytest.importorskip("duckdb")
    folder, _ = replay_run
    out = _assert_one_line_error(_invoke("results", "query", str(folder), sql), *fragments)
    assert out.startswith("error: query failed:")


# ------------------------------------------------------------------ sweep, vary
@pytest.fixture(scope="module")
def vary_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    root = tmp_path_factory.mktemp("vary")
    config = root / "vary.toml"
    config.write_text(VARY_TOML)
    out = root / "out"
    return out, _invoke("sweep", str(config), "--out", str(out), "--quiet", "--no-report")


def test_sweep_quiet_prints_only_the_folder(vary_run: tuple[Path, Result]) -> None:
    out, result = vary_run
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [str(out)]
    assert len(_rows(out)) == 2
    assert not (out / "report.html").exists()  # --no-report
    resolved = json.loads((out / "config.resolved.json").read_text())
    assert resolved["workload"]["vary"] == {"p": [0.2, 0.8]}


def test_sweep_default_folder_is_results_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "vary.toml").write_text(VARY_TOML)
    monkeypatch.chdir(tmp_path)
    result = _invoke("sweep", "vary.toml", "--quiet", "--no-report")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [str(Path("results") / "vary")]
    assert (tmp_path / "results" / "vary" / "results.parquet").is_file()


def test_sweep_yaml_gives_the_toml_rows(vary_run: tuple[Path, Result], tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    out, _ = vary_run
    config = tmp_path / "vary.yaml"
    config.write_text(VARY_YAML)
    result = _invoke("sweep", str(config), "--out", str(tmp_path / "y"), "--quiet", "--no-report")
    assert result.exit_code == 0, result.output
    assert _same(_rows(tmp_path / "y"), _rows(out))


def test_vary_adds_a_variant_column(vary_run: tuple[Path, Result]) -> None:
    out, _ = vary_run
    rows = {r["variant"]: r for r in _rows(out)}
    assert list(rows) == ["p=0.2", "p=0.8"]
    low, high = rows["p=0.2"], rows["p=0.8"]
    assert high["token_hit_ratio"] > low["token_hit_ratio"]
    for r in (low, high):
        assert r["num_requests"] == 200 and r["capacity_blocks"] == 64
        # every prompt is one partial block: a hit token ratio is a hit request ratio
        assert r["token_hit_ratio"] == r["request_hit_ratio"]
        # at best (infinite cache) every request but a prompt's first is a hit
        assert r["num_hit_blocks"] <= r["num_requests"] - r["working_set_blocks"]
    # p=0.8 repeats few prompts: all fit in 64 blocks, nothing is evicted, the bound is met
    assert high["working_set_blocks"] <= 64 and high["num_evictions"] == 0
    assert high["token_hit_ratio"] == (200 - high["working_set_blocks"]) / 200
    # p=0.2 does not fit: evictions cost hits
    assert low["working_set_blocks"] > 64 and low["num_evictions"] > 0


def test_vary_table_has_a_workload_column(vary_run: tuple[Path, Result]) -> None:
    out, _ = vary_run
    result = _invoke("sweep", str(out.parent / "vary.toml"), "--out", str(out), "--no-report")
    assert result.exit_code == 0, result.output
    assert "workload" in result.output
    assert "2 cells: 0 run, 2 already done" in result.output
    rows = {r["variant"]: r for r in _rows(out)}
    assert [(r["workload"], r["policy"], r["token hit"]) for r in table(result.output)] == [
        (v, "lru", f"{rows[v]['token_hit_ratio']:.4f}") for v in ("p=0.2", "p=0.8")
    ]


# ------------------------------------------------------------------ demo
def test_demo_help_mentions_the_number_of_requests() -> None:
    result = _invoke("demo", "--help")
    assert result.exit_code == 0
    assert "--num-requests" in result.output


def test_demo_refuses_too_few_requests(tmp_path: Path) -> None:
    result = _invoke("demo", "--num-requests", "10", "--out", str(tmp_path / "d"), "--quiet")
    assert result.exit_code == 2
    assert not (tmp_path / "d").exists()


def test_demo_config_parses() -> None:
    from prefixlab.experiments.config import config_from_text

    text = resources.files("prefixlab.experiments").joinpath("demo.toml").read_text("utf-8")
    cfg = config_from_text(text, "demo")
    assert cfg.name == "demo"
    assert cfg.runner.kind == "engine"
    assert "opt" in cfg.policies and "lru" in cfg.policies
    assert len(cfg.cache.capacities) == 4
    assert cfg.workload.source == "gen:mix" and "num_requests" in cfg.workload.params
    assert cfg.model.name and cfg.model.gpu and cfg.model.timing

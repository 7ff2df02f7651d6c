"""Sweeps (issue 5): same rows from every backend, resume after a kill, one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experiments.config import parse_config
from prefixlab.experiments.run import COLUMNS, plan, run_cell
from prefixlab.experiments.store import ResultsStore
from prefixlab.experiments.sweep import run_sweep

# 3 policies x 4 capacities x 2 seeds = 24 cells, small enough for seconds per backend
SWEEP: dict[str, Any] = {
    "name": "acceptance",
    "workload": {"source": "gen:sessions", "params": {"num_sessions": 12}},
    "cache": {"block_tokens": 16, "capacities": ["0.3ws", "0.5ws", "0.8ws", 4000]},
    "policies": ["lru", "s3fifo", "lecar"],
    "seeds": [0, 1],
}


def _rows(folder: Path, table: str = "results") -> list[dict[str, Any]]:
    return pq.read_table(folder / f"{table}.parquet").to_pylist()


def _same(a: Any, b: Any) -> bool:
    """Bit-for-bit equal rows: JSON keeps each float's repr, and NaN equals NaN."""
    return json.dumps(a) == json.dumps(b)


@pytest.fixture(scope="module")
def serial(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serial")
    summary = run_sweep(parse_config(SWEEP), folder, jobs=1)
    assert len(summary.ran) == 24 and not summary.skipped
    return folder


def test_rows_are_tidy_and_in_plan_order(serial: Path) -> None:
    rows = _rows(serial)
    assert len(rows) == 24
    assert list(rows[0]) == list(COLUMNS)
    order = [(r["capacity_index"], r["policy_index"], r["seed"]) for r in rows]
    assert order == sorted(order)
    assert {r["policy"] for r in rows} == {"lru", "s3fifo", "lecar"}
    # the 4000-block capacity stays 4000; fractions resolve against each seed's working set
    for r in rows:
        if r["capacity"] == "4000":
            assert r["capacity_blocks"] == 4000
        else:
            frac = float(r["capacity"][:-2])
            assert r["capacity_blocks"] == int(frac * r["working_set_blocks"])
        assert 0.0 <= r["token_hit_ratio"] <= 1.0
        assert r["num_hit_tokens"] == round(r["token_hit_ratio"] * r["num_input_tokens"])
    # the CSV holds the same rows
    csv_lines = (serial / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 25
    resolved = json.loads((serial / "config.resolved.json").read_text())
    assert resolved["policies"] == ["lru", "s3fifo", "lecar"]


def test_a_cell_equals_a_direct_replay(serial: Path) -> None:
    """The sweep adds no arithmetic of its own: a cell is the replay runner's result."""
    from prefixlab.runner.replay import ReplayConfig, replay
    from prefixlab.workload.generators import GENERATORS

    row = next(
        r
        for r in _rows(serial)
        if r["policy"] == "s3fifo" and r["seed"] == 1 and r["capacity"] == "0.5ws"
    )
    trace = GENERATORS["sessions"].fn(num_sessions=12, seed=1)
    res = replay(trace, "s3fifo", ReplayConfig(row["capacity_blocks"], block_tokens=16))
    assert res.metrics["num_hit_tokens"] == row["num_hit_tokens"]
    assert res.metrics["num_evictions"] == row["num_evictions"]


def test_capacities_are_stored_as_bytes(serial: Path) -> None:
    """With a model, every cell stores the KV bytes its cache holds, whatever the unit the
    capacity was given in; without one, -1 (the serial sweep has no model)."""
    from prefixlab.model.spec import get_model

    assert {r["capacity_bytes"] for r in _rows(serial)} == {-1}
    per_block = get_model("llama-3.1-8b").kv_bytes_per_block(16)
    assert per_block == 16 * 2 * 32 * 8 * 128 * 2  # tokens x K,V x layers x heads x dim x fp16
    capacities = ["2GB", "2GiB", 600, "0.9ws"]
    cache = {"block_tokens": 16, "capacities": capacities}
    model = {"name": "llama-3.1-8b"}
    cfg = parse_config({**SWEEP, "policies": ["lru"], "seeds": [0], "model": model, "cache": cache})
    rows = [run_cell(cfg, cell).row for cell in plan(cfg)]
    blocks = [2 * 10**9 // per_block, 2**31 // per_block, 600]
    assert [r["capacity_blocks"] for r in rows[:3]] == blocks
    for r in rows:
        assert r["capacity_bytes"] == r["capacity_blocks"] * per_block


def test_lecar_gets_the_cell_seed(serial: Path) -> None:
    cfg = parse_config(SWEEP)
    cell = next(c for c in plan(cfg) if c.policy == "lecar" and c.seed == 1)
    a = run_cell(cfg, cell).row
    import prefixlab.experiments.run as run_mod

    assert run_mod.policy_spec("lecar", 1) == "lecar:seed=1"
    assert run_mod.policy_spec("lecar:seed=5", 1) == "lecar:seed=5"
    assert run_mod.policy_spec("lecar:learning_rate=0.2", 3) == "lecar:learning_rate=0.2,seed=3"
    assert run_mod.policy_spec("lru", 3) == "lru"
    assert _same(a, next(r for r in _rows(Path(serial)) if r["cell_id"] == cell.cell_id))


def test_two_jobs_give_the_same_rows(serial: Path, tmp_path: Path) -> None:
    run_sweep(parse_config(SWEEP), tmp_path, jobs=2)
    for table in ("results", "breakdown"):
        assert _same(_rows(tmp_path, table), _rows(serial, table))


def test_ray_gives_the_same_rows(serial: Path, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    summary = run_sweep(parse_config(SWEEP), tmp_path, jobs=2, backend="ray")
    assert len(summary.ran) == 24
    for table in ("results", "breakdown"):
        assert _same(_rows(tmp_path, table), _rows(serial, table))
    workers = {
        line.rsplit(",", 1)[1] for line in (tmp_path / "timings.csv").read_text().splitlines()[1:]
    }
    assert workers  # Ray's worker processes, not this one
    assert f"{os.getpid()}" not in " ".join(workers)


def test_rerun_skips_finished_cells(serial: Path, tmp_path: Path) -> None:
    cfg = parse_config(SWEEP)
    first = run_sweep(cfg, tmp_path, jobs=1, stop_after=10)
    assert len(first.ran) == 10 and not (tmp_path / "results.parquet").exists()
    second = run_sweep(cfg, tmp_path, jobs=2)
    assert len(second.skipped) == 10 and len(second.ran) == 14
    assert set(first.ran).isdisjoint(second.ran)
    assert _same(_rows(tmp_path), _rows(serial))
    third = run_sweep(cfg, tmp_path, jobs=1)
    assert not third.ran and len(third.skipped) == 24


def test_a_changed_config_reruns_only_new_cells(serial: Path, tmp_path: Path) -> None:
    cfg = parse_config(SWEEP)
    run_sweep(cfg, tmp_path, jobs=1)
    more = parse_config({**SWEEP, "policies": ["lru", "s3fifo", "lecar", "fifo"]})
    summary = run_sweep(more, tmp_path, jobs=1)
    assert len(summary.ran) == 8 and len(summary.skipped) == 24
    assert len(_rows(tmp_path)) == 32
    # a different workload changes every cell id: nothing is reused by mistake
    other = parse_config(
        {**SWEEP, "workload": {"source": "gen:sessions", "params": {"num_sessions": 13}}}
    )
    assert not {c.cell_id for c in plan(other)} & {c.cell_id for c in plan(cfg)}


def _sweep_until(tmp_path: Path, out: Path, jobs: str, cells: int) -> subprocess.Popen[str]:
    """A real `prefixlab sweep` of SWEEP into ``out``, once it has saved ``cells`` cells; in
    a session of its own (its process group gets the signal a terminal would send)."""
    config = tmp_path / "exp.toml"
    config.write_text(_toml(SWEEP))
    cmd = [
        sys.executable,
        "-m",
        "prefixlab",
        "sweep",
        str(config),
        "--out",
        str(out),
        "--jobs",
        jobs,
        "--quiet",
        "--no-report",
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, text=True
    )
    saved = out / "cells"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if saved.is_dir() and len(list(saved.glob("*.json"))) >= cells:
            return proc
        time.sleep(0.01)
    assert proc.stderr is not None
    pytest.fail(f"the sweep ended before it could be stopped: {proc.stderr.read()!r}")


def test_killed_sweep_resumes_only_missing_cells(serial: Path, tmp_path: Path) -> None:
    """SIGKILL a real `prefixlab sweep` halfway; the rerun runs only what is missing."""
    out = tmp_path / "out"
    proc = _sweep_until(tmp_path, out, jobs="1", cells=6)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = ResultsStore(out).done()
    assert 6 <= len(done_before) < 24
    assert not (out / "results.parquet").exists()
    summary = run_sweep(parse_config(SWEEP), out, jobs=2)
    assert set(summary.skipped) == done_before
    assert len(summary.ran) == 24 - len(done_before)
    assert _same(_rows(out), _rows(serial))
    assert not list((out / "cells").glob(".*.tmp"))  # no half-written cell was taken as done


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_says_what_is_saved_and_how_to_resume(tmp_path: Path, jobs: str) -> None:
    """SIGINT (Ctrl-C) a real `prefixlab sweep`: one line with the saved cells and the way
    to resume, exit 130, no traceback; the rerun runs only the missing cells."""
    out = tmp_path / "out"
    proc = _sweep_until(tmp_path, out, jobs=jobs, cells=3)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    saved = len(ResultsStore(out).done())
    assert f"interrupted: {saved:,} finished cells are saved in {out}" in stderr
    assert "run the same command again to resume" in stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr
    summary = run_sweep(parse_config(SWEEP), out, jobs=1)
    assert len(summary.skipped) == saved and len(summary.ran) == 24 - saved


def _toml(data: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v)

    lines = [
        f"name = {value(data['name'])}",
        f"policies = {value(data['policies'])}",
        f"seeds = {value(data['seeds'])}",
        "[workload]",
        f"source = {value(data['workload']['source'])}",
        "params = { "
        + ", ".join(f"{k} = {value(v)}" for k, v in data["workload"]["params"].items())
        + " }",
        "[cache]",
        f"block_tokens = {data['cache']['block_tokens']}",
        f"capacities = {value(data['cache']['capacities'])}",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ one-line errors
runner = CliRunner()


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ('polcies = ["lru"]', "config key 'polcies' unknown"),
        ('policies = ["lru", "lruu"]', "policies[1]: unknown policy 'lruu'"),
        (
            "[cache]\ncapacities = [1]\nblock_tokens = 16",
            "cache.capacities[0] = 1: 1 blocks cannot hold request",
        ),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, patch: str, message: str) -> None:
    base = {
        "policies": 'policies = ["lru"]',
        "workload": '[workload]\nsource = "gen:sessions"\nparams = { num_sessions = 3 }',
        "cache": "[cache]\ncapacities = [500]\nblock_tokens = 16",
    }
    if patch.startswith("polcies") or patch.startswith("policies"):
        base["policies"] = patch
    else:
        base["cache"] = patch
    text = base["policies"] + "\n" + base["workload"] + "\n" + base["cache"] + "\n"
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    result = runner.invoke(app, ["sweep", str(cfg), "--out", str(tmp_path / "o"), "--quiet"])
    assert result.exit_code == 2
    out = result.output.strip()
    assert len(out.splitlines()) == 1, out
    assert out.startswith("error:") and message in out
    assert "Traceback" not in out
    assert not (tmp_path / "o" / "results.parquet").exists()


def test_impossible_capacity_fails_before_any_cell_runs(tmp_path: Path) -> None:
    data = {**SWEEP, "cache": {"block_tokens": 16, "capacities": ["0.5ws", 3]}}
    with pytest.raises(ConfigError, match=r"cache.capacities\[1\] = 3: 3 blocks cannot hold"):
        run_sweep(parse_config(data), tmp_path, jobs=1)
    assert not ResultsStore(tmp_path).done()


def test_bad_backend_and_jobs(tmp_path: Path) -> None:
    cfg = parse_config(SWEEP)
    with pytest.raises(ConfigError, match="--backend 'spark' unknown"):
        run_sweep(cfg, tmp_path, backend="spark")
    with pytest.raises(ConfigError, match="--jobs must be a positive integer"):
        run_sweep(cfg, tmp_path, jobs=0)
    with pytest.raises(ConfigError, match="--address applies to --backend ray"):
        run_sweep(cfg, tmp_path, address="auto")


@pytest.mark.parametrize(
    ("content", "what"),
    [
        ("{}", "no 'row'"),
        ("[]", "a JSON array, not an object"),
        ('{"row": 3}', "'row' is a JSON number"),
        ("{", "unreadable cell result"),
    ],
)
def test_a_damaged_cell_file_is_one_line_naming_it(
    serial: Path, tmp_path: Path, content: str, what: str
) -> None:
    """A cell file someone emptied or edited: the resumed sweep names the file and says
    what to do (it was a KeyError traceback)."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(serial, out)
    cell = sorted((out / "cells").glob("*.json"))[3]
    cell.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        run_sweep(parse_config(SWEEP), out, jobs=1)
    assert str(cell) in str(err.value) and what in str(err.value)
    assert str(err.value).endswith("delete it to rerun")
    config = tmp_path / "exp.toml"
    config.write_text(_toml(SWEEP))
    res = CliRunner().invoke(
        app, ["sweep", str(config), "--out", str(out), "--quiet", "--no-report"]
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert what in res.output
    cell.unlink()  # deleted, the cell reruns and the rows are the serial run's
    run_sweep(parse_config(SWEEP), out, jobs=1)
    assert _same(_rows(out), _rows(serial))


def test_a_folder_another_sweep_is_writing_is_refused(tmp_path: Path) -> None:
    """Two sweeps into one folder both ran every cell (issue 19): now the second stops at
    once, naming the first's pid, here a real other process holding the folder's lock;
    once that process is gone (killed: the kernel drops its lock), the sweep runs."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom prefixlab.io import folder_lock\n"
            f"with folder_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        small = parse_config({**SWEEP, "policies": ["lru"], "seeds": [0]})
        with pytest.raises(
            ConfigError, match=rf"another sweep is writing this folder \(pid {holder.pid}\)"
        ):
            run_sweep(small, out, jobs=1)
        assert not (out / "cells").exists()  # nothing was written
        config = tmp_path / "exp.toml"
        config.write_text(_toml({**SWEEP, "policies": ["lru"], "seeds": [0]}))
        res = CliRunner().invoke(
            app, ["sweep", str(config), "--out", str(out), "--quiet", "--no-report"]
        )
        assert res.exit_code == 2 and "another sweep is writing this folder" in res.output
    finally:
        holder.kill()
        holder.wait()
    summary = run_sweep(small, out, jobs=1)
    assert len(summary.ran) == 4 and (out / "results.parquet").is_file()

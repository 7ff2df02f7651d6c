"""The CLI: JSON output fields, per-request CSV, policy listing, clear errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.cli.main import app
from prefixlab.policies import registered
from tests.tables import table_rows

runner = CliRunner()
GEN = "gen:sessions:num_sessions=30,seed=5"
REQUIRED = {
    "policy",
    "capacity_blocks",
    "num_requests",
    "num_input_tokens",
    "num_hit_tokens",
    "token_hit_ratio",
    "request_hit_ratio",
    "num_evictions",
    "elapsed_s",
    "blocks_per_s",
}


def _run(*args: str) -> tuple[int, str, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_replay_json_fields_and_per_request(tmp_path: Path) -> None:
    out = tmp_path / "per.csv"
    code, stdout, _ = _run(
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "600",
        "-p",
        "lru",
        "--json",
        "--per-request",
        str(out),
    )
    assert code == 0
    rows = json.loads(stdout)
    assert len(rows) == 1 and set(rows[0]) >= REQUIRED
    row = rows[0]
    assert row["policy"] == "lru" and row["capacity_blocks"] == 600
    assert row["token_hit_ratio"] == pytest.approx(row["num_hit_tokens"] / row["num_input_tokens"])
    with out.open() as fh:
        recs = list(csv.DictReader(fh))
    assert list(recs[0]) == ["index", "hit_tokens", "input_tokens"]
    assert len(recs) == row["num_requests"]
    assert sum(int(r["hit_tokens"]) for r in recs) == row["num_hit_tokens"]
    assert sum(int(r["input_tokens"]) for r in recs) == row["num_input_tokens"]
    assert all(int(r["hit_tokens"]) <= int(r["input_tokens"]) for r in recs)


def test_replay_several_policies_one_file_each(tmp_path: Path) -> None:
    out = tmp_path / "per.csv"
    code, stdout, _ = _run(
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "600",
        "-p",
        "vllm",
        "-p",
        "s3fifo:small_ratio=0.2",
        "--json",
        "--per-request",
        str(out),
    )
    assert code == 0
    assert [r["policy"] for r in json.loads(stdout)] == [
        "vllm",
        "s3fifo:small_ratio=0.2",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "per.s3fifo_small_ratio-0.2.csv",
        "per.vllm.csv",
    ]


def test_replay_table_output() -> None:
    code, stdout, _ = _run(
        "replay", GEN, "--block-tokens", "16", "--capacity-blocks", "600", "-p", "lru", "-p", "opt"
    )
    assert code == 0
    assert [row[0] for row in table_rows(stdout)] == ["lru", "opt"]
    assert "token hit" in stdout and "trace: sessions-chat-seed5" in stdout


def test_capacity_bytes_with_model() -> None:
    # llama-3.1-8b: 2 * 32 layers * 8 kv heads * 128 dims * 2 B = 131072 B per token;
    # a 16-token block is 2 MiB, so 1 GiB holds 512 blocks.
    code, stdout, _ = _run(
        "replay",
        GEN,
        "--block-tokens",
        "16",
        "--capacity-bytes",
        str(1 << 30),
        "--model",
        "llama-3.1-8b",
        "-p",
        "lru",
        "--json",
    )
    assert code == 0
    assert json.loads(stdout)[0]["capacity_blocks"] == 512


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "nosuch", "--capacity-blocks", "10"], "unknown policy 'nosuch'"),
        (["-p", "s3fifo:ratio=2", "--capacity-blocks", "10"], "has no parameter 'ratio'"),
        (["-p", "s3fifo:small_ratio=2", "--capacity-blocks", "10"], "small_ratio must be in"),
        (["-p", "lru"], "exactly one of --capacity-blocks or --capacity-bytes"),
        (["-p", "lru", "--capacity-bytes", "100"], "needs --model"),
        (["-p", "lru", "--capacity-bytes", "100", "--model", "llama-3.1-8b"], "holds no block"),
        (["-p", "lru", "--capacity-blocks", "0"], "capacity_blocks must be positive"),
        (["-p", "vllm", "--capacity-blocks", "9", "--structure", "radix"], "does not apply"),
        (["-p", "lru", "--capacity-blocks", "9", "--structure", "tree"], "unknown structure"),
        (["-p", "lru", "--capacity-blocks", "3"], "raise the capacity"),
    ],
)
def test_clear_one_line_errors(args: list[str], message: str) -> None:
    code, stdout, stderr = _run("replay", GEN, "--block-tokens", "16", *args)
    assert code == 2
    assert message in stderr.replace("\n", " ")
    assert "Traceback" not in stderr + stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gen:sessions:num_sessions=abc"], "num_sessions must be an integer"),
        (["gen:sessions:seed=-1"], "seed must be >= 0, got -1"),
        (["gen:sessions:mean_turns=0.5"], "mean_turns must be >= 1, got 0.5"),
        (["gen:sessions:gap_sigma=-1"], "gap_sigma must be > 0"),
        (["gen:sessions", "-p", "lecar:seed=1.5"], "seed must be an integer"),
        (["gen:sessions", "-p", "lecar:learning_rate=nan"], "learning_rate must be positive"),
        (["gen:sessions", "-p", "s3fifo:move_to_main_threshold=1.5"], "must be an integer"),
        (["gen:sessions", "--max-free-blocks", "-1"], "max_free_blocks must be >= 0"),
        (["gen:sessions", "--limit", "5"], "applies to trace files"),
        (["gen:sessions", "-p", "lru", "-p", "lru"], "a policy is given twice"),
        (["gen:sessions", "--per-request", "/nonexistent/dir/x.csv"], "does not exist"),
        (["gen:sessions:bad"], "generator spec"),
    ],
)
def test_more_one_line_errors(args: list[str], message: str) -> None:
    argv = ["replay", *args, "--block-tokens", "16", "--capacity-blocks", "2000"]
    if "-p" not in args:
        argv += ["-p", "lru"]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert message in res.stderr.replace("\n", " ")
    assert "Traceback" not in res.output


def test_token_form_needs_block_tokens() -> None:
    code, _, stderr = _run("replay", GEN, "--capacity-blocks", "100", "-p", "lru")
    assert code == 2 and "--block-tokens" in stderr


def test_malformed_trace_names_line_and_writes_nothing(tmp_path: Path) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"input_tokens": [1, 2], "output_length": 1}\n{"input_tokens": [1]}\n')
    out = tmp_path / "per.csv"
    code, _, stderr = _run(
        "replay",
        str(trace),
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "10",
        "-p",
        "lru",
        "--per-request",
        str(out),
    )
    assert code == 2
    flat = stderr.replace("\n", "")
    assert f"{trace}:2" in flat and "output_length" in flat and "missing" in flat
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]


def test_policies_lists_every_registered_policy() -> None:
    code, stdout, _ = _run("policies", "--json")
    assert code == 0
    listed = {p["name"]: p for p in json.loads(stdout)}
    assert set(listed) == set(registered())
    assert listed["s3fifo"]["parameters"] == {"small_ratio": 0.1, "move_to_main_threshold": 1}
    assert listed["vllm"]["structures"] == ["block"]
    assert all(p["description"] for p in listed.values())


def test_docs_policy_table_is_generated_from_registry() -> None:
    from prefixlab.policies.base import catalog_markdown as policies_markdown

    docs = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    assert policies_markdown() in docs


def test_replay_warns_when_min_recompute_leaves_requests_unable_to_hit() -> None:
    # 16-token prompts in 16-token blocks: with one token recomputed no block can be looked up
    gen = "gen:random-pool:num_requests=50,prompt_tokens=16,output_ids=false"
    code, stdout, stderr = _run(
        "replay", gen, "--block-tokens", "16", "--capacity-blocks", "20", "-p", "lru", "--json"
    )
    assert code == 0 and json.loads(stdout)[0]["num_hit_tokens"] == 0
    flat = stderr.replace("\n", " ")
    assert "50 of 50 requests" in flat and "min_recompute_tokens=1" in flat
    code, stdout, stderr = _run(
        "replay",
        gen,
        "--block-tokens",
        "16",
        "--capacity-blocks",
        "20",
        "-p",
        "lru",
        "--json",
        "--min-recompute-tokens",
        "0",
    )
    assert code == 0 and "warning" not in stderr and json.loads(stdout)[0]["num_hit_tokens"] > 0


def _without_timing(out: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = json.loads(out)
    for row in rows:
        row.pop("elapsed_s"), row.pop("blocks_per_s")
    return rows


@pytest.mark.parametrize("command", ["replay", "simulate"])
def test_capacity_bytes_take_units_as_configs_do(command: str) -> None:
    """`--capacity-bytes 1GiB` is 2**30 bytes, `1.5GB` 1.5e9 (it took only a number)."""
    base = [command, GEN, "-p", "lru", "--block-tokens", "16", "--model", "llama-3.2-1b", "--json"]
    if command == "simulate":
        base += ["--gpu", "h100"]
    results = []
    for size in ("1GiB", str(2**30), "1.5GB", "1500000000"):
        code, out, err = _run(*base, "--capacity-bytes", size)
        assert code == 0, err
        results.append(json.dumps(_without_timing(out)) if command == "replay" else out)
    if command == "replay":  # (the engine's JSON holds wall times)
        assert results[0] == results[1] and results[2] == results[3]
        assert results[0] != results[2]
    code, _, err = _run(*base, "--capacity-bytes", "8XB")
    assert code == 2 and "'8XB' is not a size" in err


def test_a_folder_given_as_the_trace_is_one_line(tmp_path: Path) -> None:
    for fmt in ("native", "mooncake", "sharegpt"):
        code, _, err = _run(
            "replay",
            str(tmp_path),
            "-f",
            fmt,
            "-p",
            "lru",
            "--capacity-blocks",
            "10",
            "--block-tokens",
            "16",
        )
        assert code == 2, (fmt, err)
        assert (
            err.strip()
            == f"error: {tmp_path}: a folder, not a file (the {fmt} format reads one file)"
        )


def test_version() -> None:
    from prefixlab import __version__

    code, out, _ = _run("--version")
    assert code == 0 and out == f"prefixlab {__version__}\n"
    from importlib.metadata import version

    assert version("prefixlab") == __version__  # the package's metadata says the same


@pytest.mark.parametrize("error", [KeyboardInterrupt(), SystemError("set on top of it")])
def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    """Every command: Ctrl-C (or the SystemError numba raises over it) prints one line and
    exits 130, not click's "Aborted!" (exit 1) or a traceback."""
    import prefixlab.cli.trace as cli_mod

    def stop(*args: object, **kwargs: object) -> None:
        if isinstance(error, KeyboardInterrupt):
            raise error
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise error  # noqa: B904 - as numba chains it: the interrupt is its context

    monkeypatch.setattr(cli_mod, "load_shown", stop)
    result = runner.invoke(app, ["trace", "stats", "gen:sessions", "--block-tokens", "16"])
    assert result.exit_code == 130, result.output
    assert "interrupted: stopped before the end" in result.output
    assert "Traceback" not in result.output and "Aborted" not in result.output


def _strict_json(text: str) -> object:
    """JSON as the standard has it: NaN and Infinity are refused."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["replay", GEN, "--block-tokens", "16", "--capacity-blocks", "2000", "-p", "lru"], list),
        (["policies"], list),
        (["trace", "stats", GEN, "--block-tokens", "16"], dict),
        (["analyze", "reuse", GEN, "--block-tokens", "16"], dict),
        (["reproduce"], list),
        (
            [
                "experts",
                "simulate",
                "gen:zipf:num_layers=2,num_experts=3,num_tokens=20",
                "-k",
                "2",
                "-p",
                "lru",
            ],
            list,
        ),
        (
            [
                "simulate",
                GEN,
                "--block-tokens",
                "16",
                "--capacity-blocks",
                "2000",
                "-p",
                "lru",
                "--timing",
                "power:preset=llama-3.2-1b-a100",
                "--timing",
                "tpot:s=0.02",
            ],
            list,
        ),
    ],
)
def test_every_json_output_is_one_strict_json_document(args: list[str], kind: type) -> None:
    """The --json convention (prefixlab.cli): one document on stdout, an array of rows or
    one object, NaN written as null; nothing else on stdout."""
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    doc = _strict_json(result.stdout)
    assert isinstance(doc, kind) and doc


def test_print_json_writes_what_json_lacks_as_null_numbers_or_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import numpy as np

    from prefixlab.cli.common import print_json

    print_json(
        [
            {"tpot": float("nan"), "ratio": float("inf"), "n": np.int64(3), "x": np.float32(0.5)},
            {"path": Path("a/b"), "t": (1, 2)},
        ]
    )
    out = capsys.readouterr().out
    assert _strict_json(out) == [
        {"tpot": None, "ratio": None, "n": 3, "x": 0.5},
        {"path": "a/b", "t": [1, 2]},
    ]
    assert out.startswith("[\n  {") and out.endswith("]\n")  # indented, one document

"""prefixlab.io: files appear whole or not at all, with the umask's permissions."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prefixlab.io import atomic_open, atomic_open_binary, atomic_path, atomic_write


@pytest.fixture
def umask() -> Iterator[Callable[[int], None]]:
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


def _write_each_way(target: Path) -> None:
    """Every writer of the module, one after another, on one target."""
    atomic_write(target, "a")
    with atomic_open(target) as fh:
        fh.write("b")
    with atomic_open_binary(target) as fb:
        fb.write(b"c")
    with atomic_path(target) as tmp:
        tmp.write_text("d", encoding="utf-8")


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_follow_the_umask(
    tmp_path: Path, umask: Callable[[int], None], mask: int
) -> None:
    umask(mask)
    for way in range(4):
        target = tmp_path / f"f{way}"
        if way == 0:
            atomic_write(target, b"x")
        elif way == 1:
            with atomic_open(target) as fh:
                fh.write("x")
        elif way == 2:
            with atomic_open_binary(target) as fb:
                fb.write(b"x")
        else:
            with atomic_path(target) as tmp:
                tmp.write_bytes(b"x")
        assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask, way
    _write_each_way(tmp_path / "again")
    assert (tmp_path / "again").read_text(encoding="utf-8") == "d"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "f0", "f1", "f2", "f3"]


def test_a_failed_write_leaves_the_target_as_it_was_and_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "kept.txt"
    target.write_text("old", encoding="utf-8")
    for way in range(3):
        with pytest.raises(KeyboardInterrupt):
            if way == 0:
                with atomic_open(target) as fh:
                    fh.write("half")
                    raise KeyboardInterrupt
            elif way == 1:
                with atomic_open_binary(target) as fb:
                    fb.write(b"half")
                    raise KeyboardInterrupt
            else:
                with atomic_path(target) as tmp:
                    tmp.write_text("half", encoding="utf-8")
                    raise KeyboardInterrupt
        assert target.read_text(encoding="utf-8") == "old"
        assert [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_writers_of_one_target_on_threads_never_share_a_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "shared.txt"
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for _ in range(50):
                atomic_write(target, f"{i}" * 1000)
        except BaseException as exc:  # pragma: no cover - what the test looks for
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    text = target.read_text(encoding="utf-8")
    assert len(text) == 1000 and len(set(text)) == 1  # one writer's whole file
    assert [p.name for p in tmp_path.iterdir()] == ["shared.txt"]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_files_the_cli_writes_follow_the_umask(
    tmp_path: Path, umask: Callable[[int], None], fmt: str
) -> None:
    """`trace generate` and `replay --per-request` (issue 19: both were 0600 whatever the
    umask)."""
    from typer.testing import CliRunner

    from prefixlab.cli.main import app

    runner = CliRunner()
    umask(0o022)
    trace = tmp_path / f"t.{fmt}"
    res = runner.invoke(
        app, ["trace", "generate", "sessions", "-o", str(trace), "--num-sessions", "5"]
    )
    assert res.exit_code == 0, res.output
    rows = tmp_path / "rows.csv"
    res = runner.invoke(
        app,
        [
            "replay",
            str(trace),
            "-p",
            "lru",
            "-p",
            "fifo",
            "--capacity-blocks",
            "2000",
            "--block-tokens",
            "16",
            "--per-request",
            str(rows),
        ],
    )
    assert res.exit_code == 0, res.output
    written = [trace, tmp_path / "rows.lru.csv", tmp_path / "rows.fifo.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p

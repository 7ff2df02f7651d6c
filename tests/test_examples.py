"""Every script in examples/ runs and prints exactly its checked-in output (issue 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.py") if "expected" not in p.parts)


def _expected(script: Path) -> Path:
    """examples/a/b.py -> examples/expected/a/b.txt"""
    rel = script.relative_to(ROOT / "examples").with_suffix(".txt")
    return ROOT / "examples" / "expected" / rel


def test_every_example_has_expected_output() -> None:
    assert EXAMPLES, "examples/ has no scripts"
    for script in EXAMPLES:
        assert _expected(script).is_file(), script.name


@pytest.mark.parametrize(
    "script", EXAMPLES, ids=[str(p.relative_to(ROOT / "examples")) for p in EXAMPLES]
)
def test_example_output(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "120", "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    expected = _expected(script).read_text()
    assert proc.stdout == expected

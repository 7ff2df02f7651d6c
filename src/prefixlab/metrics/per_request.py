"""Per-request results as CSV files (``--per-request``): one row per request with its hit
and input tokens, one file per policy, written whole or not at all."""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from prefixlab.errors import ConfigError
from prefixlab.io import temp_beside
from prefixlab.types import I64

if TYPE_CHECKING:
    from _csv import Writer


class PerRequestRun(Protocol):
    """What a finished run gives the per-request file: its policy and per-request tokens."""

    policy: str
    hit_tokens: I64
    input_tokens: I64


class PerRequestFiles:
    """Per-request CSVs (index,hit_tokens,input_tokens), one per policy: ``path`` itself
    for one policy, ``<stem>.<policy><suffix>`` beside it for several. Rows are written as
    they come (a streamed replay hands them a chunk at a time) to temp files beside their
    targets, renamed by :meth:`close` when the run is complete and removed by
    :meth:`abort` when it is not, so a failed run leaves no partial file."""

    def __init__(self, path: Path, specs: Sequence[str]) -> None:
        if not path.parent.resolve().is_dir():
            raise ConfigError(f"--per-request: folder {path.parent} does not exist")
        self.targets = [path]
        if len(specs) > 1:
            self.targets = []
            for spec in specs:
                safe = spec.replace(":", "_").replace(",", "_").replace("=", "-")
                self.targets.append(path.with_name(f"{path.stem}.{safe}{path.suffix or '.csv'}"))
        for target in self.targets:
            if target.is_dir():
                raise ConfigError(f"--per-request: {target} is a folder, not a file")
        self._tmps: list[Path] = []
        self._files: list[tuple[TextIO, Writer]] = []  # (file, its csv writer)
        try:
            for target in self.targets:
                fd, tmp = temp_beside(target)  # the umask's mode
                self._tmps.append(tmp)
                fh = os.fdopen(fd, "w", newline="")
                self._files.append((fh, csv.writer(fh)))
                self._files[-1][1].writerow(["index", "hit_tokens", "input_tokens"])
        except BaseException:
            self.abort()
            raise

    def rows(self, i: int, start: int, hits: I64, inputs: I64) -> None:
        """Policy i's rows for requests start, start + 1, ... (hit and input tokens)."""
        self._files[i][1].writerows(
            zip(range(start, start + len(hits)), hits.tolist(), inputs.tolist(), strict=True)
        )

    def close(self) -> list[Path]:
        """Every file complete: renamed to its target; returns the targets. If a rename
        fails, the temp files still there go (those already renamed stay complete)."""
        try:
            for fh, _ in self._files:
                fh.close()
            while self._tmps:
                os.replace(self._tmps[0], self.targets[len(self.targets) - len(self._tmps)])
                self._tmps.pop(0)
        except BaseException:
            self.abort()
            raise
        return list(self.targets)

    def abort(self) -> None:
        """The run failed: its temp files go."""
        for fh, _ in self._files:
            fh.close()
        for tmp in self._tmps:
            tmp.unlink(missing_ok=True)
        self._tmps = []


def write_per_request(path: Path, results: Sequence[PerRequestRun]) -> list[Path]:
    """Per-request CSVs of finished runs (one per policy)."""
    files = PerRequestFiles(path, [res.policy for res in results])
    try:
        for i, res in enumerate(results):
            files.rows(i, 0, res.hit_tokens, res.input_tokens)
    except BaseException:
        files.abort()
        raise
    return files.close()

"""The results store: a folder of finished cells, consolidated into tidy tables.

::

    RESULTS/
      config.resolved.json   the config, defaults filled in
      environment.json       Python, platform, package versions, CPU count
      cells/ID.json          one finished cell (written last, atomically: the resume marker)
      cells/ID.requests.parquet   per-request detail of that cell (--detail)
      results.parquet|csv    one row per (cell, policy, seed), columns run.COLUMNS
      breakdown.parquet|csv  hit ratio (and TTFT, prefill time) per task and input-length bin
      cdf.parquet|csv        TTFT and prefill-time quantiles per cell (engine runner)
      requests.parquet       every cell's per-request detail (--detail)
      timings.csv            wall-clock seconds and worker of each cell (not a result)

A cell file holds exact floats (JSON round-trips a float's repr), so the tables are the same
bit for bit whichever backend ran the cells. Rows are ordered by the plan, not by finish.
Results written before the TTFT rename read under today's names (:mod:`.schema`).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast, get_origin, get_type_hints

from prefixlab.configfile import ConfigModel
from prefixlab.errors import ConfigError
from prefixlab.experiments.run import COLUMNS, Cell, CellResult
from prefixlab.experiments.schema import select_list, upgrade_row, upgrade_table
from prefixlab.io import atomic_write, write_table
from prefixlab.types import JSON, Row

if TYPE_CHECKING:
    import pyarrow as pa

TABLES = ("results", "breakdown", "cdf", "requests")


class CellDoc(TypedDict):
    """What a prefix-cache cell file holds (:func:`read_cell` checks it)."""

    row: Row
    breakdown: list[Row]
    cdf: list[Row]
    wall_s: float
    worker: str


#: a cell file's document type (a TypedDict)
D = TypeVar("D", bound=Mapping[str, object])


def _field_kinds(doc_type: type[Mapping[str, object]]) -> dict[str, type | tuple[type, ...]]:
    """The JSON types of a cell document's fields (a number may be written as an integer)."""
    kinds: dict[str, type | tuple[type, ...]] = {}
    for key, hint in get_type_hints(doc_type).items():
        kind = get_origin(hint) or hint
        kinds[key] = (int, float) if kind is float else kind
    return kinds


def read_cell(path: Path, doc_type: type[D]) -> D:
    """A finished cell's JSON file, checked to hold the fields of ``doc_type`` (a
    TypedDict) with their JSON types: anything else (unreadable, not JSON, a field missing
    or of another type) is a ConfigError naming the file and what is wrong, with the way out
    (delete it: the cell reruns)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable cell result ({exc}); delete it to rerun") from None
    if not isinstance(doc, dict):
        what = f"a JSON {_json_kind(doc)}, not an object"
        raise ConfigError(f"{path}: not a cell result ({what}); delete it to rerun")
    for key, kind in _field_kinds(doc_type).items():
        if key not in doc:
            what = f"no {key!r}"
        elif not isinstance(doc[key], kind) or isinstance(doc[key], bool):
            what = f"{key!r} is a JSON {_json_kind(doc[key])}"
        else:
            continue
        raise ConfigError(f"{path}: not a cell result ({what}); delete it to rerun")
    return cast(D, doc)


def _json_kind(value: object) -> str:
    kinds = (
        (bool, "boolean"),
        (int, "number"),
        (float, "number"),
        (str, "string"),
        (list, "array"),
        (dict, "object"),
    )
    return next((name for t, name in kinds if isinstance(value, t)), "null")


def environment() -> dict[str, JSON]:
    """What ran the experiment (for the report)."""
    from importlib import metadata

    versions: dict[str, JSON] = {}
    for pkg in ("prefixlab", "numpy", "numba", "pyarrow", "matplotlib", "ray", "duckdb"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
    }


class CellStore:
    """A results folder of any study kind: the resolved config, the environment, one JSON
    file per finished cell (written last and atomically: the resume marker) and the tidy
    tables consolidated from them (Parquet and CSV, in plan order; ``timings.csv``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.cells_dir = self.folder / "cells"

    def prepare(self, config: ConfigModel) -> None:
        """Before a run: the folder, the resolved config and the environment."""
        self.cells_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.cells_dir.glob(".*.tmp"):  # left by a killed run: never a result
            stale.unlink(missing_ok=True)
        atomic_write(self.folder / "config.resolved.json", (config.to_json() + "\n").encode())
        env = json.dumps(environment(), indent=2, sort_keys=True) + "\n"
        atomic_write(self.folder / "environment.json", env.encode())

    def done(self) -> set[str]:
        """Ids of the finished cells."""
        if not self.cells_dir.is_dir():
            return set()
        return {p.name[: -len(".json")] for p in self.cells_dir.glob("*.json")}

    def write_cell(self, cell_id: str, doc: Mapping[str, object]) -> None:
        """A finished cell's JSON (exact floats: JSON keeps each float's repr)."""
        atomic_write(self.cells_dir / f"{cell_id}.json", json.dumps(doc).encode())

    def read_cell(self, cell_id: str, doc_type: type[D]) -> D:
        return read_cell(self.cells_dir / f"{cell_id}.json", doc_type)

    def write_tables(
        self, tables: Mapping[str, Sequence[Row]], timings: Sequence[Row]
    ) -> dict[str, Path]:
        """``NAME.parquet`` and ``NAME.csv`` for each table with rows (an empty one's files
        go), and ``timings.csv``; the Parquet paths written."""
        import pyarrow as pa

        written: dict[str, Path] = {}
        for name, recs in tables.items():
            path = self.folder / f"{name}.parquet"
            if not recs:
                path.unlink(missing_ok=True)
                (self.folder / f"{name}.csv").unlink(missing_ok=True)
                continue
            table = pa.Table.from_pylist(recs)
            write_table(table, path)
            write_table(table, self.folder / f"{name}.csv")
            written[name] = path
        write_table(pa.Table.from_pylist(timings), self.folder / "timings.csv")
        return written


class ResultsStore(CellStore):
    """One experiment's folder of results (per-request detail too, with ``--detail``)."""

    def done(self, detail: bool = False) -> set[str]:
        """Ids of the finished cells (with ``detail``: those that also kept per-request rows,
        so asking for detail later reruns the cells stored without it)."""
        ids = super().done()
        if detail:
            ids = {i for i in ids if (self.cells_dir / f"{i}.requests.parquet").is_file()}
        return ids

    def save(self, result: CellResult) -> None:
        """Write a finished cell: its detail first, then the JSON that marks it done."""
        if result.requests is not None:
            import pyarrow as pa

            path = self.cells_dir / f"{result.cell_id}.requests.parquet"
            write_table(pa.table(result.requests), path)
        doc: CellDoc = {
            "row": result.row,
            "breakdown": result.breakdown,
            "cdf": result.cdf,
            "wall_s": result.wall_s,
            "worker": result.worker,
        }
        self.write_cell(result.cell_id, doc)

    def load_cell(self, cell_id: str) -> CellDoc:
        """A finished cell, under today's latency names whenever it was written."""
        doc = self.read_cell(cell_id, CellDoc)
        doc["row"] = upgrade_row(doc["row"])
        doc["breakdown"] = [upgrade_row(r) for r in doc["breakdown"]]
        doc["cdf"] = [upgrade_row(r) for r in doc["cdf"]]
        return doc

    def consolidate(self, cells: Iterable[Cell]) -> dict[str, Path]:
        """Write the tidy tables from the cell files, in plan order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows: list[Row] = []
        breakdown: list[Row] = []
        cdf: list[Row] = []
        timings: list[Row] = []
        detail = []
        for cell in cells:
            doc = self.load_cell(cell.cell_id)
            rows.append({c: doc["row"].get(c) for c in COLUMNS})
            breakdown += doc["breakdown"]
            cdf += doc["cdf"]
            timings.append(
                {
                    "cell_id": cell.cell_id,
                    "label": cell.label(),
                    "wall_s": doc["wall_s"],
                    "worker": doc["worker"],
                }
            )
            req = self.cells_dir / f"{cell.cell_id}.requests.parquet"
            if req.is_file():
                t = upgrade_table(pq.read_table(req))
                keys = {k: doc["row"][k] for k in ("cell_id", "policy", "capacity", "seed")}
                for name, value in keys.items():
                    t = t.append_column(name, pa.array([value] * t.num_rows))
                detail.append(t)
        tables = {"results": rows, "breakdown": _aligned(breakdown), "cdf": _aligned(cdf)}
        written = self.write_tables(tables, timings)
        req_path = self.folder / "requests.parquet"
        if detail:
            write_table(pa.concat_tables(detail, promote_options="permissive"), req_path)
            written["requests"] = req_path
        else:
            req_path.unlink(missing_ok=True)
        return written


def _aligned(rows: list[Row]) -> list[Row]:
    """``rows`` with the union of their keys, in first-seen order (cells stored before a
    column existed lack it; a table's columns otherwise come from its first row alone)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]


def find_results(path: str | Path) -> Path:
    """The results folder for a path: the folder itself, or the folder of a results file."""
    p = Path(path)
    if p.is_file() and p.name.startswith("results."):
        p = p.parent
    if not (p / "results.parquet").is_file():
        raise ConfigError(f"{p}: no results.parquet here (run `prefixlab sweep` or `compare`)")
    return p


def read_table(path: str | Path, name: str = "results") -> pa.Table:
    """A pyarrow table of a results folder (``results``, ``breakdown``, ``cdf``, ``requests``)."""
    import pyarrow.parquet as pq

    if name not in TABLES:
        raise ConfigError(f"unknown table '{name}'; known: {', '.join(TABLES)}")
    folder = find_results(path)
    file = folder / f"{name}.parquet"
    if not file.is_file():
        hint = " (run with --detail)" if name == "requests" else ""
        raise ConfigError(f"{folder}: no {name} table{hint}")
    return upgrade_table(pq.read_table(file))


def read_json(folder: Path, name: str) -> dict[str, Any]:  # Any: a JSON document of any shape
    path = folder / name
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def query(results: Path | str, sql: str) -> tuple[list[tuple[object, ...]], list[str]]:
    """Rows and column names of ``sql`` run by DuckDB over a results folder."""
    try:
        import duckdb
    except ImportError:
        raise ConfigError("results query needs DuckDB: pip install 'prefixlab[query]'") from None
    folder = find_results(results)
    con = duckdb.connect()
    try:
        for name in TABLES:
            path = folder / f"{name}.parquet"
            if path.is_file():
                import pyarrow.parquet as pq

                quoted = str(path).replace("'", "''")
                cols = select_list(pq.read_schema(path).names)
                con.execute(f"create view {name} as select {cols} from read_parquet('{quoted}')")
        try:
            cur = con.execute(sql)
        except duckdb.Error as exc:
            first = str(exc).strip().splitlines()[0]
            missing = [t for t in TABLES if not (folder / f"{t}.parquet").is_file()]
            if missing and any(f"name {t} does not exist" in first for t in missing):
                first += (
                    f" (this folder has no {', '.join(missing)} table; requests needs --detail)"
                )
            if "qttft" in sql.lower():
                first += " (QTTFT is ttft_s now: arrival to first token; prefill_s starts at the"
                first += " first schedule)"
            raise ConfigError(f"query failed: {first}") from None
        names = [d[0] for d in cur.description] if cur.description else []
        return cur.fetchall(), names
    finally:
        con.close()

"""Expert-cache sweeps, their report and the ``prefixlab experts`` commands.

Every trace is tiny (4 layers x 4 experts x 200 tokens at most), so the sweeps take well under
a second each; the numbers checked come from :func:`prefixlab.experts.simulate.simulate` run
directly on the same generated trace, or are hand-computed (Belady on the thm33 cycle).
"""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import re
import shutil
import statistics
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner, Result

from prefixlab.cli.main import app
from prefixlab.errors import ConfigError
from prefixlab.experts.config import (
    ExpertCache,
    ExpertSweepConfig,
    ExpertWorkload,
    load_sweep_config,
    parse_sweep_config,
    resolve_capacities,
)
from prefixlab.experts.generators import generate
from prefixlab.experts.report import (
    MAX_SUMMARY_CAPACITIES,
    build_expert_report,
    load_expert_results,
    make_expert_figures,
)
from prefixlab.experts.simulate import simulate
from prefixlab.experts.sweep import plan, run_expert_sweep
from prefixlab.experts.trace import ExpertTrace
from prefixlab.experts.trace_io import load_expert_trace, load_trace, save_trace
from prefixlab.studies import kind_of
from tests.tables import table as table_of
from tests.tables import table_rows

runner = CliRunner()

ZIPF = {"num_layers": 4, "num_experts": 4, "num_tokens": 200}
POLICIES = ["lru", "llru", "opt", "lru-dist", "marking"]
#: 2 variants x 2 seeds; capacities resolve to 2, 8 ("0.5nl" of 16 pages), then 1, 3..7, 9..16
SWEEP: dict[str, Any] = {
    "name": "zipf-a",
    "workload": {"trace": "gen:zipf", "params": ZIPF, "vary": {"a": [0.5, 1.5]}},
    "cache": {"capacities": [2, "0.5nl", "all"], "policies": POLICIES},
    "seeds": [0, 1],
}
CAPACITY_ORDER = [2, 8, 1, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16]
CELL_IDS = ["0000-s0", "0000-s1", "0001-s0", "0001-s1"]
COLUMNS = [
    "variant",
    "a",
    "seed",
    "num_layers",
    "num_experts",
    "capacity_spec",
    "capacity",
    "policy",
    "num_requests",
    "num_faults",
    "num_first_use_faults",
    "fault_rate",
    "fault_ratio_to_opt",
]
PNG = b"\x89PNG\r\n\x1a\n"
EXPERT_POLICIES = ["fifo", "lfu", "llru", "lru", "lru-dist", "marking", "opt", "opt-dist"]


def _invoke(*args: str) -> Result:
    return runner.invoke(app, list(args))


def _assert_one_line_error(result: Result, *fragments: str) -> str:
    out = result.output.strip()
    assert result.exit_code == 2, out
    assert len(out.splitlines()) == 1, out
    assert out.startswith("error:"), out
    assert "Traceback" not in out
    for fragment in fragments:
        assert fragment in out, out
    return out


def _rows(folder: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(folder / "results.parquet").to_pylist()
    return rows


def _config(**changes: Any) -> dict[str, Any]:
    """SWEEP with ``workload`` / ``cache`` keys replaced (None removes a key)."""
    d = copy.deepcopy(SWEEP)
    for section in ("workload", "cache"):
        for k, v in changes.pop(section, {}).items():
            if v is None:
                d[section].pop(k, None)
            else:
                d[section][k] = v
    d.update(changes)
    return d


_TRACES: dict[tuple[float, int], ExpertTrace] = {}


def _zipf(a: float, seed: int) -> ExpertTrace:
    if (a, seed) not in _TRACES:
        _TRACES[a, seed] = generate("zipf", **ZIPF, a=a, seed=seed)
    return _TRACES[a, seed]


# ------------------------------------------------------------------------------ config
TOML = """\
name = "zipf-a"
seeds = [0, 3]

[workload]
trace = "gen:zipf"
params = { num_layers = 4, num_experts = 3, num_tokens = 20, shuffle = false }
vary = { a = [0.5, 1.5], r = [0.0, 0.3] }

[cache]
capacities = [5, "0.5nl", "all"]
policies = ["lru", "marking:seed=2", "opt-dist"]
"""

YAML = """\
name: zipf-a
seeds: [0, 3]
workload:
  trace: gen:zipf
  params: {num_layers: 4, num_experts: 3, num_tokens: 20, shuffle: false}
  vary: {a: [0.5, 1.5], r: [0.0, 0.3]}
cache:
  capacities: [5, 0.5nl, all]
  policies: [lru, "marking:seed=2", opt-dist]
"""


def test_toml_config_parses_into_variants_specs_and_cells(tmp_path: Path) -> None:
    path = tmp_path / "zipf.toml"
    path.write_text(TOML, encoding="utf-8")
    cfg = load_sweep_config(path)
    assert cfg == ExpertSweepConfig(
        workload=ExpertWorkload(
            trace="gen:zipf",
            params={"num_layers": 4, "num_experts": 3, "num_tokens": 20, "shuffle": False},
            vary={"a": [0.5, 1.5], "r": [0.0, 0.3]},
        ),
        cache=ExpertCache(
            capacities=[5, "0.5nl", "all"], policies=["lru", "marking:seed=2", "opt-dist"]
        ),
        seeds=[0, 3],
        name="zipf-a",
    )
    assert (cfg.trace, cfg.capacities, cfg.policies) == (
        "gen:zipf",
        [5, "0.5nl", "all"],
        ["lru", "marking:seed=2", "opt-dist"],
    )
    # the cross product: keys in config order, the last key varying fastest
    assert cfg.variants() == [
        {"a": 0.5, "r": 0.0},
        {"a": 0.5, "r": 0.3},
        {"a": 1.5, "r": 0.0},
        {"a": 1.5, "r": 0.3},
    ]
    spec = cfg.trace_spec({"a": 1.5, "r": 0.3}, 3)
    head = "gen:zipf:num_layers=4,num_experts=3,num_tokens=20,shuffle=false"
    assert spec == f"{head},a=1.5,r=0.3,seed=3"
    direct = generate(
        "zipf", num_layers=4, num_experts=3, num_tokens=20, shuffle=False, a=1.5, r=0.3, seed=3
    )
    assert load_expert_trace(spec).equals(direct)
    cells = plan(cfg)
    assert [c.cell_id for c in cells] == [
        "0000-s0",
        "0000-s3",
        "0001-s0",
        "0001-s3",
        "0002-s0",
        "0002-s3",
        "0003-s0",
        "0003-s3",
    ]
    assert cells[3].label() == "a=0.5,r=0.3" and cells[3].spec.endswith("a=0.5,r=0.3,seed=3")
    assert json.loads(cfg.to_json())["kind"] == "experts"
    # without a name the file's stem names the sweep
    path.write_text(TOML.replace('name = "zipf-a"\n', ""), encoding="utf-8")
    assert load_sweep_config(path).name == "zipf"


def test_yaml_config_equals_the_toml_one(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(TOML, encoding="utf-8")
    (tmp_path / "a.yaml").write_text(YAML, encoding="utf-8")
    assert load_sweep_config(tmp_path / "a.yaml") == load_sweep_config(tmp_path / "a.toml")
    (tmp_path / "b.yml").write_text(YAML.replace("[5, 0.5nl, all]", "[5, 0]"), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"cache\.capacities\[1\]: 0 is not"):
        load_sweep_config(tmp_path / "b.yml")


def test_a_file_trace_needs_no_params_and_every_seed_replays_it() -> None:
    cfg = parse_sweep_config(_config(workload={"trace": "t.npz", "params": None, "vary": None}))
    assert not cfg.is_generated() and cfg.variants() == [{}]
    assert [(c.cell_id, c.spec, c.label()) for c in plan(cfg)] == [
        ("0000-s0", "t.npz", "trace"),
        ("0000-s1", "t.npz", "trace"),
    ]


BAD_CONFIGS = [
    (_config(extra=1), "config key 'extra' unknown"),
    (_config(kind="sweep"), "kind: 'sweep' unknown; known: 'experts'"),
    (_config(workload={"parms": {}}), "workload.parms"),
    (_config(workload={"trace": None}), "workload.trace"),
    (_config(workload={"trace": "gen:zipf:a=1"}), "workload.trace"),
    (_config(workload={"params": {"a": [1]}}), "workload.params.a"),
    (_config(workload={"vary": {"a": 1.5}}), "workload.vary.a"),
    (_config(workload={"vary": {"a": []}}), "workload.vary.a"),
    (_config(workload={"trace": "t.npz", "vary": None}), "workload.params"),
    (_config(workload={"trace": "t.jsonl", "params": None}), "vary"),
    (_config(workload={"params": {**ZIPF, "seed": 3}}), "'seeds'"),
    (_config(workload={"vary": {"seed": [1, 2]}}), "'seeds'"),
    (_config(cache={"capacity": [4]}), "cache.capacity"),
    (_config(cache={"capacities": [0]}), "cache.capacities[0]: 0 is not"),
    (_config(cache={"capacities": [4, "2x"]}), "cache.capacities[1]: '2x' is not"),
    (_config(cache={"capacities": ["0nl"]}), "cache.capacities[0]: '0nl' is not"),
    (_config(cache={"capacities": [-3]}), "cache.capacities[0]: -3 is not"),
    (_config(cache={"capacities": [2.5]}), "cache.capacities[0]: 2.5 is not"),
    (_config(cache={"capacities": [True]}), "cache.capacities[0]: True is not"),
    (_config(cache={"capacities": []}), "cache.capacities"),
    (_config(cache={"policies": "lru"}), "cache.policies"),
    (_config(cache={"policies": ["lru", "nope"]}), "'nope'"),
    (_config(cache={"policies": ["marking:foo=1"]}), "'foo'"),
    (_config(seeds=["0"]), "seeds"),
    (_config(seeds=[0, -1]), "seeds"),
    (_config(seeds=[True]), "seeds"),
    (_config(seeds=3), "seeds"),
    (_config(seeds=[]), "seeds"),
]


@pytest.mark.parametrize(("data", "fragment"), BAD_CONFIGS)
def test_bad_config_raises_config_error_naming_the_key(data: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_sweep_config(data)
    assert fragment in str(info.value)


def test_unknown_policy_error_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"cache\.policies\[1\].*'nope'"):
        parse_sweep_config(_config(cache={"policies": ["lru", "nope"]}))


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"params": {**ZIPF, "bogus": 1}}, ("workload.params", "bogus")),
        ({"vary": {"bogus": [1, 2]}}, ("workload.vary", "bogus")),
        ({"trace": "gen:nope"}, ("workload.trace", "nope")),
    ],
)
def test_generator_parameters_are_checked_when_the_config_loads(
    changes: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_sweep_config(_config(workload=changes))
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize("changes", [{"seeds": [0, 0]}, {"cache": {"policies": ["lru", "lru"]}}])
def test_repeated_seeds_or_policies_are_refused_or_not_duplicated(
    changes: dict[str, Any], tmp_path: Path
) -> None:
    data = _config(
        workload={"params": {**ZIPF, "num_tokens": 10}, "vary": None},
        cache={"capacities": [4], "policies": ["lru"]},
        seeds=[0],
    )
    data = {**data, **{k: v for k, v in changes.items() if k != "cache"}}
    data["cache"].update(changes.get("cache", {}))
    try:
        cfg = parse_sweep_config(data)
    except ConfigError:
        return
    run_expert_sweep(cfg, tmp_path / "dup")
    keys = [(r["variant"], r["seed"], r["capacity"], r["policy"]) for r in _rows(tmp_path / "dup")]
    assert len(keys) == len(set(keys))


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_sweep_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.toml: bad TOML"):
        load_sweep_config(bad)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("workload: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad\.yaml: bad YAML"):
        load_sweep_config(bad_yaml)


def test_resolve_capacities_hand_computed() -> None:
    # l = 4, n = 3: 12 pages; 0.5nl = 6; "all" adds 1..12 except the 5 and 6 already listed
    assert resolve_capacities([5, "0.5nl", "all"], 4, 3) == [
        ("5", 5),
        ("0.5nl", 6),
        ("1", 1),
        ("2", 2),
        ("3", 3),
        ("4", 4),
        ("7", 7),
        ("8", 8),
        ("9", 9),
        ("10", 10),
        ("11", 11),
        ("12", 12),
    ]
    # the first label of a size is kept: 0.5nl = 6 = ".5nl"; 0.3nl = round(3.6) = 4
    assert resolve_capacities(["0.5nl", 6, ".5nl", "0.3nl"], 4, 3) == [("0.5nl", 6), ("0.3nl", 4)]
    assert resolve_capacities(["all", 3], 1, 3) == [("1", 1), ("2", 2), ("3", 3)]
    # a tiny fraction still gives one page
    assert resolve_capacities(["0.01nl"], 4, 3) == [("0.01nl", 1)]


# ------------------------------------------------------------------------------- sweep
@pytest.fixture(scope="module")
def zipf_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExpertSweepConfig, Path]:
    cfg = parse_sweep_config(SWEEP)
    folder = tmp_path_factory.mktemp("experts") / "zipf-a"
    summary = run_expert_sweep(cfg, folder)
    assert summary.ran == CELL_IDS and summary.skipped == []
    return cfg, folder


def _expected_keys() -> list[tuple[str, int, int, str]]:
    """(variant, seed, capacity, policy) in table order; lru-dist needs k >= l = 4."""
    return [
        (f"a={a}", seed, k, p)
        for a in (0.5, 1.5)
        for seed in (0, 1)
        for k in CAPACITY_ORDER
        for p in POLICIES
        if not (p == "lru-dist" and k < 4)
    ]


def test_sweep_rows_in_plan_order_with_config_names(
    zipf_sweep: tuple[ExpertSweepConfig, Path],
) -> None:
    _, folder = zipf_sweep
    rows = _rows(folder)
    assert len(rows) == 2 * 2 * (16 * 5 - 3) == 308
    assert list(rows[0]) == COLUMNS
    assert [(r["variant"], r["seed"], r["capacity"], r["policy"]) for r in rows] == (
        _expected_keys()
    )
    for r in rows:
        assert r["a"] == float(r["variant"][2:])
        assert r["capacity_spec"] == ("0.5nl" if r["capacity"] == 8 else str(r["capacity"]))
        assert (r["num_layers"], r["num_experts"], r["num_requests"]) == (4, 4, 800)
        assert r["fault_rate"] == r["num_faults"] / 800


def test_sweep_rows_equal_a_direct_simulation(zipf_sweep: tuple[ExpertSweepConfig, Path]) -> None:
    _, folder = zipf_sweep
    rows = _rows(folder)
    opt = {
        (r["variant"], r["seed"], r["capacity"]): r["num_faults"]
        for r in rows
        if r["policy"] == "opt"
    }
    for r in rows:
        trace = _zipf(r["a"], r["seed"])
        res = simulate(trace, capacity=r["capacity"], policy=r["policy"], seed=r["seed"])
        assert r["num_faults"] == res.num_faults, r
        assert r["num_first_use_faults"] == res.num_first_use_faults
        ratio = r["num_faults"] / opt[r["variant"], r["seed"], r["capacity"]]
        assert r["fault_ratio_to_opt"] == ratio
        if r["policy"] == "opt":
            assert r["fault_ratio_to_opt"] == 1.0
        if r["capacity"] == 16:  # every page fits: only first uses fault
            assert r["num_faults"] == r["num_first_use_faults"]


def test_sweep_folder_layout(zipf_sweep: tuple[ExpertSweepConfig, Path]) -> None:
    cfg, folder = zipf_sweep
    resolved = json.loads((folder / "config.resolved.json").read_text(encoding="utf-8"))
    assert resolved == json.loads(cfg.to_json()) and resolved["kind"] == "experts"
    assert json.loads((folder / "environment.json").read_text(encoding="utf-8"))
    assert sorted(p.stem for p in (folder / "cells").glob("*.json")) == CELL_IDS
    timings = (folder / "timings.csv").read_text(encoding="utf-8").splitlines()
    assert timings[0] == '"cell_id","label","wall_s","worker"'
    assert [line.split(",")[0].strip('"') for line in timings[1:]] == CELL_IDS
    assert len((folder / "results.csv").read_text(encoding="utf-8").splitlines()) == 309
    assert kind_of(folder).name == "experts"


def test_rerun_reuses_every_cell_and_rewrites_identical_tables(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    cfg, folder = zipf_sweep
    copy_dir = tmp_path / "copy"
    shutil.copytree(folder, copy_dir)
    summary = run_expert_sweep(cfg, copy_dir)
    assert summary.ran == [] and summary.skipped == CELL_IDS
    for name in ("results.csv", "timings.csv"):
        assert (copy_dir / name).read_bytes() == (folder / name).read_bytes()
    # a deleted cell and a corrupt one are run again, and nothing else
    (copy_dir / "cells" / "0000-s1.json").unlink()
    (copy_dir / "cells" / "0001-s0.json").write_text("{not json", encoding="utf-8")
    summary = run_expert_sweep(cfg, copy_dir)
    assert summary.ran == ["0000-s1", "0001-s0"] and summary.skipped == ["0000-s0", "0001-s1"]
    assert (copy_dir / "results.csv").read_bytes() == (folder / "results.csv").read_bytes()
    # JSON that is not a cell (it was an AttributeError or KeyError traceback) reruns too
    for cell, text in (("0000-s0", "[]"), ("0001-s1", "{}"), ("0000-s1", '{"rows": 1}')):
        (copy_dir / "cells" / f"{cell}.json").write_text(text, encoding="utf-8")
    summary = run_expert_sweep(cfg, copy_dir)
    assert summary.ran == ["0000-s0", "0000-s1", "0001-s1"]
    assert (copy_dir / "results.csv").read_bytes() == (folder / "results.csv").read_bytes()


def test_changed_policies_rerun_every_cell(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    _, folder = zipf_sweep
    copy_dir = tmp_path / "copy"
    shutil.copytree(folder, copy_dir)
    cfg = parse_sweep_config(_config(cache={"policies": ["opt", "lru"]}))
    summary = run_expert_sweep(cfg, copy_dir)
    assert summary.ran == CELL_IDS and summary.skipped == []
    rows = _rows(copy_dir)
    assert [r["policy"] for r in rows[:2]] == ["opt", "lru"] and len(rows) == 4 * 16 * 2
    old = {(r["variant"], r["seed"], r["capacity"], r["policy"]): r for r in _rows(folder)}
    for r in rows:
        assert r == old[r["variant"], r["seed"], r["capacity"], r["policy"]]
    # the same policies with different capacities also change the fingerprint
    cfg = parse_sweep_config(_config(cache={"policies": ["opt", "lru"], "capacities": [3]}))
    assert run_expert_sweep(cfg, copy_dir).ran == CELL_IDS
    assert {r["capacity"] for r in _rows(copy_dir)} == {3}


def test_two_jobs_give_the_same_results_as_one(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    cfg, folder = zipf_sweep
    summary = run_expert_sweep(cfg, tmp_path / "j2", jobs=2)
    assert sorted(summary.ran) == CELL_IDS
    assert (tmp_path / "j2" / "results.csv").read_bytes() == (folder / "results.csv").read_bytes()
    for jobs in (0, -1, True):
        with pytest.raises(ConfigError, match="--jobs"):
            run_expert_sweep(cfg, tmp_path / "bad", jobs=jobs)


def test_ray_gives_the_same_results_as_one_process(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    """An experts study runs on the executor every study kind shares, Ray included."""
    pytest.importorskip("ray")
    cfg, folder = zipf_sweep
    summary = run_expert_sweep(cfg, tmp_path / "ray", jobs=2, backend="ray")
    assert sorted(summary.ran) == CELL_IDS
    assert (tmp_path / "ray" / "results.csv").read_bytes() == (folder / "results.csv").read_bytes()
    workers = {
        row.split(",")[-1]
        for row in (tmp_path / "ray" / "timings.csv").read_text().splitlines()[1:]
    }
    assert workers and str(os.getpid()) not in " ".join(workers)  # Ray's workers ran them
    with pytest.raises(ConfigError, match="--address applies to --backend ray"):
        run_expert_sweep(cfg, tmp_path / "bad", address="auto")


NORMAL_SWEEP = """\
name = "normal"
policies = ["lru"]

[workload]
source = "gen:random-pool"
params = { output_ids = false, num_requests = 20 }

[cache]
capacities = [64]
block_tokens = 16
"""


def test_only_an_expert_sweeps_folder_is_of_the_experts_kind(tmp_path: Path) -> None:
    config = tmp_path / "normal.toml"
    config.write_text(NORMAL_SWEEP, encoding="utf-8")
    result = _invoke("sweep", str(config), "-o", str(tmp_path / "normal"), "--no-report", "-q")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "normal" / "config.resolved.json").is_file()
    assert kind_of(tmp_path / "normal").name == "experiment"
    assert kind_of(tmp_path / "missing").name == "experiment"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.resolved.json").write_text("{oops", encoding="utf-8")
    assert kind_of(broken).name == "experiment"  # its loader then says what is wrong


# ------------------------------------------------------------------------------ report
@pytest.fixture(scope="module")
def zipf_report(zipf_sweep: tuple[ExpertSweepConfig, Path]) -> tuple[Path, str]:
    _, folder = zipf_sweep
    path = build_expert_report(folder)
    assert path == folder / "report.html"
    return path, path.read_text(encoding="utf-8")


def _figure_ids(html: str) -> list[str]:
    return re.findall(r'<figure id="([^"]+)"', html)


def _embedded_png(html: str, figure_id: str) -> bytes:
    m = re.search(rf'<figure id="{figure_id}"><img src="data:image/png;base64,([^"]+)"', html)
    assert m is not None, figure_id
    return base64.b64decode(m.group(1))


def _summary_block(html: str, variant: str, spec: str) -> list[tuple[str, str, str, str]]:
    """(policy, faults, fault rate, faults / OPT) of one variant and capacity entry."""
    head = f'<tr class="first"><td rowspan="5">{variant}</td><td rowspan="5">{spec}</td>'
    start = html.index(head)
    end = html.find('<tr class="first">', start + 1)
    block = html[start : end if end >= 0 else html.index("</table>", start)]
    cells = r'<td class="num">([^<]+)</td>'
    return re.findall(rf"<td>([a-z-]+)</td>{cells}{cells}{cells}", block)


def test_report_has_the_summary_table_and_figures(zipf_report: tuple[Path, str]) -> None:
    _, html = zipf_report
    assert "<script" not in html
    assert _figure_ids(html) == ["experts-vs-capacity", "experts-vs-a"]
    for fid in ("experts-vs-capacity", "experts-vs-a"):
        assert _embedded_png(html, fid).startswith(PNG)
    # one block per variant and shown capacity entry (16 entries, at most 12 shown)
    assert html.count('<tr class="first">') == 2 * min(16, MAX_SUMMARY_CAPACITIES)
    block = _summary_block(html, "a=1.5", "2")
    assert [b[0] for b in block] == POLICIES
    for policy, faults, rate, ratio in block:
        if policy == "lru-dist":  # undefined below one page per layer
            continue
        runs = [simulate(_zipf(1.5, s), capacity=2, policy=policy, seed=s) for s in (0, 1)]
        opts = [simulate(_zipf(1.5, s), capacity=2, policy="opt").num_faults for s in (0, 1)]
        assert faults == f"{sum(r.num_faults for r in runs) / 2:,.0f}"
        assert rate == f"{sum(r.num_faults / 800 for r in runs) / 2:.4f}"
        mean_ratio = sum(r.num_faults / o for r, o in zip(runs, opts, strict=True)) / 2
        assert ratio == f"{mean_ratio:.3f}"
    assert block[2] == ("opt", block[2][1], block[2][2], "1.000")
    assert "&quot;kind&quot;: &quot;experts&quot;" in html  # the config section


def test_report_and_plot_commands_dispatch_to_the_experts_report(
    zipf_sweep: tuple[ExpertSweepConfig, Path], zipf_report: tuple[Path, str], tmp_path: Path
) -> None:
    _, folder = zipf_sweep
    path, html = zipf_report
    out = tmp_path / "again.html"
    result = _invoke("report", str(folder / "results.parquet"), "-o", str(out), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    # the same results give the same page, byte for byte
    assert out.read_bytes() == path.read_bytes()
    result = _invoke("plot", str(folder), "-o", str(tmp_path / "plots"))
    assert result.exit_code == 0, result.output
    printed = [Path(line) for line in result.stdout.split()]
    assert [p.name for p in printed] == ["experts-vs-capacity.png", "experts-vs-a.png"]
    for p in printed:
        assert p.read_bytes() == _embedded_png(html, p.stem)


HEATMAP: dict[str, Any] = {
    "name": "grid",
    "workload": {
        "trace": "gen:zipf",
        "params": {"num_tokens": 50},
        "vary": {"num_experts": [4, 8], "num_layers": [2, 4]},
    },
    "cache": {"capacities": ["0.5nl"], "policies": ["lru", "llru", "opt"]},
}


def test_two_varied_keys_draw_a_heatmap(tmp_path: Path) -> None:
    folder = tmp_path / "grid"
    run_expert_sweep(parse_sweep_config(HEATMAP), folder)
    rows = _rows(folder)
    assert {(r["num_experts"], r["num_layers"], r["capacity"]) for r in rows} == {
        (4, 2, 4),
        (4, 4, 8),
        (8, 2, 8),
        (8, 4, 16),
    }
    assert {r["capacity_spec"] for r in rows} == {"0.5nl"}
    html = build_expert_report(folder).read_text(encoding="utf-8")
    assert _figure_ids(html) == ["experts-vs-capacity", "experts-heatmap"]
    assert _embedded_png(html, "experts-heatmap").startswith(PNG)
    assert "num_experts=8,num_layers=4" in html


def test_report_of_an_opt_only_grid(tmp_path: Path) -> None:
    data = copy.deepcopy(HEATMAP)
    data["cache"]["policies"] = ["opt"]
    folder = tmp_path / "grid"
    run_expert_sweep(parse_sweep_config(data), folder)
    html = build_expert_report(folder).read_text(encoding="utf-8")
    assert "experts-vs-capacity" in _figure_ids(html)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
def test_heatmap_colour_scale_is_finite_with_an_undefined_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.axes import Axes

    data = copy.deepcopy(HEATMAP)
    data["cache"] = {"capacities": [1, 8], "policies": ["lru-dist", "lru"]}
    folder = tmp_path / "grid"
    run_expert_sweep(parse_sweep_config(data), folder)
    scales: list[Any] = []
    imshow = Axes.imshow

    def spy(self: Axes, *args: Any, **kwargs: Any) -> Any:
        scales.append(kwargs.get("vmax"))
        return imshow(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "imshow", spy)
    figures = make_expert_figures(load_expert_results(folder))
    assert [f.slug for f in figures] == ["experts-vs-capacity", "experts-heatmap"]
    assert len(scales) == 2 and all(math.isfinite(v) for v in scales), scales


# --------------------------------------------------------------------------------- CLI
def test_generate_writes_npz_and_jsonl_that_load_back(tmp_path: Path) -> None:
    params = ["num_layers=3", "num_experts=5", "num_tokens=30", "top_k=2", "seed=4"]
    direct = generate("zipf", num_layers=3, num_experts=5, num_tokens=30, top_k=2, seed=4)
    for name in ("g.npz", "g.jsonl"):
        result = _invoke("experts", "generate", "zipf", *params, "-o", str(tmp_path / name))
        assert result.exit_code == 0, result.output
        shown = {row[0]: row[1] for row in table_rows(result.stdout)}
        assert shown["num_requests"] == "180" and shown["top_k"] == "2"
        back = load_expert_trace(tmp_path / name)
        if name.endswith(".npz"):
            assert back.equals(direct)
        else:  # the routing format adds where it was read from to the meta
            assert back.equals(
                ExpertTrace(3, 5, direct.expert, direct.token_idx, direct.rank, meta=back.meta)
            )
            assert back.meta["spec"] == direct.meta["spec"]


def test_generate_and_info_errors_are_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "x.npz")
    _assert_one_line_error(_invoke("experts", "generate", "zipf", "foo", "-o", out), "'foo'")
    _assert_one_line_error(
        _invoke("experts", "generate", "zipf", "bogus=1", "-o", out), "no parameter 'bogus'"
    )
    _assert_one_line_error(_invoke("experts", "generate", "nope", "-o", out), "'nope'")
    _assert_one_line_error(_invoke("experts", "info", str(tmp_path / "none.npz")), "not found")
    assert not (tmp_path / "x.npz").exists()


def test_info_summarises_a_trace() -> None:
    spec = "gen:zipf:num_layers=3,num_experts=5,num_tokens=30,top_k=2"
    result = _invoke("experts", "info", spec)
    assert result.exit_code == 0, result.output
    shown = {row[0]: row[1] for row in table_rows(result.stdout)}
    assert (shown["num_layers"], shown["num_experts"], shown["num_requests"]) == ("3", "5", "180")
    result = _invoke("experts", "info", spec, "--top-k", "1")
    assert {row[0]: row[1] for row in table_rows(result.stdout)}["num_requests"] == "90"


SIM_SPEC = "gen:zipf:num_layers=3,num_experts=4,num_tokens=60,seed=2"


def _json_lines(result: Result) -> list[dict[str, Any]]:
    """The rows of ``--json``: one JSON list (the convention of every command)."""
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert isinstance(rows, list)
    return rows


def test_simulate_json_matches_simulate() -> None:
    args = ["-k", "3", "-k", "0.5nl", "-p", "lru", "-p", "marking", "-p", "opt-dist"]
    lines = _json_lines(_invoke("experts", "simulate", SIM_SPEC, *args, "--seed", "5", "--json"))
    trace = load_expert_trace(SIM_SPEC)
    # 0.5nl of 3 x 4 pages = 6
    assert [(d["capacity"], d["policy"]) for d in lines] == [
        (3, "lru"),
        (3, "marking:seed=5"),
        (3, "opt-dist"),
        (6, "lru"),
        (6, "marking:seed=5"),
        (6, "opt-dist"),
    ]
    for d in lines:
        assert set(d) >= {"policy", "capacity", "num_requests", "num_faults", "fault_ratio_to_opt"}
        res = simulate(trace, capacity=d["capacity"], policy=d["policy"].split(":")[0], seed=5)
        opt = simulate(trace, capacity=d["capacity"], policy="opt").num_faults
        assert d["policy"] == res.policy
        assert (d["num_requests"], d["num_faults"]) == (180, res.num_faults)
        assert d["num_first_use_faults"] == res.num_first_use_faults
        assert d["fault_ratio_to_opt"] == res.num_faults / opt


def test_simulate_all_capacities_and_default_policies() -> None:
    spec = "gen:zipf:num_layers=2,num_experts=3,num_tokens=40"
    lines = _json_lines(_invoke("experts", "simulate", spec, "-k", "all", "-p", "lru", "--json"))
    assert [d["capacity"] for d in lines] == [1, 2, 3, 4, 5, 6]
    faults = [d["num_faults"] for d in lines]
    assert faults[0] == 80  # one page, and consecutive requests are in different layers
    assert faults == sorted(faults, reverse=True)  # LRU is a stack algorithm
    assert faults[-1] == lines[-1]["num_first_use_faults"]  # all 6 pages fit
    # repeated sizes are simulated once; without -p the policies are lru and llru
    lines = _json_lines(_invoke("experts", "simulate", spec, "-k", "3", "-k", "0.5nl", "--json"))
    assert [(d["capacity"], d["policy"]) for d in lines] == [(3, "lru"), (3, "llru")]


def test_simulate_table_shows_the_same_numbers() -> None:
    result = _invoke("experts", "simulate", SIM_SPEC, "-k", "6", "-p", "lru", "-p", "opt")
    assert result.exit_code == 0, result.output
    trace = load_expert_trace(SIM_SPEC)
    lru, opt = (simulate(trace, capacity=6, policy=p).num_faults for p in ("lru", "opt"))
    body = table_rows(result.stdout)
    assert [row[:3] for row in body] == [["lru", "6", str(lru)], ["opt", "6", str(opt)]]
    assert body[0][5] == f"{lru / opt:.3f}" and body[1][5] == "1.000"
    assert "3 layers x 4 experts, 180 requests" in result.stdout


def test_simulate_leaves_out_dist_policies_below_one_page_per_layer() -> None:
    # sweep_capacities skips a -dist policy at k < l (undefined there): no row, no error
    spec = "gen:zipf:num_layers=4,num_experts=4,num_tokens=50"
    args = ["-k", "2", "-k", "8", "-p", "lru-dist", "-p", "lru", "--json"]
    lines = _json_lines(_invoke("experts", "simulate", spec, *args))
    shown = [(d["capacity"], d["policy"]) for d in lines]
    assert shown == [(2, "lru"), (8, "lru-dist"), (8, "lru")]


def test_simulate_with_no_defined_result_is_an_error() -> None:
    spec = "gen:zipf:num_layers=4,num_experts=4,num_tokens=50"
    result = _invoke("experts", "simulate", spec, "-k", "2", "-p", "lru-dist", "--json")
    _assert_one_line_error(result, "lru-dist", "2")


def test_simulate_bad_inputs_exit_2_with_one_line(tmp_path: Path) -> None:
    spec = "gen:zipf:num_layers=2,num_experts=2,num_tokens=5"
    cases = [
        (["-k", "2", "-p", "nope"], ("unknown expert policy 'nope'",)),
        (["-k", "2", "-p", "marking:seed=x"], ("marking:seed=x",)),
        (["-k", "0"], ("--capacity: 0 is not",)),
        (["-k", "2x"], ("--capacity: '2x' is not",)),
        (["-k", "0nl"], ("--capacity: '0nl' is not",)),
        (["-k", "-3"], ("--capacity: -3 is not",)),
        (["-k", "2", "--top-k", "2"], ("top_k",)),
    ]
    for args, fragments in cases:
        _assert_one_line_error(_invoke("experts", "simulate", spec, *args), *fragments)
    for name in ("none.jsonl", "none.npz"):
        missing = str(tmp_path / name)
        _assert_one_line_error(_invoke("experts", "simulate", missing, "-k", "2"), "not found")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"token_idx": 0, "layer": 0, "experts": [1]}\n'
        '{"token_idx": 0, "layer": 1, "experts": "x"}\n',
        encoding="utf-8",
    )
    _assert_one_line_error(
        _invoke("experts", "simulate", str(bad), "-k", "2"), f"{bad}:2", "'experts'"
    )


def test_thm33_makes_lru_fault_on_every_request(tmp_path: Path) -> None:
    out = tmp_path / "thm33.npz"
    result = _invoke("experts", "generate", "thm33", "k=7", "l=4", "num_cycles=20", "-o", str(out))
    assert result.exit_code == 0, result.output
    args = ["-k", "7", "-p", "lru", "-p", "opt", "--json"]
    lru, opt = _json_lines(_invoke("experts", "simulate", str(out), *args))
    # the k + 1 = 8 pages requested in turn, 20 times: 160 requests
    assert lru["policy"] == "lru" and lru["num_faults"] == lru["num_requests"] == 160
    # Belady: 7 first faults fill the cache, then one fault every k = 7 requests
    # (at t = 7, 14, ..., 154): 7 + 22 = 29
    assert opt["policy"] == "opt" and opt["num_faults"] == 29
    assert lru["fault_ratio_to_opt"] == 160 / 29


def test_policies_lists_every_registered_policy() -> None:
    from prefixlab.experts.policies import registered

    result = _invoke("experts", "policies")
    assert result.exit_code == 0, result.output
    body = table_rows(result.stdout)
    assert sorted(row[0] for row in body) == EXPERT_POLICIES == sorted(registered())
    assert all(row[1] for row in body)


SWEEP_TOML = """\
name = "file-sweep"
seeds = [0, 1]

[workload]
trace = "{trace}"

[cache]
capacities = [3, "0.5nl"]
policies = ["lru", "marking"]
"""


def test_prefixlab_sweep_runs_an_experts_config_and_experts_sweep_is_its_alias(
    tmp_path: Path,
) -> None:
    """One sweep command for every study kind: an experts config (told by its workload's
    ``trace``, or by ``kind = "experts"``) runs the expert-cache study."""
    trace_path = tmp_path / "t.npz"
    save_trace(generate("zipf", num_layers=3, num_experts=4, num_tokens=40, seed=7), trace_path)
    config = tmp_path / "file.toml"
    config.write_text(SWEEP_TOML.format(trace=trace_path), encoding="utf-8")
    new = _invoke("sweep", str(config), "-o", str(tmp_path / "new"), "--no-report")
    old = _invoke("experts", "sweep", str(config), "-o", str(tmp_path / "old"), "--no-report")
    assert new.exit_code == old.exit_code == 0, new.output + old.output
    assert "note: 'prefixlab experts sweep' is 'prefixlab sweep' on an experts config" in (
        old.stderr
    )
    assert "note:" not in new.stderr
    assert table_rows(new.stdout) == table_rows(old.stdout) and table_rows(new.stdout)
    assert _rows(tmp_path / "new") == _rows(tmp_path / "old")  # no timing column
    # --quiet prints the results folder only, as for an experiment; the cells are reused
    quiet = _invoke("sweep", str(config), "-o", str(tmp_path / "new"), "-q", "--no-report")
    assert quiet.exit_code == 0 and quiet.stdout.strip() == str(tmp_path / "new")
    # the kind said outright; an experiment-only option is one line
    config.write_text('kind = "experts"\n' + SWEEP_TOML.format(trace=trace_path), "utf-8")
    again = _invoke("sweep", str(config), "-o", str(tmp_path / "new"), "-q", "--no-report")
    assert again.exit_code == 0, again.output
    _assert_one_line_error(
        _invoke("sweep", str(config), "--detail"), "an experts study has no per-request rows"
    )
    config.write_text('kind = "fleet"\n', "utf-8")
    _assert_one_line_error(
        _invoke("sweep", str(config)), "unknown config kind 'fleet'; known: experiment, experts"
    )


def test_experts_sweep_command_on_a_file_trace(tmp_path: Path) -> None:
    trace_path = tmp_path / "t.npz"
    save_trace(generate("zipf", num_layers=3, num_experts=4, num_tokens=40, seed=7), trace_path)
    config = tmp_path / "file.toml"
    config.write_text(SWEEP_TOML.format(trace=trace_path), encoding="utf-8")
    folder = tmp_path / "out"
    result = _invoke("experts", "sweep", str(config), "-o", str(folder), "--no-report")
    assert result.exit_code == 0, result.output
    assert "2 cells: 2 run, 0 already done" in result.stdout
    assert f"results: {folder}/results.parquet" in result.stdout
    assert not (folder / "report.html").exists()
    rows = _rows(folder)
    assert [(r["seed"], r["capacity_spec"], r["capacity"], r["policy"]) for r in rows] == [
        (s, spec, k, p)
        for s in (0, 1)
        for spec, k in (("3", 3), ("0.5nl", 6))
        for p in ("lru", "marking")
    ]
    trace = load_trace(trace_path)
    for r in rows:
        assert r["variant"] == "trace"
        res = simulate(trace, capacity=r["capacity"], policy=r["policy"], seed=r["seed"])
        assert r["num_faults"] == res.num_faults
    # the printed table: faults / OPT per capacity entry and policy, mean and sd over seeds
    shown = {(r["k"], r["policy"]): r for r in table_of(result.stdout)}
    assert list(shown) == [(k, p) for k in ("3", "0.5nl") for p in ("lru", "marking")]
    lru6 = [r["fault_ratio_to_opt"] for r in rows if r["capacity"] == 6 and r["policy"] == "lru"]
    assert shown["0.5nl", "lru"]["faults/OPT"] == f"{statistics.mean(lru6):.4f}"
    assert shown["0.5nl", "lru"]["± sd"] == f"{statistics.stdev(lru6):.4f}"
    rate = [r["fault_rate"] for r in rows if r["capacity"] == 3 and r["policy"] == "marking"]
    assert shown["3", "marking"]["fault rate"] == f"{statistics.mean(rate):.4f}"
    # a second run reuses both cells, and writes the report this time
    result = _invoke("experts", "sweep", str(config), "-o", str(folder), "-j", "2")
    assert result.exit_code == 0, result.output
    assert "2 cells: 0 run, 2 already done" in result.stdout
    assert f"report:  {folder / 'report.html'}" in result.stdout
    # -q prints the folder only, as `prefixlab sweep -q`
    result = _invoke("experts", "sweep", str(config), "-o", str(folder), "-q", "--no-report")
    assert result.exit_code == 0 and result.stdout.strip() == str(folder)
    assert _figure_ids((folder / "report.html").read_text(encoding="utf-8")) == [
        "experts-vs-capacity"
    ]


def test_experts_sweep_command_errors_are_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(SWEEP_TOML.format(trace="t.npz").replace("[3,", "[0,"), encoding="utf-8")
    _assert_one_line_error(_invoke("experts", "sweep", str(config)), "cache.capacities[0]")
    _assert_one_line_error(
        _invoke("experts", "sweep", str(tmp_path / "none.toml")), "config file not found"
    )
    good = tmp_path / "good.toml"
    good.write_text(SWEEP_TOML.format(trace=tmp_path / "none.npz"), encoding="utf-8")
    out = str(tmp_path / "out")
    _assert_one_line_error(_invoke("experts", "sweep", str(good), "-o", out, "-j", "0"), "--jobs")
    _assert_one_line_error(_invoke("experts", "sweep", str(good), "-o", out), "not found")


def test_experts_sweep_with_no_feasible_row_fails_cleanly(tmp_path: Path) -> None:
    data = {
        "workload": {"trace": "gen:zipf", "params": {**ZIPF, "num_tokens": 20}},
        "cache": {"capacities": [2], "policies": ["lru-dist"]},
    }
    config = tmp_path / "dist.yaml"
    config.write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML
    result = _invoke("experts", "sweep", str(config), "-o", str(tmp_path / "out"), "-q")
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code != 0:
        _assert_one_line_error(result)


# ------------------------------------------------------------------------------ record
TINY_MIXTRAL = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "initializer_range": 0.3,
    "eos_token_id": None,
    "bos_token_id": None,
    "pad_token_id": None,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def test_record_command_writes_a_routing_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        import torch
        import transformers
    except ImportError as exc:  # CI installs the moe extra and sets PREFIXLAB_REQUIRE_ST
        if os.environ.get("PREFIXLAB_REQUIRE_ST"):
            raise AssertionError(f"PREFIXLAB_REQUIRE_ST is set but {exc}") from None
        pytest.skip(f"needs torch and transformers ({exc})")
    from prefixlab.experts.record import record_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model_dir = tmp_path / "mixtral"
    config = transformers.MixtralConfig(**TINY_MIXTRAL)
    transformers.MixtralForCausalLM(config).save_pretrained(model_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hi\nexpert caching\n", encoding="utf-8")
    out = tmp_path / "routing.jsonl"
    opts = ["--tokenizer", "bytes", "--top-k", "1", "--max-new-tokens", "1", "--batch-size", "2"]
    result = _invoke(
        "experts",
        "record",
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts),
        "-o",
        str(out),
        *opts,
    )
    assert result.exit_code == 0, result.output
    num_tokens = len("hi") + len("expert caching") + 2 * 1
    assert (
        f"{out}: 2 prompts, {num_tokens} tokens, 3 MoE layers x 4 experts, top-1, "
        f"{num_tokens * 3} routing lines"
    ) in result.stdout
    trace = load_expert_trace(out)
    assert (trace.num_layers, trace.num_experts, trace.top_k) == (3, 4, 1)
    assert (trace.num_tokens, trace.num_requests) == (num_tokens, num_tokens * 3)
    # the command passes its options through: the library call writes the same bytes
    direct = tmp_path / "direct.jsonl"
    record_file(
        str(model_dir), prompts, direct, tokenizer="bytes", top_k=1, max_new_tokens=1, batch_size=2
    )
    assert out.read_bytes() == direct.read_bytes()
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["--model", str(empty), "--prompts", str(prompts), "-o", str(tmp_path / "x.jsonl")]
    result = _invoke("experts", "record", *args, "--tokenizer", "bytes")
    _assert_one_line_error(result, "could not load model")


def test_an_expert_sweep_into_a_folder_being_written_is_refused(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    """The expert sweep takes the same folder lock as the prefix-cache sweep (flock: a
    second open of the lock file conflicts even within one process)."""
    from prefixlab.io import folder_lock

    cfg, folder = zipf_sweep
    copy_dir = tmp_path / "copy"
    shutil.copytree(folder, copy_dir)
    with folder_lock(copy_dir), pytest.raises(ConfigError, match="another sweep is writing"):
        run_expert_sweep(cfg, copy_dir)
    assert run_expert_sweep(cfg, copy_dir).skipped == CELL_IDS  # free again: it resumes


def test_a_folder_with_the_flat_config_of_before_still_reports(
    zipf_sweep: tuple[ExpertSweepConfig, Path], tmp_path: Path
) -> None:
    """Folders written before 2026-11-27 hold config.resolved.json flat (trace, capacities,
    policies, params, vary at the top); the report reads both forms alike."""
    _, folder = zipf_sweep
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    nested = json.loads((folder / "config.resolved.json").read_text(encoding="utf-8"))
    workload, cache = nested.pop("workload"), nested.pop("cache")
    flat = {**nested, **workload, **cache}
    assert "policies" in flat and "workload" not in flat
    (old / "config.resolved.json").write_text(json.dumps(flat), encoding="utf-8")
    a, b = load_expert_results(folder), load_expert_results(old)
    assert (a.policies, a.vary, a.seeds) == (b.policies, b.vary, b.seeds)
    assert a.policies == POLICIES and list(a.vary) == ["a"]

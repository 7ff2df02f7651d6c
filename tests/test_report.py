"""The report layer: figures per runner, deterministic PNGs, the interpolation, the HTML
page (self-contained, escaped), the CLI's one-line errors, and a real headless Chromium."""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from prefixlab.cli.report import register
from prefixlab.experiments.config import parse_config
from prefixlab.experiments.store import read_table
from prefixlab.experiments.sweep import run_sweep
from prefixlab.report import FigureSpec, build_report, load_results, make_figures
from prefixlab.report.plots import evenly, size_for_target

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = {
    "name": "llama-3.1-8b",
    "gpu": "h100",
    "timing": ["power:preset=llama-3.1-8b-h100", "tpot:s=0.02"],
}
CONFIGS = {
    "engine": {
        "name": "engine-small",
        "workload": {"source": "gen:mix", "params": {"trace": 2, "num_requests": 60}},
        "model": MODEL,
        "cache": {"capacities": ["0.3ws", "0.6ws"]},
        "runner": {"kind": "engine"},
        "policies": ["lru", "fifo"],
        "seeds": [0, 1],
    },
    "replay": {
        # a name to escape: it reaches the page's <title> and <h1>
        "name": 'replay <i>&"small"',
        "workload": {"source": "gen:mix", "params": {"trace": 2, "num_requests": 120}},
        "model": {"name": "llama-3.1-8b"},
        "cache": {"capacities": ["0.3ws", "0.5ws", "0.8ws"]},
        "policies": ["lru", "fifo"],
        "seeds": [0],
    },
    "pool": {
        # the hash-table experiment: hit ratio vs pool probability at one cache size; blocks
        # of 4 tokens, since a 15-token prompt never fills a block of 16
        "name": "pool",
        "workload": {
            "source": "gen:random-pool",
            "params": {"num_requests": 200},
            "vary": {"p": [0.2, 0.6, 1.0]},
        },
        "cache": {"capacities": [40], "block_tokens": 4},
        "policies": ["lru", "fifo"],
        "seeds": [0],
    },
    "pool-sizes": {  # several variants and several sizes: one panel per variant
        "name": "pool-sizes",
        "workload": {
            "source": "gen:random-pool",
            "params": {"num_requests": 200},
            "vary": {"p": [0.2, 0.6, 1.0]},
        },
        "cache": {"capacities": [10, 40], "block_tokens": 4},
        "policies": ["lru", "fifo"],
        "seeds": [0],
    },
}
SLUGS = {
    "engine": [
        "hit_vs_capacity",
        "ttft_cdf",
        "p95_ttft",
        "hit_by_task",
        "hit_by_length",
        "size_for_target",
    ],
    "replay": ["hit_vs_capacity", "hit_by_task", "hit_by_length", "size_for_target"],
    # one capacity (no sizes for a target), every prompt 15 tokens (one length bin)
    "pool": ["hit_vs_capacity", "hit_by_task"],
    "pool-sizes": ["hit_vs_capacity", "hit_by_task", "size_for_target"],
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("results")
    for kind, cfg in CONFIGS.items():
        run_sweep(parse_config(cfg), root / kind, jobs=1)
    return {kind: root / kind for kind in CONFIGS}


@pytest.fixture(scope="module")
def figures(folders: dict[str, Path]) -> dict[str, list[FigureSpec]]:
    return {kind: make_figures(folder) for kind, folder in folders.items()}


@pytest.fixture(scope="module")
def engine_report(folders: dict[str, Path]) -> Path:
    return build_report(folders["engine"])


# ------------------------------------------------------------------ figures
@pytest.mark.parametrize("kind", list(SLUGS))
def test_figure_slugs_per_runner(kind: str, figures: dict[str, list[FigureSpec]]) -> None:
    figs = figures[kind]
    assert [f.slug for f in figs] == SLUGS[kind]
    for f in figs:
        assert f.png.startswith(PNG_MAGIC) and len(f.png) > 5_000
        assert f.title and f.caption


def test_variant_axis_is_the_numeric_key(figures: dict[str, list[FigureSpec]]) -> None:
    hit = figures["pool"][0]
    assert hit.title == "Token hit ratio vs p"
    assert "40 blocks" in hit.caption
    assert figures["pool-sizes"][0].title == "Token hit ratio vs cache size"


def test_png_bytes_identical_across_calls(
    folders: dict[str, Path], figures: dict[str, list[FigureSpec]]
) -> None:
    again = make_figures(folders["engine"])
    assert [f.png for f in again] == [f.png for f in figures["engine"]]


def test_size_for_target_hand_computed() -> None:
    sizes, hits = [100, 200, 400], [0.2, 0.5, 0.4]  # made monotone: 0.2, 0.5, 0.5
    # between (100, 0.2) and (200, 0.5): 100 + (0.35 - 0.2) / 0.3 * 100
    assert size_for_target(sizes, hits, 0.35) == pytest.approx(150.0)
    # below the smallest size, from (0, 0): 0.1 / 0.2 * 100
    assert size_for_target(sizes, hits, 0.1) == pytest.approx(50.0)
    assert size_for_target(sizes, hits, 0.5) == pytest.approx(200.0)  # first size reaching it
    assert size_for_target(sizes, hits, 0.51) is None  # the dip at 400 does not count
    # a dip then a rise: (400, 0.4) counts as 0.5, so 0.55 lies between (400, 0.5) and
    # (800, 0.6): 400 + 0.05 / 0.1 * 400 (without the running max it would read 700)
    assert size_for_target([*sizes, 800], [*hits, 0.6], 0.55) == pytest.approx(600.0)
    assert size_for_target(sizes, hits, 0.0) == 0.0
    # order of the points does not matter: (1000, 0.3) -> (3000, 0.7), target 0.6
    assert size_for_target([3000, 1000], [0.7, 0.3], 0.6) == pytest.approx(2500.0)


def test_evenly_keeps_first_and_last() -> None:
    assert evenly(3, 4) == [0, 1, 2]
    assert evenly(10, 4) == [0, 3, 6, 9]
    assert evenly(7, 1) == [0]


def test_results_mean_over_seeds(folders: dict[str, Path]) -> None:
    res = load_results(folders["engine"])
    assert res.runner == "engine" and res.seeds == (0, 1) and res.policies == ("lru", "fifo")
    rows = read_table(folders["engine"]).to_pylist()
    pick = [r for r in rows if r["capacity_index"] == 1 and r["policy"] == "fifo"]
    assert len(pick) == 2
    stat = res.stat("token_hit_ratio")[("", 1, 1)]
    hits = [r["token_hit_ratio"] for r in pick]
    assert stat.mean == pytest.approx(sum(hits) / 2)
    assert (stat.low, stat.high, stat.num_seeds) == (min(hits), max(hits), 2)
    assert res.blocks("", 1) == pytest.approx(sum(r["capacity_blocks"] for r in pick) / 2)
    assert math.isnan(load_results(folders["replay"]).stat("p95_ttft_s")[("", 0, 0)].mean)


# ------------------------------------------------------------------ HTML
def test_html_is_self_contained(
    engine_report: Path, folders: dict[str, Path], figures: dict[str, list[FigureSpec]]
) -> None:
    assert engine_report == folders["engine"] / "report.html"
    page = engine_report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    links = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", page, flags=re.I)
    assert links and all(link.startswith("data:image/png;base64,") for link in links)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    import base64

    for f in figures["engine"]:
        assert base64.b64encode(f.png).decode() in page
        assert html.escape(f.caption) in page
    assert page.count("<img ") == len(figures["engine"])
    config = json.loads((folders["engine"] / "config.resolved.json").read_text())
    assert html.escape(json.dumps(config, indent=2, sort_keys=True)) in page
    assert "Mean TTFT (ms)" in page and "Throughput (tok/s)" in page
    assert not list(folders["engine"].glob(".report.html.*"))  # no temp file left behind
    probe = folders["engine"] / "probe.txt"  # the page gets the mode of any new file
    probe.write_text("x")
    assert engine_report.stat().st_mode == probe.stat().st_mode
    probe.unlink()


def test_html_bolds_the_best_per_capacity(engine_report: Path, folders: dict[str, Path]) -> None:
    page = engine_report.read_text(encoding="utf-8")
    stat = load_results(folders["engine"]).stat("token_hit_ratio")
    for ci in range(2):
        best = max(stat[("", ci, pi)].mean for pi in range(2))
        assert f"<strong>{best:.1%}</strong>" in page


def test_html_escapes_and_drops_engine_columns(folders: dict[str, Path], tmp_path: Path) -> None:
    out = build_report(folders["replay"], tmp_path / "sub" / "r.html")
    page = out.read_text(encoding="utf-8")
    assert "<i>" not in page and "replay &lt;i&gt;&amp;&quot;small&quot;" in page
    assert "TTFT" not in page.split("<h2>Figures</h2>")[0]
    assert "FLOPs saved" in page  # the replay config names a model


# ------------------------------------------------------------------ CLI
@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _run(app: typer.Typer, *args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("command", ["report", "plot"])
def test_cli_errors_are_one_line(cli: typer.Typer, command: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "results.parquet").write_bytes(b"not parquet")
    cases = [
        (tmp_path / "missing", "no results.parquet"),
        (tmp_path, "no results.parquet"),
        (broken, "unreadable"),
    ]
    for path, message in cases:
        code, stdout, stderr = _run(cli, command, str(path))
        assert code == 2, stdout + stderr
        assert stderr.startswith("error:") and stderr.strip().count("\n") == 0, stderr
        assert message in stderr and "Traceback" not in stdout + stderr


def test_cli_report_and_plot(cli: typer.Typer, folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    code, stdout, _ = _run(cli, "report", str(folders["pool"]), "-o", str(out), "--quiet")
    assert code == 0 and stdout == f"{out}\n" and out.is_file()
    code, stdout, _ = _run(cli, "plot", str(folders["pool"]), "-o", str(tmp_path / "png"))
    assert code == 0
    assert stdout.split() == [str(tmp_path / "png" / f"{s}.png") for s in SLUGS["pool"]]
    assert all(Path(p).read_bytes().startswith(PNG_MAGIC) for p in stdout.split())


# ------------------------------------------------------------------ a real browser
def _chromium() -> str | None:
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def test_report_renders_in_headless_chromium(
    engine_report: Path, figures: dict[str, list[FigureSpec]], tmp_path: Path
) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium executable (/usr/bin/chromium or on PATH)")
    args = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
    ]
    errors: list[str] = []
    requests: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=args)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(engine_report.as_uri(), wait_until="load")
            images = page.evaluate(
                """() => Array.from(document.images).map(img => {
                    const box = img.getBoundingClientRect();
                    return {ok: img.complete && img.naturalWidth > 0,
                            area: box.width * box.height, alt: img.alt};
                })"""
            )
            shot = tmp_path / "report.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert len(images) == len(figures["engine"])
    assert all(img["ok"] and img["area"] > 0 and img["alt"] for img in images), images
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 50_000
    assert errors == []
    # self-contained: the page and its inline images only, nothing fetched from elsewhere
    assert all(u.startswith(("file:", "data:")) for u in requests), requests

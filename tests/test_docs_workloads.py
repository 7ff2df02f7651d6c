"""docs/workloads (a page per loader and generator) and docs/engine.md: every example runs.

The commands are read from the pages' ``bash`` blocks and run through the CLI in a scratch
folder (``../shared/`` and ``docs/`` paths resolved to this checkout), so a page cannot drift
from the code. Figures the pages quote are checked where they are cheap to recompute.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefixlab.analysis import session_prefix_share, trace_stats
from prefixlab.cli.main import app
from prefixlab.workload.generators import GENERATORS
from prefixlab.workload.loaders import LOADERS, load_trace

from .conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "workloads"


def _commands(page: Path) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if line.strip().startswith("prefixlab ")
    ]


def _resolve(arg: str) -> str:
    if arg.startswith("../shared/"):
        return str(SHARED_DATA.parent / arg[len("../shared/") :])
    if arg.startswith("docs/"):
        return str(ROOT / arg)
    return arg


@pytest.mark.parametrize("fmt", sorted(LOADERS))
def test_every_loader_has_a_page_with_an_example(fmt: str) -> None:
    page = PAGES / f"{fmt}.md"
    assert page.is_file(), f"docs/workloads/{fmt}.md is missing"
    cmds = _commands(page)
    assert cmds, f"{page.name} has no example command"
    if fmt not in ("native", "parquet"):
        assert any(f"--format {fmt}" in c for c in cmds)
    assert f"`{fmt}`" in (PAGES / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_has_a_page_with_an_example(name: str) -> None:
    page = PAGES / f"{name}.md"
    assert page.is_file(), f"docs/workloads/{name}.md is missing"
    cmds = _commands(page)
    assert any(f"trace generate {name}" in c or f"gen:{name}" in c for c in cmds)
    assert f"`{name}`" in (PAGES / "README.md").read_text()


DOC_PAGES = [*sorted(str(p.relative_to(ROOT / "docs")) for p in PAGES.glob("*.md")), "engine.md"]


@pytest.mark.parametrize("page", DOC_PAGES)
def test_page_examples_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cmds = _commands(ROOT / "docs" / page)
    if any("../shared/" in c for c in cmds) and not SHARED_DATA.is_dir():
        pytest.skip("shared data not found")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for cmd in cmds:
        argv = [_resolve(a) for a in shlex.split(cmd)[1:]]
        res = runner.invoke(app, argv)
        assert res.exit_code == 0, f"{page}: `{cmd}` failed:\n{res.output}"
        if "-o" in argv:
            assert (tmp_path / argv[argv.index("-o") + 1]).is_file()


def test_swe_agent_page_figures() -> None:
    """docs/workloads/swe-agent.md quotes these (llama3 and cl100k, 16-token blocks)."""
    folder = SHARED_DATA / "swe_agent"
    if not folder.is_dir():
        pytest.skip("shared SWE-agent data not found")
    trace = load_trace(folder, "swe-agent")
    assert (len(trace), len(set(trace.session_id))) == (209, 19)
    assert int(trace.input_length.sum()) == 967_204
    share = session_prefix_share(trace)
    assert share is not None and round(share, 4) == 0.9144
    stats = trace_stats(trace, 16)
    assert round(stats["infinite_cache_token_hit_ratio"], 4) == 0.8861
    cl = load_trace(folder, "swe-agent", tokenizer="cl100k")
    assert round(session_prefix_share(cl) or 0.0, 4) == 0.9144


def test_toolbench_page_figures() -> None:
    folder = SHARED_DATA / "toolbench"
    if not folder.is_dir():
        pytest.skip("shared ToolBench data not found")
    trace = load_trace(folder, "toolbench")
    tasks = {t: trace.task.count(t) for t in set(trace.task) if t is not None}
    assert (len(trace), len(set(trace.session_id))) == (66, 27)
    assert tasks == {"tool-agent": 52, "tool-use": 14}
    assert int(trace.input_length.sum()) == 119_251
    assert round(session_prefix_share(trace) or 0.0, 3) == 0.892
    assert round(trace_stats(trace, 16)["infinite_cache_token_hit_ratio"], 3) == 0.730


def test_templated_takes_azure_arrivals_and_lengths() -> None:
    """templated.md: --arrivals-from keeps an Azure trace's times and lengths (45% / 58%)."""
    csv = SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    if not csv.is_file():
        pytest.skip("shared Azure trace not found")
    from prefixlab.workload.generators import generate_templated

    real = load_trace(csv, "azure", limit=500)
    for system_tokens, share in ((512, 0.454), (64, 0.582)):
        t = generate_templated(
            num_requests=500, system_tokens=system_tokens, arrivals_from=str(csv)
        )
        assert (t.arrival_s == real.arrival_s).all()
        assert (t.output_length == real.output_length).all()
        exact = t.input_length == real.input_length
        assert round(float(exact.mean()), 3) == share
        # Where the row is too short, the prompt is the task's fixed part plus one token.
        assert (t.input_length[~exact] > real.input_length[~exact]).all()

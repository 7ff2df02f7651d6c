"""The ``prefixlab`` command's entry point: its top-level help without importing the commands.

``prefixlab`` and ``prefixlab --help`` only list the commands, yet building the real
command tree imports every command's module and, through them, numpy and the simulator.
Those two invocations print the same help from the table below; every other one hands over
to :data:`prefixlab.cli.app`. ``tests/test_cli_entry.py`` checks the table and the output
against the real commands.
"""

from __future__ import annotations

import sys
from typing import Any

from prefixlab.cli.root import print_version, root

#: the application's help line (the real app's ``help``)
HELP = "Simulate and compare cache policies for LLM serving."
#: top-level command -> the help the listing shows (the first paragraph of its docstring), in
#: the real app's order
COMMANDS: dict[str, str] = {
    "replay": "Replay a trace through a prefix cache under each policy and compare hit ratios.",
    "policies": "List every registered policy with its parameters and a one-line description.",
    "models": (
        "List the model presets (layers, weights, KV bytes per token), or show one model, with\n"
        "the KV budget it leaves on --tp x --gpu."
    ),
    "simulate": "Simulate serving: continuous batching, a shared KV pool, TTFT / TPOT.",
    "fit-timing": (
        "Fit the power-law prefill model a * BS^b * L^c to measured timings (reports R^2)."
    ),
    "plan": (
        "Size a fleet: the fewest replicas whose P95 TTFT (arrival to first token) meets the\n"
        "target, for each router and tier setup, with the curves it was read from."
    ),
    "compare": (
        "Compare policies on one workload at one or more capacities: a table, and results."
    ),
    "sweep": "Run a study (experiment or experts); finished cells are kept, so a rerun resumes.",
    "demo": (
        "The built-in tour: a multi-turn + templated mix, the classic policies and OPT,\n"
        "on the serving engine; ends with the table and the path of the HTML report."
    ),
    "schema": "Print the JSON Schema of a config file kind (for editors and validators).",
    "report": "Write a self-contained HTML report (tables, figures, config) of a results folder.",
    "plot": "Write the report's figures as PNG files, one per line printed.",
    "reproduce": "Rerun a paper's table or figure with its setup; write ours beside the paper's.",
    "trace": "Inspect and convert traces.",
    "results": "List and query saved results.",
    "lpc": "Learned prefix caching: train, evaluate.",
    "analyze": (
        "Analyse a trace: block reuse by session, task, phase and position; gaps; headroom."
    ),
    "experts": "Mixture-of-Experts expert caching: layered paging traces, policies, sweeps.",
}


def listing() -> Any:
    """The root command group with placeholder commands: it prints the real app's help."""
    import typer.main

    light = typer.Typer(no_args_is_help=True, add_completion=False, help=HELP)
    light.callback()(root)
    for name, text in COMMANDS.items():
        light.command(name, help=text)(root)
    return typer.main.get_command(light)


def main() -> None:
    args = sys.argv[1:]
    if args in ([], ["--help"]):
        listing()()
    if args == ["--version"]:  # as the real app prints it, without importing it
        print_version(True)
    from prefixlab.cli.main import app

    app()

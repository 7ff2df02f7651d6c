"""The root command's options, shared by the real app (:mod:`prefixlab.cli`) and the light
help of the entry point (:mod:`prefixlab.cli.entry`), which must not import the app."""

from __future__ import annotations

from typing import Annotated

import typer

#: the one option of the root command
VERSION_HELP = "Print prefixlab's version and exit."


def print_version(value: bool) -> None:
    if value:
        from prefixlab import __version__

        print(f"prefixlab {__version__}")
        raise SystemExit(0)


def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=print_version, is_eager=True, help=VERSION_HELP),
    ] = False,
) -> None:
    """The root command's options (the real app's callback too)."""

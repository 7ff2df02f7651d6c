"""``python -m prefixlab``: the command-line interface."""

from prefixlab.cli.entry import main

if __name__ == "__main__":
    main()

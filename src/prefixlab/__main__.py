"""``python -m prefixlab``: the command-line interface."""

from prefixlab.cli_entry import main

if __name__ == "__main__":
    main()

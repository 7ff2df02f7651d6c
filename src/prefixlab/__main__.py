"""``python -m prefixlab``: the command-line interface."""

from prefixlab.cli import main

if __name__ == "__main__":
    main()

"""The command-line interface, one module per command group, each a thin shell:
parse the options -> build the library's objects -> run -> write, with the logic in the
library.

- :mod:`~prefixlab.cli.main`: the application (:data:`prefixlab.cli.main.app`), every
  group registered in the order of the listing;
- :mod:`~prefixlab.cli.entry`: the ``prefixlab`` entry point, which prints the top-level
  help without importing the commands (this package's ``__init__`` imports nothing);
- :mod:`~prefixlab.cli.common`: the conventions every command shares (below);
- one module per group: ``replay`` (replay, policies), ``trace``, ``engine`` (simulate,
  fit-timing), ``experiments`` (compare, sweep, demo, schema, results), ``report``
  (report, plot), ``reproduce``, ``lpc``, ``analyze``, ``experts`` (and
  ``experts_record``).

Conventions: results go to stdout, as a table or, with ``--json``, as one JSON document
(an array of rows, or an object for one result; NaN written as null); progress, warnings
(``warning: ...``) and errors go to stderr; a user mistake is one line ``error: ...`` with
exit status 2; Ctrl-C exits 130 with a word on what was saved.
"""

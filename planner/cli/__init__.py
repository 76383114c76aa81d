"""The `planner` command line: option definitions and glue, nothing else.

Each command parses its options, calls one library function (planner/requests.py, the search, the bench
session, the exporters), and prints the contract document as JSON (--json) or renders it (planner/explain/).
Heavy imports (pulp, torch) happen inside commands, so `planner --help` never imports them.
`planner.cli.app.main` is the one place errors become exit codes (planner/errors.py's table).
"""

from planner.cli import catalog, decide, launch, measure, planning  # noqa: F401  (registers the commands)
from planner.cli.app import app, main

__all__ = ["app", "main"]

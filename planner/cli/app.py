"""The application, --version, the exit-code table in --help, and main(): where failures become exit codes."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated

import typer

from planner import SCHEMA_VERSION, __version__
from planner.errors import EXIT_CODES, EXIT_INTERNAL, EXIT_IO, EXIT_USAGE, exit_code_for

EPILOG = "\b\nExit codes:\n" + "\n".join(f"  {int(code)}  {text}" for code, (_, text) in EXIT_CODES.items())
app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True, epilog=EPILOG,
                  rich_markup_mode=None, help="Plan, predict and check the parallel layout of large transformer training.")
clusters_app = typer.Typer(no_args_is_help=True, help="Cluster presets.")
models_app = typer.Typer(no_args_is_help=True, help="Model presets and model files.")
app.add_typer(clusters_app, name="clusters")
app.add_typer(models_app, name="models")


def _version(value: bool) -> None:
    if value:
        from planner.cli.options import emit_json

        if "--json" in sys.argv:
            from planner.contract import VersionDocument

            emit_json(VersionDocument.current())
        else:
            print(f"planner {__version__} (schema {SCHEMA_VERSION})")
        raise typer.Exit()


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print the version and exit (with --json: as JSON).")] = False,
         as_json: Annotated[bool, typer.Option("--json", hidden=True, help="With --version.")] = False,
         debug: Annotated[bool, typer.Option("--debug", help="On an internal error, print the traceback "
                                                             "(accepted anywhere on the line).")] = False) -> None:
    """Plan, predict and check DP x TP x PP x ZeRO layouts for transformer training."""


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("PLANNER_DEBUG", "") not in ("", "0")
    args = _json_after_command([a for a in args if a != "--debug"])
    try:
        code = typer.main.get_command(app).main(args=args, prog_name="planner", standalone_mode=False)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        code = _fail(130, ["interrupted"], as_json=False)
    except Exception as exc:  # the one place failures become exit codes
        code = _failure(exc, as_json="--json" in args, debug=debug)
    sys.exit(code if isinstance(code, int) else 0)


def _json_after_command(args: list[str]) -> list[str]:
    """`planner --json plan ...` means `planner plan ... --json`: the top level's own --json belongs to --version, so
    before a command it was taken there and the command printed text (and only its errors as JSON)."""
    command = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if command is None or "--json" not in args[:command]:
        return args
    rest = [a for a in args[:command] if a != "--json"]
    return [*rest, args[command], "--json", *args[command + 1:]]


def _failure(exc: Exception, *, as_json: bool, debug: bool) -> int:
    name = type(exc).__name__
    if name == "NoArgsIsHelpError":  # the help was printed
        return EXIT_USAGE
    if name == "Abort":
        return _fail(130, ["aborted"], as_json=as_json)
    if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):  # click's own errors
        if not as_json:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)  # type: ignore[arg-type]
            return EXIT_USAGE
        return _fail(EXIT_USAGE, [exc.format_message()], as_json=True, quiet=True)
    if isinstance(exc, OSError):  # a read or write the command did not expect to fail
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(EXIT_IO, [f"{where}{exc.strerror or exc}"], as_json=as_json)
    code = exit_code_for(exc)
    if code is not None and code != EXIT_INTERNAL:
        return _fail(code, list(getattr(exc, "problems", None) or [str(exc)]), source=getattr(exc, "source", None),
                     as_json=as_json)
    if debug:
        traceback.print_exc()
    what = f"{name}: {exc}".splitlines()[0][:200]
    return _fail(EXIT_INTERNAL, [f"internal error ({what}); this is a bug in planner {__version__}: please report it "
                                 "with the command line" + ("" if debug else " (rerun with --debug for the traceback)")],
                 as_json=as_json)


def _fail(code: int, problems: list[str], *, as_json: bool, source: str | None = None, quiet: bool = False) -> int:
    prefix = f"{source}: " if source else ""
    if not quiet:
        for line in problems:
            print(f"error: {prefix}{line}", file=sys.stderr)
    else:
        print(f"error: {prefix}{problems[0]}", file=sys.stderr)
    if as_json:
        from planner.cli.options import emit_json
        from planner.contract import ErrorDocument

        emit_json(ErrorDocument.from_failure(code, problems, source))
    return int(code)

"""The command line: translate arguments into a Problem, call the engine, pick a renderer.

Errors from the core (AttnError) become one line on stderr and exit code 2; anything
unexpected is exit code 70 (EX_SOFTWARE; the traceback only with ATTNCLI_DEBUG=1); Ctrl-C is
130, SIGTERM 143, SIGHUP 129 (the console script, attncli.__main__); a failed stdout is 2, a closed pipe a
quiet 0 (attncli.cli.process).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer

from attncli import __version__
from attncli.cli import process
from attncli.errors import MESSAGE_LIMIT, AttnError, printable
from attncli.io import session

app = typer.Typer(
    name="attncli",
    help="Compute attention on matrices you supply, and explain every step.\n\n"
         "Environment: ATTNCLI_NPZ_MEMBER_MAX caps the bytes one .npz member may inflate to (default 4G; e.g. "
         "512M, 16G; the free memory caps it too); ATTNCLI_DEBUG=1 shows an internal error's traceback.\n\n"
         "Examples:\n\n  attncli examples run cat_milk_sweet\n\n"
         "  attncli run q.npy k.npy v.npy --valid-lens 2,3 --format json\n\n"
         "  attncli examples\n\n  attncli run --help",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_OK, EXIT_INPUT, EXIT_INTERRUPTED = 0, 2, 130
EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): a bug, told apart from check's mismatch (1)
EXIT_TERMINATED = 143  # 128 + SIGTERM


def error(message: str) -> None:
    """One line on stderr, prefixed with the program name. Control characters (a newline or an
    escape sequence in a key of a downloaded file) are written as escapes, and the line is cut
    at MESSAGE_LIMIT characters: one short line, always."""
    sys.stderr.write(f"attncli: error: {printable(message, MESSAGE_LIMIT)}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    """A warning on stderr: one line, escaped and cut as error() does."""
    sys.stderr.write(f"attncli: warning: {printable(message, MESSAGE_LIMIT)}\n")


def _one_line_warning(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None,
                      line: str | None = None) -> None:
    """Python warnings (a library's DeprecationWarning, ...) as one attncli line, without the
    source path and code line Python prints by default."""
    warn(f"{category.__name__}: {message}")


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map domain errors to exit 2, Ctrl-C to 130 and surprises to 70, each with one line. A
    command starts a new session (attncli.io.session: the files it reads, the outputs it names)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import warnings

        session.begin()
        try:
            with warnings.catch_warnings():
                # numpy's RuntimeWarnings (overflow in a cast, ...) are said by the engine's own checks
                warnings.simplefilter("ignore", RuntimeWarning)
                warnings.showwarning = _one_line_warning
                result = fn(*args, **kwargs)
            session.commit()  # the outputs, renamed into place together now that the command succeeded
            return result
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except process.StdoutError:
            raise
        except AttnError as e:
            error(str(e))
            raise typer.Exit(EXIT_INPUT) from None
        except KeyboardInterrupt:
            error("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except MemoryError:  # a request larger than the machine (the checks before allocating missed it)
            error("out of memory: the inputs or options ask for more than this machine has; try smaller inputs, "
                  "--steps output, or --dtype float32")
            raise typer.Exit(EXIT_INPUT) from None
        except Exception as e:
            if os.environ.get("ATTNCLI_DEBUG"):
                raise
            error(f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:120]} "
                  "(set ATTNCLI_DEBUG=1 for the traceback, and please report it)")
            raise typer.Exit(EXIT_INTERNAL) from None
        finally:
            session.end()

    return wrapper


def _version(value: bool) -> None:
    if value:
        typer.echo(f"attncli {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Compute attention on matrices you supply, and explain every step.

    Example: attncli examples run cat_milk_sweet
    """


from attncli.cli import run as _run  # noqa: E402,F401  (registers the run command)
from attncli.cli import selfattn as _selfattn  # noqa: E402,F401  (registers the self command)
from attncli.cli import view as _view  # noqa: E402,F401  (registers the view command)

# commands are listed in --help in registration order: run, self, check, examples
# isort: split
from attncli.cli import capture as _capture  # noqa: E402,F401  (registers the capture command)
from attncli.cli import check as _check  # noqa: E402,F401  (registers the check command)
from attncli.cli import examples as _examples  # noqa: E402,F401  (registers the examples command)
from attncli.cli import inspect as _inspect  # noqa: E402,F401  (registers the inspect command)
from attncli.cli.options import use_help_layout  # noqa: E402

use_help_layout(app)  # --help fits 80 columns: long option names on a line of their own


def invoked(args: list[str]) -> typer.Typer:
    """The app, with only the command ``args`` start with when they name one: Typer turns every
    command's signature into options on each start (~20 ms for all of them), and a run uses one.
    Anything else (no command, an option first, a command group, a typo) gets the whole app."""
    import copy

    name = args[0] if args else None
    chosen = [c for c in app.registered_commands if c.name == name]
    if not chosen:
        return app
    one = copy.copy(app)  # the original keeps every command (tests invoke it in the same process)
    one.registered_commands, one.registered_groups = chosen, []
    return one


def main() -> None:
    """Console-script entry point."""
    try:  # typer 0.28 carries its own copy of click; earlier ones use click itself
        from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef,assignment]

    process.guard_stdout()  # the terminating signals are the console script's (attncli.__main__)
    try:
        code = invoked(sys.argv[1:])(standalone_mode=False)  # usage errors come here, to be said in one line
        sys.stdout.flush()  # here, not at exit: a full disk or a closed pipe is said, not ignored
    except NoArgsIsHelpError as e:  # `attncli` alone: the help is already printed
        sys.exit(e.exit_code)
    except UsageError as e:  # an unknown option, a bad choice, a missing argument
        ctx = e.ctx
        see = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        error(" ".join(e.format_message().split()) + see)
        sys.exit(EXIT_INPUT)
    except ClickException as e:
        error(" ".join(e.format_message().split()))
        sys.exit(e.exit_code)
    except process.StdoutError as e:
        sys.exit(process.stdout_failed(e))
    except KeyboardInterrupt:
        error("interrupted")
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else EXIT_OK)

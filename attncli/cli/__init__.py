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
from typing import TYPE_CHECKING, Any

import typer

from attncli import __version__
from attncli.cli import process
from attncli.errors import MESSAGE_LIMIT, AttnError, printable
from attncli.io import session

# The commands, in the order --help lists them: name -> (the module that registers it, the summary --help lists:
# the start of its own help). ``attncli NAME ...`` imports that one module (it registers its command on the app with
# ``@app.command(NAME)`` or ``app.add_typer``); the top-level --help lists these paragraphs and imports none
# (tests/test_startup.py checks that they are the commands' own). A new command is one row here.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("attncli.cli.run", "Compute attention on Q, K, V and show every step."),
    "self": ("attncli.cli.selfattn", "Self-attention and multi-head attention: project X, split into heads, "
                                     "attend, concatenate."),
    "view": ("attncli.cli.view", "Look at every head of a layer in the browser: a local viewer on 127.0.0.1."),
    "capture": ("attncli.cli.capture", "Run a model on some text with its own tokenizer (transformers) and save what "
                                       "it did, for every command that takes X or HIDDEN with --weights MODEL."),
    "heads": ("attncli.cli.heads", "What every head does: statistics over every valid query of every input, and the "
                                   "patterns they pass."),
    "check": ("attncli.cli.check", "Compare expected numbers with the computed attention, and name the mistake "
                                   "if they differ."),
    "inspect": ("attncli.cli.inspect", "Show what a checkpoint holds: its attention layers, their tensors (shape, "
                                       "dtype), the layout detected and the facts from config.json."),
    "examples": ("attncli.cli.examples", "The textbook examples: list them, show one, or run one step by step."),
}

_app = typer.Typer(
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
    rich_markup_mode=None,  # plain help, as every command's (attncli.cli.options.HelpCommand): no rich.markdown to import
    context_settings={"help_option_names": ["-h", "--help"]},
)
_registering = False  # a command module being imported gets the app as it is (see __getattr__)

if TYPE_CHECKING:
    app: typer.Typer  # the whole app (module __getattr__ below)


def __getattr__(name: str) -> Any:
    """``attncli.cli.app`` is the whole app: every command of COMMANDS, imported on first use (PEP 562).
    A command module importing it while it registers gets the app as it is."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _app if _registering else load(*COMMANDS)


def load(*names: str) -> typer.Typer:
    """Import the modules of the commands ``names`` (each registers its command on the app) and return the
    app; the commands keep COMMANDS' order, whatever the order of the imports."""
    import importlib

    global _registering
    before, _registering = _registering, True
    try:
        for name in names:
            importlib.import_module(COMMANDS[name][0])
    finally:
        _registering = before
    from attncli.cli.options import use_help_layout

    order = list(COMMANDS)
    _app.registered_commands.sort(key=lambda c: order.index(c.name) if c.name in order else len(order))
    infos: list[Any] = [*_app.registered_commands, *_app.registered_groups]
    for info in infos:  # the listing says the table's summary
        if info.name in COMMANDS and not info.short_help:  # None, or typer's Default(None) for a group
            info.short_help = COMMANDS[info.name][1]
    use_help_layout(_app)  # --help fits 80 columns: long option names on a line of their own
    return _app


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


@_app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Compute attention on matrices you supply, and explain every step.

    Example: attncli examples run cat_milk_sweet
    """


def invoked(args: list[str]) -> typer.Typer:
    """The app for a command line ``args``: only the command they start with when they name one (its module
    alone is imported, and Typer turns only its signature into options); for anything else (no command, an
    option first, a typo) an app whose commands are COMMANDS' names and paragraphs, with no options to build;
    the whole app for shell completion, which reads the command line from the environment."""
    import copy

    if "_ATTNCLI_COMPLETE" in os.environ:
        return load(*COMMANDS)
    name = args[0] if args else None
    one = copy.copy(_app)  # the app itself keeps whatever is registered (tests invoke it in the same process)
    if name in COMMANDS:
        load(name)
        one.registered_commands = [c for c in _app.registered_commands if c.name == name]
        one.registered_groups = [g for g in _app.registered_groups if g.name == name]
        return one
    one.registered_commands, one.registered_groups = [], []
    for command, (_, summary) in COMMANDS.items():
        one.command(command, help=summary, short_help=summary, add_help_option=False)(_listed)
    return one


def _listed() -> None:
    """A command as the top-level --help lists it (never run: a command line naming it gets the real one)."""


def main() -> None:
    """Console-script entry point."""
    try:  # typer 0.28 carries its own copy of click; earlier ones use click itself
        from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
    except ImportError:
        from click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # type: ignore[no-redef,assignment]

    process.guard_stdout()  # the terminating signals are the console script's (attncli.__main__)
    if sys.argv[1:2] and sys.argv[1] in process.SWEEPING:
        process.allocator_for_sweeps()
    try:
        code = invoked(sys.argv[1:])(standalone_mode=False)  # usage errors come here, to be said in one line
        sys.stdout.flush()  # here, not at exit: a full disk or a closed pipe is said, not ignored
    except NoArgsIsHelpError as e:  # `attncli` alone: the help, on stdout as --help prints it
        sys.stdout.write(e.format_message() + "\n")
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

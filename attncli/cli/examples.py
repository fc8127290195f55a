"""``attncli examples``: the textbook examples that ship inside the package.

    attncli examples                      list them (name and one line each)
    attncli examples show NAME            print the file (comments say where it comes from)
    attncli examples run NAME [options]   run it step by step; every option of `attncli run` works
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import ProblemArgs, View, takes_options
from attncli.errors import InputError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

EXAMPLE_SUFFIXES = (".yaml", ".yml", ".json", ".npz")

examples_app = typer.Typer(
    name="examples",
    help="The textbook examples: list them, show one, or run one step by step.\n\n"
         "Examples:\n\n  attncli examples\n\n  attncli examples show cat_milk_sweet\n\n"
         "  attncli examples run d2l_masked_softmax --format json",
    invoke_without_command=True,
    no_args_is_help=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def catalogue() -> dict[str, Traversable]:
    """Example name (file stem) -> its file inside the installed package, sorted by name."""
    from importlib import resources  # here: `attncli --help` need not import it

    folder = resources.files("attncli") / "examples"
    found = {p.name.rsplit(".", 1)[0]: p for p in folder.iterdir()
             if p.is_file() and p.name.endswith(EXAMPLE_SUFFIXES) and not p.name.startswith(".")}
    return dict(sorted(found.items()))


def find(name: str) -> Traversable:
    """The example called ``name`` (with or without its extension), or an InputError naming the choices."""
    every = catalogue()
    stem = name
    for suffix in EXAMPLE_SUFFIXES:
        stem = stem.removesuffix(suffix)
    if stem not in every:
        raise InputError(f"no example named {name!r}; the examples are {', '.join(every)} "
                         "(attncli examples lists them)", "examples")
    return every[stem]


def describe(path: Traversable) -> str:
    """The example's one-line ``description:`` (YAML/JSON), else its first comment line."""
    if path.name.endswith(".npz"):
        return "(binary .npz problem)"
    text = path.read_text(encoding="utf-8")
    for line in text.splitlines():
        if line.startswith("description:"):
            import yaml

            value = yaml.safe_load(line)
            return str(value.get("description", "")) if isinstance(value, dict) else ""
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


@contextmanager
def on_disk(path: Traversable) -> Iterator[Path]:
    """A real file path for an example (extracted to a temporary file if the package is zipped)."""
    from importlib import resources  # here: `attncli --help` need not import it

    with resources.as_file(path) as p:
        yield Path(p)


@examples_app.callback()
def examples_list(ctx: typer.Context) -> None:
    """List the textbook examples (name and one line each)."""
    if ctx.invoked_subcommand is not None:
        return
    import shutil

    from attncli.render.wrap import wrap

    every = catalogue()
    width = max((len(n) for n in every), default=0)
    cols = shutil.get_terminal_size().columns  # COLUMNS, else the terminal's, else 80

    def echo(line: str, align: bool = False) -> None:  # wrapped at spaces, continuations under the description
        typer.echo("\n".join(wrap(line, cols, align=align)))

    for name, path in every.items():
        echo(f"{name:<{width}}  {' '.join(describe(path).split())}", align=True)
    from importlib import resources  # here: `attncli --help` need not import it

    folder = resources.files("attncli") / "examples"
    typer.echo()
    echo("attncli examples show NAME prints one; attncli examples run NAME [options] runs it.")
    echo(f"The files are in {folder}; attncli check FILE compares a run with the file's expected: numbers.")


@examples_app.command("show")
@handles_errors
def examples_show(name: Annotated[str, typer.Argument(help="Example name, as listed by `attncli examples`.")]) -> None:
    """Print an example file (its comments say where it comes from and what to expect).

    Examples:

      attncli examples show cat_milk_sweet

      attncli examples show d2l_additive > mine.yaml
    """
    path = find(name)
    if path.name.endswith(".npz"):
        raise InputError("is a binary .npz problem; run it with `attncli examples run` instead", name)
    sys.stdout.write(path.read_text(encoding="utf-8"))


@examples_app.command("run")
@handles_errors
@takes_options("examples run")
def examples_run(
    name: Annotated[str, typer.Argument(help="Example name, as listed by `attncli examples`.")],
    problem: ProblemArgs,
    view: View,
) -> None:
    """Run an example step by step; every option of `attncli run` and `attncli self` works (e.g. --explain it,milk).

    Examples:

      attncli examples run cat_milk_sweet

      attncli examples run cat_milk_sweet --explain it,milk --steps weights,output

      attncli examples run multihead_cat_milk --head 1 --explain-row it
    """
    from attncli.cli.inputs import build_problem
    from attncli.cli.run import execute
    from attncli.io.files import Reader

    with on_disk(find(name)) as path:
        reader = Reader()
        built = build_problem([str(path)], problem, reader)
        execute(built, view, protect=[str(path), *reader.paths])


app.add_typer(examples_app, name="examples")

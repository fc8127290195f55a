"""Options declared once: from one declaration follow the flags of exactly the commands that take
it, the typed value a command receives, and the check that flags, problem files and attend() share."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from attncli import attend
from attncli.cli import app
from attncli.cli.options import ProblemArgs, View, takes_options
from attncli.core.options import OUTPUT, Options, declared, option
from attncli.errors import InputError

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
CAT = str(ROOT / "examples" / "cat_milk_sweet.yaml")


def flags_of(*command: str) -> set[str]:
    import typer.main

    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def choices_of(option_name: str, *command: str) -> list[str]:
    import typer.main

    cmd = typer.main.get_command(app)
    for name in command:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    param = next(p for p in cmd.params if option_name in p.opts)
    return [str(getattr(c, "value", c)) for c in param.type.choices]  # type: ignore[attr-defined]


# (command, flags it must offer, flags it must not offer)
OFFERED = [
    (("run",), {"--temperature", "--window", "--format", "--svg", "--valid-lens", "--threads"},
     {"--heads", "--kv-heads", "--head", "--layer", "--expected", "--keep-weights"}),
    (("self",), {"--temperature", "--heads", "--kv-heads", "--head", "--format", "--plot"},
     {"--expected", "--what", "--keep-weights"}),
    (("check",), {"--temperature", "--heads", "--kv-heads", "--expected", "--what", "--format", "--search"},
     {"--svg", "--plot", "--html", "--head", "--steps", "--save", "--explain-row", "--similarity", "--full"}),
    (("examples", "run"), {"--temperature", "--heads", "--head", "--format", "--html"}, {"--expected", "--atol"}),
    (("inspect",), {"--format"}, {"--temperature", "--heads", "--steps", "--save", "--quiet"}),
]


@pytest.mark.parametrize(("command", "has", "lacks"), OFFERED, ids=lambda c: " ".join(c) if isinstance(c, tuple) else "")
def test_each_command_offers_only_its_own_options(command: tuple[str, ...], has: set[str], lacks: set[str]) -> None:
    flags = flags_of(*command)
    assert has <= flags, has - flags
    assert not lacks & flags, lacks & flags


def test_every_computation_option_is_a_flag_of_exactly_its_commands() -> None:
    for name, spec in declared(Options).items():
        for command in ("run", "self", "check"):
            offered = spec.long in flags_of(command)
            wanted = command in (spec.commands if spec.commands is not None else Options.COMMANDS)
            assert offered == wanted, (name, command)


def test_format_choices_are_the_renderers_registries() -> None:
    from attncli.render import FORMAT_MODULES, FORMATS, load_renderers
    from attncli.render.check import CHECK_FORMATS

    load_renderers()
    assert set(FORMATS) == set(FORMAT_MODULES)  # the lazy index names exactly what the modules register
    for command in (("run",), ("self",), ("examples", "run")):
        assert choices_of("--format", *command) == list(FORMAT_MODULES)
    assert choices_of("--format", "check") == list(CHECK_FORMATS) == ["rich", "json"]


# one rule per option, whatever its origin: the message differs only in where the value came from
BAD = [("temperature", "-1", -1, "temperature must be a positive number, got -1"),
       ("window", "0", 0, "the sliding window must be a whole number of keys from 1 to"),
       ("softcap", "0", 0.0, "the soft-cap must be a finite number > 0"),
       ("mask_value", "5", 5.0, "mask value must be a negative number or -inf"),
       ("bandwidth", "nan", float("nan"), "bandwidth must be a positive number, got nan")]


@pytest.mark.parametrize(("name", "text", "value", "message"), BAD, ids=[b[0] for b in BAD])
def test_flag_file_and_api_share_one_check(tmp_path: Path, name: str, text: str, value: float, message: str) -> None:
    flag = "--" + name.replace("_", "-")
    res = runner.invoke(app, ["run", CAT, f"{flag}={text}"])
    assert res.exit_code == 2 and f"{flag}: {message}" in res.output, res.output
    problem = tmp_path / "p.yaml"
    problem.write_text(f"q: [[1.0, 0.0], [0.0, 1.0]]\noptions:\n  {name}: {text}\n")
    res = runner.invoke(app, ["run", str(problem)])
    assert res.exit_code == 2 and f"p.yaml: option {name}: {message}" in res.output, res.output
    with pytest.raises(InputError, match=f"attend\\(\\): option {name}: {message[:20]}"):
        attend([[1.0, 0.0], [0.0, 1.0]], **{name: value})


@dataclasses.dataclass(frozen=True)
class Toy:
    """A throw-away option group."""

    COMMANDS: ClassVar[frozenset[str]] = frozenset({"toy"})
    level: int = option(3, "How loud.", OUTPUT, short="-l", min=1, max=9)
    mode: str = option("a", "Which mode.", OUTPUT, choices=lambda: ("a", "b"))
    loud: bool = option(True, "Shout.", OUTPUT)
    extra: int | None = option(None, "Only for other commands.", OUTPUT, commands=frozenset({"other"}))


def test_a_declared_group_becomes_flags_and_one_typed_value() -> None:
    """A throw-away group with two options: the command gets its flags (choices, range, short flag, the
    negative switch) and receives one typed instance; another command does not see the group's options."""

    seen: list[Toy] = []
    toy_app = typer.Typer()

    @toy_app.command()
    @takes_options("toy")
    def toy(name: Annotated[str, typer.Argument()], toy: Toy) -> None:
        seen.append(toy)

    assert runner.invoke(toy_app, ["x", "-l", "7", "--mode", "b", "--no-loud"]).exit_code == 0
    assert seen == [Toy(level=7, mode="b", loud=False, extra=None)]
    assert runner.invoke(toy_app, ["x"]).exit_code == 0 and seen[-1] == Toy()
    for bad in (["x", "-l", "0"], ["x", "--mode", "c"], ["x", "--extra", "1"]):
        assert runner.invoke(toy_app, bad).exit_code == 2, bad


def test_commands_receive_typed_groups() -> None:
    from attncli.cli.check import Verify

    assert {f.name for f in dataclasses.fields(View)} >= {"format", "save", "head", "explain"}
    assert {f.name for f in dataclasses.fields(Verify)} >= {"expected", "what", "format"}
    res = runner.invoke(app, ["run", CAT, "-x", "it,milk", "-x", "cat,cat", "-f", "json", "-t", "2"])
    assert res.exit_code == 0, res.output
    assert ProblemArgs().options == {}  # no flag given: the file's options and the defaults apply


@pytest.mark.parametrize(("name", "text"), [("window", "1_000"), ("temperature", "1_0"), ("q_offset", " 3"),
                                             ("softcap", "５")])
def test_a_number_written_as_text_must_be_plain_digits(tmp_path: Path, name: str, text: str) -> None:
    """Python's int()/float() read '1_000', blanks and full-width digits; a file's quoted value is refused instead."""
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps({"q": [[1.0, 0.0], [0.0, 1.0]], "options": {name: text}}))
    res = runner.invoke(app, ["run", str(problem)])
    assert res.exit_code == 2 and f"p.json: option {name}" in res.output and len(res.output.strip().splitlines()) == 1


def test_a_quoted_plain_number_is_that_number(tmp_path: Path) -> None:
    q = np.array([[1.0, 0.0], [0.5, 2.0]])
    problem = tmp_path / "p.json"
    problem.write_text(json.dumps({"q": q.tolist(), "options": {"temperature": "2.5e0"}}))
    res = runner.invoke(app, ["run", str(problem), "--format", "json"])
    assert res.exit_code == 0, res.output
    s = q @ q.T / np.sqrt(2) / 2.5  # float64 by hand: scaled by 1/sqrt(d), then divided by T
    want = np.exp(s - s.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(json.loads(res.stdout)["weights"], want, rtol=0, atol=1e-12)

"""--help of every command at 80 columns: no line wider, no word or option name cut, no markup
eaten, and one meaning per option letter across commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from attncli.cli import app

COMMANDS = [[], ["run"], ["self"], ["check"], ["inspect"], ["heads"], ["examples"], ["examples", "run"], ["examples", "show"]]
HELP_ALL = [["run"], ["self"], ["check"], ["inspect"], ["examples", "run"], ["examples", "show"]]  # the commands
# (not the groups); those declaring options through attncli.cli.options show the essentials in --help
ESSENTIAL = {
    "run": {"--score", "--causal", "--valid-lens", "--mask", "--steps", "--format", "--save", "--explain", "--plot",
            "--html"},
    "check": {"--expected", "--what", "--score", "--causal", "--valid-lens", "--mask", "--format"},
}
ESSENTIAL["examples run"] = ESSENTIAL["self"] = ESSENTIAL["run"] | {"--heads"}


def help_text(args: list[str], width: int = 80, flag: str = "--help") -> str:
    env = {**os.environ, "COLUMNS": str(width), "TERMINAL_WIDTH": str(width), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "attncli", *args, flag], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def click_command(args: list[str]):  # type: ignore[no-untyped-def]
    import typer.main

    cmd = typer.main.get_command(app)
    for a in args:
        cmd = cmd.commands[a]  # type: ignore[attr-defined]
    return cmd


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "attncli")
def test_help_fits_80_columns_without_cut_words(args: list[str]) -> None:
    text = help_text(args, flag="--help-all" if args in HELP_ALL else "--help")
    assert all(len(line) <= 80 for line in text.splitlines()), [ln for ln in text.splitlines() if len(ln) > 80]
    assert "…" not in text  # rich's mark of a cut cell
    words = set(re.findall(r"[\w'./\[\]-]+", text))
    for param in click_command(args).params:
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("-"):
                assert name in words, f"{name} is not shown whole"
        help_words = re.findall(r"(?<![\w.])-*[A-Za-z][\w'-]*[A-Za-z0-9]", getattr(param, "help", None) or "")
        for w in help_words:  # every word of the description, whole (not broken at a hyphen or a column)
            assert re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", text), f"{w!r} of {param.name}'s help is cut"


def test_plot_extra_is_printed_as_written() -> None:
    assert "pip install 'attncli[plot]'" in " ".join(help_text(["run"]).split())


def test_aliases_are_not_listed_as_choices() -> None:
    text = " ".join(help_text(["run"]).split())
    assert "One of: dot, scaled-dot, general, additive, cosine, gaussian, location." in text
    assert "bahdanau" not in text.split("--score", 1)[1].split("--scale", 1)[0]


def test_one_meaning_per_option_letter() -> None:
    meaning: dict[str, set[str]] = {}
    for args in COMMANDS:
        for param in click_command(args).params:
            for name in param.opts:
                if re.fullmatch(r"-\w", name):
                    meaning.setdefault(name, set()).add(param.name or "")
    clash = {k: v for k, v in meaning.items() if len(v) > 1}
    assert not clash, clash
    assert meaning["-e"] == {"expected"} and meaning["-x"] == {"explain"}


def shown_options(text: str) -> set[str]:
    """The long options a help text lists (at the start of its rows)."""
    return set(re.findall(r"^ {2}(?:-\w, )?(--[\w-]+)", text, re.M))


@pytest.mark.parametrize("args", HELP_ALL, ids=" ".join)
def test_short_help_is_the_essentials_in_60_lines(args: list[str]) -> None:
    """--help at 80 columns: at most 60 lines, the inputs and the essential options, and one line pointing to
    --help-all when options are left out."""
    text = help_text(args)
    lines = text.splitlines()
    assert len(lines) <= 60, f"{len(lines)} lines"
    assert all(len(line) <= 80 for line in lines)
    assert "Arguments:" in text
    key = " ".join(args)
    shown = shown_options(text)
    assert ESSENTIAL.get(key, set()) <= shown, ESSENTIAL[key] - shown
    every = {o for p in click_command(args).params for o in p.opts if o.startswith("--")}
    if shown - {"--help", "--help-all"} != every - {"--help"}:  # some left out: say where they are
        assert f"attncli {key} --help-all" in " ".join(" ".join(lines[-2:]).split())
        assert len(shown) <= 16


@pytest.mark.parametrize("args", HELP_ALL, ids=" ".join)
def test_help_all_lists_every_option_grouped_by_task(args: list[str]) -> None:
    from attncli.cli.options import OFFERED
    from attncli.core.options import PANELS

    text = help_text(args, flag="--help-all")
    every = {o for p in click_command(args).params for o in p.opts if o.startswith("--")}
    assert every <= shown_options(text) | {"--help"}  # --help is listed as "-h, --help"
    key = " ".join(args)
    panels = [line[:-1] for line in text.splitlines() if line.endswith(":") and line[:-1] in PANELS]
    offered = {s.panel for s in OFFERED.get(key, [])}
    assert panels == [p for p in PANELS if p in offered]  # one section per task, in PANELS' order
    if key in ("run", "self", "examples run"):  # the common tasks before the rarely needed ones
        assert panels.index("Masks and valid lengths") < panels.index("Computation")
        assert panels.index("Output") < panels.index("Today's models")

"""--help of every command at 80 columns: no line wider, no word or option name cut, no markup
eaten, and one meaning per option letter across commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from attncli.cli import app

COMMANDS = [[], ["run"], ["self"], ["check"], ["inspect"], ["examples"], ["examples", "run"], ["examples", "show"]]


def help_text(args: list[str], width: int = 80) -> str:
    env = {**os.environ, "COLUMNS": str(width), "TERMINAL_WIDTH": str(width), "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-m", "attncli", *args, "--help"], capture_output=True, text=True, env=env,
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
    text = help_text(args)
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

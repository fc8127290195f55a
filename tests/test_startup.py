"""Start-up (issue 30 item 9): `attncli --help` builds no command's options and imports no command's module;
`attncli NAME` imports only NAME's module. The figures are benchmarks/bench.py's (--only startup)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from attncli.cli import COMMANDS, app, invoked

ROOT = Path(__file__).resolve().parent.parent
MODULES = {module for module, _ in COMMANDS.values()}


def imported_after(args: list[str]) -> set[str]:
    """The attncli modules a fresh interpreter has imported once `attncli ARGS` is done."""
    code = ("import sys, io, contextlib; sys.argv = ['attncli', *sys.argv[1:]]; from attncli.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    try: main()\n"
            "    except SystemExit: pass\n"
            "print(' '.join(m for m in sys.modules if m.startswith('attncli')))")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("args", [["--help"], [], ["--version"], ["rnu"]])
def test_top_level_help_imports_no_command(args: list[str]) -> None:
    loaded = imported_after(args)
    assert not loaded & MODULES and "attncli.cli.options" not in loaded, loaded & (MODULES | {"attncli.cli.options"})


@pytest.mark.parametrize("name", ["run", "inspect", "examples"])
def test_a_command_imports_its_own_module_only(name: str) -> None:
    loaded = imported_after([name, "--help"])
    assert loaded & MODULES == {COMMANDS[name][0]}


def test_the_summaries_are_the_commands_own() -> None:
    """The commands the app registers are exactly COMMANDS' names, in its order; each summary starts as the
    command's own help starts, and the whole app lists the same summaries as the top-level --help."""
    group = get_command(app)
    assert list(group.commands) == list(COMMANDS)  # type: ignore[attr-defined]
    for name, (_, summary) in COMMANDS.items():
        own = " ".join((group.commands[name].help or "").split())  # type: ignore[attr-defined]
        assert own.split()[:5] == summary.split()[:5], name
        assert group.commands[name].get_short_help_str(200) == summary  # type: ignore[attr-defined]
    whole = CliRunner().invoke(app, ["--help"]).stdout
    assert whole == CliRunner().invoke(invoked(["--help"]), ["--help"]).stdout


def test_top_level_help_lists_every_summary() -> None:
    res = CliRunner().invoke(invoked(["--help"]), ["--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    listed = res.stdout.split("Commands:")[1]
    assert re.findall(r"^  (\S+)", listed, flags=re.M) == list(COMMANDS)  # a summary's next lines are indented more
    for name, (_, summary) in COMMANDS.items():
        assert f"{name}  " in listed and summary in " ".join(listed.split()), name


def test_bare_attncli_prints_the_help_on_stdout_and_exits_2() -> None:
    res = subprocess.run([sys.executable, "-m", "attncli"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr == ""
    assert "Usage:" in res.stdout and all(f"  {name} " in res.stdout for name in COMMANDS)


def test_a_plain_run_imports_no_capture_or_head_statistics(tmp_path: Path) -> None:
    # `attncli run` on a 4x4 .npy (the start-up target's run) never loads the capture reader or the per-head
    # statistics: they serve captures only (before, cli/inputs imported io.capture for is_capture and run's
    # name_heads imported headstats before finding there was no capture: ~8% of the run's start-up without .pyc)
    import numpy as np

    x = tmp_path / "x.npy"
    np.save(x, np.arange(16, dtype=np.float64).reshape(4, 4) / 10)
    loaded = imported_after(["run", str(x)])
    assert "attncli.core.engine" in loaded  # it ran
    assert not loaded & {"attncli.io.capture", "attncli.core.headstats"}, loaded

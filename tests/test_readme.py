"""The user's guide (README.md) is tested: every command in its ```sh blocks runs and exits as
documented, its score table matches the registry, it covers every input format, exit code and
command, and every command's --help shows examples.

Conventions (stated in a comment at the top of the README): lines of ```sh blocks run in
order, in one temporary folder holding a link ``examples`` to the bundled examples; a line
must exit 0 unless it ends with ``# exit N``. In the set-up commands, the ``pip install`` parts
and the lint/type/test command are the CI's (``.ci/run``) and are left out here. ```console
blocks are illustrative and not run.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attncli.cli import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, app
from attncli.core.scoring import ALIASES, SCORES
from attncli.io.files import LOADERS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
EXAMPLES = ROOT / "attncli" / "examples"
BIN = Path(sys.executable).parent
# parts of a command the CI runs itself (installing, and the lint/type/test command)
CI_ONLY = ("pip install", "ruff check", "mypy", "pytest")


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)


def commands(text: str) -> list[tuple[str, int]]:
    """(command, expected exit code) for every line of every ```sh block, in order."""
    out = []
    for block in sh_blocks(text):
        for line in block.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.search(r"#\s*exit\s+(\d+)\s*$", line)
            code = int(m.group(1)) if m else 0
            parts = [p for p in line.split(" && ") if not p.strip().startswith(CI_ONLY)]
            if parts:
                out.append((" && ".join(parts), code))
    return out


COMMANDS = commands(README)
# '.[hf]' (attncli capture) brings transformers, tokenizers and torch (transformers needs tokenizers itself)
EXTRAS = {"torch": ("'.[torch]'", "'.[hf]'"), "transformers": ("transformers", "'.[hf]'"),
          "matplotlib": ("'.[plot]'", "matplotlib")}


def needs(section: str) -> set[str]:
    """The optional packages a section's "Needs:" paragraph names (none: the base install is enough)."""
    m = re.search(r"^Needs: (.*?)(?:\n\n|\Z)", section, flags=re.S | re.M)
    said = m.group(1) if m else ""
    return {pkg for pkg, words in EXTRAS.items() if any(w in said for w in words)}


def commands_by_section(text: str) -> list[tuple[str, int, set[str]]]:
    """(command, expected exit code, the optional packages its section says it needs), in order."""
    return [(cmd, code, needs(section)) for section in re.split(r"^(?=## )", text, flags=re.M)
            for cmd, code in commands(section)]


BLOCKER = """
import importlib.abc, os, sys
BLOCKED = set(filter(None, os.environ.get("ATTNCLI_TEST_BLOCKED", "").split(",")))
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed in this README section)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def test_readme_has_commands_and_keeps_the_setup_section() -> None:
    setup = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    assert sh_blocks(setup) == [
        "pip install . && attncli examples run cat_milk_sweet\n",
        "pip install -e '.[test]' && ruff check attncli tests benchmarks && mypy attncli && pytest\n",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert sh_blocks(setup)[1].strip() in ci  # the CI runs the second set-up command as written
    assert len(COMMANDS) >= 20
    assert any(code != 0 for _, code in COMMANDS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    return work


@pytest.mark.skipif(os.name != "posix", reason="the guide's commands are POSIX shell")
@pytest.mark.slow
def test_readme_commands_run_as_documented(workdir: Path) -> None:
    """All in one test, in order: later commands use the files earlier ones made. Each runs with only what its
    section says it needs: torch, transformers and matplotlib fail to import unless the section's "Needs:" names
    them, so a section that silently needs one fails here."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1",
           "COLUMNS": "100", "PYTHONWARNINGS": "ignore"}
    said = ""
    site = workdir / "_blocker"  # a sitecustomize that makes the packages a section does not name missing
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    for cmd, code, extras in commands_by_section(README):
        blocked = ",".join(sorted(set(EXTRAS) - extras))
        run_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")])),
                   "ATTNCLI_TEST_BLOCKED": blocked}
        proc = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], cwd=workdir, env=run_env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, f"{cmd!r} exited {proc.returncode}, expected {code}:\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr, proc.stderr
        said += proc.stderr
        if code == EXIT_INPUT:  # bad files and usage mistakes alike: one line
            assert proc.stderr.startswith("attncli: error: ") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # the error messages the guide quotes are the ones these commands print
    quoted = [ln for block in re.findall(r"^```console\n(.*?)^```", README, flags=re.S | re.M)
              for ln in block.splitlines() if ln.startswith("attncli: error: ")]
    assert quoted
    for line in quoted:
        assert line in said, f"README quotes {line!r}, which no command printed"


def test_readme_lists_every_score_with_its_formula() -> None:
    """The score table is the registry's: every name, alias and formula (the docstring's first line)."""
    section = README.split("## Scores", 1)[1].split("\n## ", 1)[0]
    missing = [f"| `{s.name}`{' (default)' if s.name == 'scaled-dot' else ''} | "
               f"{', '.join(f'`{a}`' for a in s.aliases)} | `{s.formula}` |"
               for s in SCORES.values() if f"`{s.formula}`" not in section or f"`{s.name}`" not in section]
    assert not missing, "README score table is missing (or has stale) rows:\n" + "\n".join(missing)
    for alias in ALIASES:
        assert f"`{alias}`" in section, alias


def test_readme_covers_formats_exit_codes_and_commands() -> None:
    formats = README.split("## Input formats", 1)[1].split("\n## ", 1)[0]
    for ext in LOADERS:
        assert f"`{ext}`" in formats, ext
    codes = README.split("### Exit codes", 1)[1].split("\n## ", 1)[0]
    for code in (EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED):
        assert f"| {code} |" in codes
    for group in app.registered_groups:
        assert f"`attncli {group.name}" in README, group.name
    for command in app.registered_commands:
        assert f"`attncli {command.name}" in README, command.name
    assert "--install-completion" in README
    assert "BENCHMARK_FIGURES" not in README


def _help_targets() -> list[list[str]]:
    targets: list[list[str]] = [[]]
    targets += [[c.name] for c in app.registered_commands if c.name]
    for group in app.registered_groups:
        targets.append([group.name or ""])
        targets += [[group.name or "", c.name] for c in group.typer_instance.registered_commands if c.name]
    return targets


@pytest.mark.parametrize("words", _help_targets(), ids=lambda w: " ".join(w) or "attncli")
def test_every_help_shows_examples(words: list[str]) -> None:
    res = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "Examples:" in res.output or "Example:" in res.output, res.output[:500]
    assert "attncli " in res.output.split("Example", 1)[1]


def test_screenshot_is_the_tools_own_view_of_cat_milk() -> None:
    """docs/cat_milk_sweet.svg was saved by --svg; it shows milk's weights softmax(4, 5, 4, 6)."""
    svg = (ROOT / "docs" / "cat_milk_sweet.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "Generated with Rich" in svg
    e = [math.exp(x) for x in (4, 5, 4, 6)]  # milk's scaled scores (see examples/cat_milk_sweet.yaml)
    for w in e:
        assert f"{w / sum(e):.4f}" in svg  # 0.0826, 0.2245, 0.6103
    assert "docs/cat_milk_sweet.svg" in README

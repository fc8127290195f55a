"""Shared fixtures. Rendering is pinned to a fixed width so goldens do not depend on the terminal."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ["COLUMNS"] = "100"
os.environ["TERMINAL_WIDTH"] = "100"
os.environ.pop("FORCE_COLOR", None)
os.environ["NO_COLOR"] = "1"

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "attncli" / "examples"


@pytest.fixture
def examples_dir() -> Path:
    return EXAMPLES


def chromium() -> str | None:
    """Debian's chromium (or another installed Chrome), never a downloaded browser."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium driven by playwright (skips without chromium or playwright)."""
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium installed (.ci/run installs it where apt-get works)")
    sync = pytest.importorskip("playwright.sync_api")
    with sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _cached_command() -> None:
    """typer's CliRunner builds the whole click command from the app on every invoke (~50 ms: each command's
    signature turned into options, as `attncli` does on start); the suite invokes the app thousands of times. The
    command built once per state of the app (its registered commands, groups and callback) is reused: click
    commands are stateless between invocations (each gets a new context). Only where typer.testing has the name."""
    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is None:
        return
    cache: dict[tuple[int, ...], Any] = {}

    def get_command(app: Any) -> Any:
        key = (id(app), id(getattr(app, "registered_callback", None)),
               *(id(c) for c in getattr(app, "registered_commands", [])),
               -1, *(id(g) for g in getattr(app, "registered_groups", [])))
        if key not in cache:
            cache[key] = build(app)
        return cache[key]

    typer.testing._get_command = get_command  # type: ignore[attr-defined]


_cached_command()

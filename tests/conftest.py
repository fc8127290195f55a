"""Shared fixtures. Rendering is pinned to a fixed width so goldens do not depend on the terminal."""

from __future__ import annotations

import os
from pathlib import Path

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

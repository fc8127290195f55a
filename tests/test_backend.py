"""Backends: numpy never imports torch; torch/device errors are one line; precision and dtype options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core import backend as backend_mod
from attncli.core.backend import get_backend
from attncli.errors import BackendError

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_numpy_path_never_imports_torch() -> None:
    code = ("import sys; from attncli.cli import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['run', 'examples/cat_milk_sweet.yaml', '-f', 'json']); "
            "print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["self", "--help"], ["check", "--help"], ["examples"]])
def test_help_never_imports_numpy(args: list[str]) -> None:
    """The options are built from registries whose modules compute with numpy; help and the list of
    examples must not pay for importing it (attncli.lazy), nor safetensors. Checked in a fresh interpreter."""
    code = ("import sys, io, contextlib; sys.argv = ['attncli', *sys.argv[1:]]; from attncli.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try: main()\n"
            "    except SystemExit as e: code = e.code\n"
            "print(code, len(out.getvalue()) > 100, 'numpy._core' in sys.modules or 'safetensors' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "True", "False"]


def test_torch_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_mod, "torch_available", lambda: False)
    with pytest.raises(BackendError, match=r"needs PyTorch, which is not installed; install it with: pip install"):
        get_backend("torch", "cpu")
    with pytest.raises(BackendError, match="needs PyTorch"):
        get_backend(None, "cuda")
    assert get_backend(None, "auto").name == "numpy"  # auto without torch: numpy on the CPU


def test_numpy_cannot_run_on_a_gpu() -> None:
    with pytest.raises(BackendError, match="--backend numpy runs on the CPU only"):
        get_backend("numpy", "cuda")


def test_precision_option() -> None:
    res = runner.invoke(app, ["run", str(ROOT / "examples" / "cat_milk_sweet.yaml"), "--precision", "2",
                              "--steps", "weights"])
    assert res.exit_code == 0 and "0.08" in res.stdout and "0.0826" not in res.stdout


def test_float32_run_matches_float64_closely() -> None:
    x = np.random.default_rng(0).standard_normal((6, 8))
    from attncli import attend

    a, b = attend(x, dtype="float32"), attend(x, dtype="float64")
    assert a.output.dtype == np.float32 and b.output.dtype == np.float64
    np.testing.assert_allclose(a.output, b.output, rtol=1e-5, atol=1e-6)


def test_json_is_strict() -> None:
    # -inf in the masked step must not produce the non-standard token -Infinity
    res = runner.invoke(app, ["run", str(ROOT / "examples" / "cat_milk_sweet.yaml"), "--causal", "-f", "json"])
    assert "Infinity" not in res.stdout
    json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))

"""Device selection: --device cuda/mps when absent, auto falling back to the CPU.

CI has no GPU, so availability is faked with monkeypatch; the expected behaviour is the one
DESIGN.md documents (auto: CUDA, then MPS, then the CPU; a GPU requested but absent: one
line naming what was asked and what to use instead, exit 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attncli.cli import app
from attncli.core import backend
from attncli.core.backend import get_backend
from attncli.errors import BackendError

runner = CliRunner()


def fake(monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


@pytest.mark.parametrize(("cuda", "mps", "name", "device"), [
    (False, False, "numpy", "cpu"),
    (True, False, "torch", "cuda"),
    (True, True, "torch", "cuda"),
    (False, True, "torch", "mps"),
])
def test_auto_picks_cuda_then_mps_then_cpu(monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool, name: str,
                                           device: str) -> None:
    fake(monkeypatch, cuda, mps)
    be = get_backend(None, "auto")
    assert be.name == name and be.device_name() == device


def test_auto_with_torch_named_stays_torch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake(monkeypatch, False, False)
    be = get_backend("torch", "auto")
    assert be.name == "torch" and be.device == torch.device("cpu")


@pytest.mark.parametrize(("device", "message"), [
    ("cuda", "--device cuda was requested but torch.cuda.is_available() is False"),
    ("mps", "--device mps was requested but torch.backends.mps.is_available() is False"),
])
def test_absent_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, device: str, message: str) -> None:
    fake(monkeypatch, False, False)
    with pytest.raises(BackendError, match="use --device cpu or --device auto") as e:
        get_backend(None, device)
    assert message in str(e.value)


def test_numpy_on_a_gpu_is_refused() -> None:
    with pytest.raises(BackendError, match="--backend numpy runs on the CPU only"):
        get_backend("numpy", "cuda")


def test_without_torch_the_gpu_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "torch_available", lambda: False)
    with pytest.raises(BackendError, match="pip install"):
        get_backend(None, "cuda")
    assert get_backend(None, "auto").name == "numpy"  # auto without torch: the CPU


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--device", "cuda"], 2, "attncli: error: --device cuda was requested"),
    (["--device", "mps"], 2, "attncli: error: --device mps was requested"),
    (["--device", "auto", "--format", "json"], 0, '"device": "cpu"'),
    (["--device", "cuda", "--backend", "numpy"], 2, "runs on the CPU only"),
])
def test_cli_devices(monkeypatch: pytest.MonkeyPatch, examples_dir: Path, args: list[str], code: int,
                     text: str) -> None:
    fake(monkeypatch, False, False)
    r = runner.invoke(app, ["run", str(examples_dir / "cat_milk_sweet.yaml"), *args])
    assert r.exit_code == code, r.output
    assert text in r.output
    if code == 2:
        assert len(r.output.strip().splitlines()) == 1  # one line, no traceback


def test_fake_cuda_runs_the_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA faked present, auto resolves to torch on 'cuda' (no tensor is moved there)."""
    fake(monkeypatch, True, False)
    be = get_backend(None, "auto")
    assert be.name == "torch" and be.device.type == "cuda"

"""A layer of a checkpoint through the library (attncli.io.model.load_layer), no CLI: the Problem it
builds reproduces the model's own attention module (transformers, hooks), and loading installs
nothing process-wide."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_layouts import build  # noqa: E402

from attncli.core.engine import run  # noqa: E402
from attncli.core.options import Options  # noqa: E402
from attncli.io.model import load_layer  # noqa: E402

TOL = 1e-5


@pytest.mark.parametrize("name", ["llama", "gemma2", "gpt2", "bert"])
def test_problem_of_a_layer_is_the_models_attention(name: str, tmp_path: Path) -> None:
    """load_layer(...).problem(x) and problem(hidden_states[N], from_residual=True) against the module's
    own output projection output and output_attentions (float64 from the float32 model)."""
    _, got = build(name, tmp_path / "model")
    layer = load_layer(tmp_path / "model", got["layer"])
    assert layer.layer == got["layer"] and layer.projections.source.endswith(f"layer {got['layer']}")
    for x, residual in ((got["x"], False), (got["hidden"], True)):
        if residual and layer.norm is None and name != "bert":
            continue
        trace = run(layer.problem(x, from_residual=residual))
        w, y = np.asarray(trace["weights"], np.float64), np.asarray(trace["output"], np.float64)
        assert w.shape == got["weights"].shape and y.shape == got["y"].shape
        assert float(np.abs(w - got["weights"]).max()) < TOL
        assert float(np.abs(y - got["y"]).max()) < TOL


def test_options_over_the_config_and_heads_from_the_config(tmp_path: Path) -> None:
    """config.json's facts are the options (Mistral: the sliding window, causal); options given replace them."""
    _, got = build("mistral", tmp_path / "model")
    layer = load_layer(tmp_path / "model", got["layer"])
    assert layer.options["window"] == 4 and layer.options["causal"] is True and layer.heads == 4
    opts = Options().merged({k: v for k, v in layer.options.items() if k != "window"}, "test")
    w = np.asarray(run(layer.problem(got["x"], options=opts))["weights"], np.float64)
    assert np.abs(w[:, :4] - got["weights"][:, :4]).max() < TOL  # the first 4 queries see no more than 4 keys
    assert np.abs(w[:, 4:] - got["weights"][:, 4:]).max() > 1e-3  # later ones did see fewer: the window mattered


SIGNALS = [s for s in ("SIGBUS", "SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, s)]


def test_loading_a_layer_installs_no_signal_handler(tmp_path: Path) -> None:
    """The library raises and installs nothing: the handlers of SIGBUS, SIGINT, SIGTERM, SIGHUP are the same
    before and after reading a layer (safetensors, memory-mapped) and computing on it."""
    _, got = build("llama", tmp_path / "model")
    before = {s: signal.getsignal(getattr(signal, s)) for s in SIGNALS}
    caught = _caught()
    layer = load_layer(tmp_path / "model", got["layer"])
    run(layer.problem(got["x"]))
    assert {s: signal.getsignal(getattr(signal, s)) for s in SIGNALS} == before
    assert _caught() == caught  # also a handler installed through C (ctypes), which signal.getsignal cannot see


def _caught() -> dict[str, int] | None:
    """The handler address the kernel holds for each signal (sigaction through ctypes: also a handler
    installed in C, which signal.getsignal cannot see); None where libc's sigaction is not at hand."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None
    out = {}
    for s in SIGNALS:
        buf = ctypes.create_string_buffer(256)  # struct sigaction: sa_handler first
        if libc.sigaction(getattr(signal, s), None, buf) != 0:
            return None
        out[s] = ctypes.c_void_p.from_buffer(buf).value or 0
    return out

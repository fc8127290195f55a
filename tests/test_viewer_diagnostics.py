"""The viewer's diagnostics name a layer's heads (issue 33, item 2): ``attncli view`` serves, for the layer being
viewed, the same sentences as ``attncli self ... --format json``'s ``diagnostics.head_patterns`` (the tiny Llama of
tests/hf_tiny.py, whose layer 1 puts a head's weight on `<s>`: tests/test_heads_diagnostics.py checks those against
transformers' own eager weights), nothing when no head is named, and a sentence is data: shown as text, never
markup (a real browser, where chromium is installed)."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402
from test_viewer import TOKEN, get, start_view  # noqa: E402  (tests/ is on the path)
from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402
from attncli.core.options import Options  # noqa: E402
from attncli.core.problem import Problem  # noqa: E402
from attncli.render.viewer import Layer, Server, Viewer  # noqa: E402

runner = CliRunner()
TEXT = "the cat drank the milk because it was sweet the cat drank the milk"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers.utils.logging.set_verbosity_error()
    return hf_tiny.llama(tmp_path_factory.mktemp("hf") / "llama")


def stop(proc: subprocess.Popen[str]) -> None:
    import signal

    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0


def meta(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.replace("/?", "/api/meta?"), timeout=60) as r:
        assert r.headers["Content-Type"] == "application/json"
        return dict(json.loads(r.read()))


@pytest.mark.parametrize("layer", ["1", "all"])
def test_view_names_the_heads_self_names(llama: Path, tmp_path: Path, layer: str) -> None:
    want = {}
    for i in (0, 1):
        r = runner.invoke(app, ["self", "--text", TEXT, "-w", str(llama), "--layer", str(i), "--format", "json"])
        assert r.exit_code == 0, r.stderr
        want[i] = [(d["head"], d["patterns"], d["sentence"]) for d in json.loads(r.stdout)["diagnostics"]["head_patterns"]]
    assert any("sink" in p and "of its weight on `<s>`" in s for _, p, s in want[1])  # the case this test is about
    proc, url = start_view(["--text", TEXT, "-w", str(llama), "--layer", layer], tmp_path)
    try:
        layers = meta(url)["layers"]
    finally:
        stop(proc)
    shown = [[(d["head"], d["patterns"], d["sentence"]) for d in x["head_patterns"]] for x in layers]
    assert shown == ([want[1]] if layer == "1" else [want[0], want[1]])


def test_no_sentence_for_a_layer_whose_heads_are_not_named(tmp_path: Path) -> None:
    """Matrices of no model (no capture): no head is named, the diagnostics stay empty."""
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((2, 12, 4)))
    proc, url = start_view([str(tmp_path / "x.npy"), "--causal"], tmp_path)
    try:
        assert [x["head_patterns"] for x in meta(url)["layers"]] == [[]]
    finally:
        stop(proc)


HOSTILE = "head 0: sink — 0.91 of its weight on `<script>window.pwned=1</script><img src=x onerror=window.pwned=2>`"


def test_a_sentence_is_data_not_markup(browser: Any) -> None:
    """A label from a file (here one that is markup) reaches the page as JSON and is shown as its text."""
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 4))
    layer = Layer(Problem.build(x, options=Options().merged({"causal": True}, "test")), "layer 1")
    layer.named = [{"head": 0, "patterns": ["sink"], "values": {"sink": 0.91}, "sentence": HOSTILE}]
    server = Server(Viewer([layer], TOKEN), 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, body = get(server, "/api/meta")
        assert code == 200 and json.loads(body)["layers"][0]["head_patterns"][0]["sentence"] == HOSTILE
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{server.server_address[1]}/?token={TOKEN}")
        page.wait_for_selector("#diagnostics:not([hidden])", timeout=30_000)
        assert page.eval_on_selector("#diagnostics", "e => [...e.children].map((d) => d.textContent)") == ["· " + HOSTILE]
        assert page.eval_on_selector("#diagnostics", "e => e.querySelectorAll('script, img').length") == 0
        assert page.evaluate("() => window.pwned === undefined") and not errors
    finally:
        server.shutdown()
        server.server_close()

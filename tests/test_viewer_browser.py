"""``attncli view`` in a real browser (Debian's chromium driven headless by playwright; skipped only
when either is missing): the grid of a 32-head, 2048-token layer, zooming down to a cell and its
arithmetic (compared with ``--format json --explain`` of that cell), the head view's lines (against
a float64 softmax computed here), and the model view of a tiny 4-layer model (against transformers'
own attention weights and ``attncli self --layer 2 --head 3``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_viewer import start_view  # noqa: E402  (tests/ is on the path)
from typer.testing import CliRunner

from attncli.cli import app

runner = CliRunner()




def stop(proc: subprocess.Popen[str]) -> None:
    import signal

    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 0


def opened(browser: Any, url: str) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return page, errors


def explanation(page: Any, i: int, j: int | None) -> list[str]:
    page.wait_for_function(f"() => document.getElementById('explain').dataset.i === '{i}' && "
                           f"document.getElementById('explain').dataset.j === '{'' if j is None else j}'",
                           timeout=60_000)
    return [page.inner_text("#explain-heading"),
            *page.eval_on_selector("#explain", "e => [...e.children].map((line) => line.textContent)")]


def click_cell(page: Any, i: int, j: int) -> None:
    d = page.eval_on_selector("#focus", "e => ({...e.dataset})")
    box = page.locator("#focus").bounding_box()
    cell = float(d["cell"])
    x = box["x"] + float(d["ml"]) + (j - float(d["c0"]) + 0.5) * cell
    y = box["y"] + float(d["mt"]) + (i - float(d["r0"]) + 0.5) * cell
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.up()


@pytest.mark.slow
def test_a_real_size_layer_grid_zoom_and_a_cells_arithmetic(tmp_path: Path, browser: Any) -> None:
    x = np.random.default_rng(7).standard_normal((1, 32, 2048, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    proc, url = start_view([str(tmp_path / "x.npy"), "--causal"], tmp_path)
    try:
        page, errors = opened(browser, url)
        page.wait_for_function("() => { const im = [...document.querySelectorAll('#grid img')]; return im.length === 32 "
                               "&& im.every((i) => i.complete && i.naturalWidth > 0); }", timeout=180_000)
        assert page.locator("#grid figure").count() == 32
        page.click('#grid figure[data-entry="5"]')
        page.wait_for_selector("#focus-section:not([hidden])")
        box = page.locator("#focus").bounding_box()
        d = page.eval_on_selector("#focus", "e => ({...e.dataset})")
        # the wheel over map position (row 1000, key 900), until cells are at least 14 pixels
        page.mouse.move(box["x"] + float(d["ml"]) + 900 / 2048 * 640, box["y"] + float(d["mt"]) + 1000 / 2048 * 640)
        for _ in range(40):
            if float(page.eval_on_selector("#focus", "e => e.dataset.cell")) >= 14:
                break
            page.mouse.wheel(0, -100)
            page.wait_for_timeout(30)
        d = page.eval_on_selector("#focus", "e => ({...e.dataset})")
        assert float(d["cell"]) >= 14
        page.wait_for_function("() => document.getElementById('focus').dataset.ready !== undefined", timeout=60_000)
        i, j = int(float(d["r0"])) + 5, int(float(d["c0"])) + 3
        assert j <= i  # below the diagonal: a key that takes part
        click_cell(page, i, j)
        shown = explanation(page, i, j)
        assert shown[0] == f"Explain weight(q{i}, k{j}) (batch 0, head 5)"
        assert errors == []
    finally:
        stop(proc)
    # the same cell from the CLI's --format json (head 5 alone: heads do not mix)
    np.save(tmp_path / "h5.npy", x[:, 5:6])
    r = runner.invoke(app, ["run", str(tmp_path / "h5.npy"), "--causal", "-f", "json", "--explain", f"0,0:{i},{j}"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["explanations"][0]
    assert shown[1:] == e["lines"]


def test_the_arithmetic_panel_wraps_at_word_boundaries(tmp_path: Path, browser: Any) -> None:
    """With RoPE a cell's arithmetic has lines of 1,000+ pixels: the panel wraps them (no sideways scroll),
    never inside a token, and its lines are --explain's lines."""
    x = np.random.default_rng(3).standard_normal((1, 2, 16, 64))
    np.save(tmp_path / "x.npy", x)
    proc, url = start_view([str(tmp_path / "x.npy"), "--dtype", "float64", "--rope", "half", "--causal"], tmp_path)
    try:
        page, errors = opened(browser, url)
        page.wait_for_selector("#grid figure")
        page.click('#grid figure[data-entry="1"]')
        page.wait_for_selector("#focus-section:not([hidden])")
        page.wait_for_function("() => document.getElementById('focus').dataset.ready !== undefined", timeout=60_000)
        click_cell(page, 12, 5)
        shown = explanation(page, 12, 5)
        panel = page.eval_on_selector("#explain", "e => ({scroll: e.scrollWidth, client: e.clientWidth, "
                                                  "rows: [...e.children].map((d) => d.getClientRects().length && "
                                                  "Math.round(d.getBoundingClientRect().height))})")
        # every token drawn whole: a span's box stays on one row
        split = page.eval_on_selector_all("#explain .t", "ts => ts.filter((t) => t.getClientRects().length > 1).length")
        assert errors == []
    finally:
        stop(proc)
    assert panel["scroll"] <= panel["client"] + 1, panel  # no sideways scrolling
    assert max(panel["rows"]) > 20, "some line is long enough to wrap"
    assert split == 0
    np.save(tmp_path / "h1.npy", x[:, 1:2])
    r = runner.invoke(app, ["run", str(tmp_path / "h1.npy"), "--dtype", "float64", "--rope", "half", "--causal",
                            "-f", "json", "--explain", "0,0:12,5"])
    assert r.exit_code == 0, r.output
    assert shown[1:] == json.loads(r.stdout)["explanations"][0]["lines"]


def softmax(x: np.ndarray) -> np.ndarray:
    s = x @ x.T / np.sqrt(x.shape[-1])  # (T, d) x (d, T) -> (T, T)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_head_view_draws_lines_for_64_tokens(tmp_path: Path, browser: Any) -> None:
    x = np.random.default_rng(8).standard_normal((1, 2, 64, 4))
    np.save(tmp_path / "x.npy", x)
    proc, url = start_view([str(tmp_path / "x.npy"), "--dtype", "float64"], tmp_path)
    try:
        page, errors = opened(browser, url)
        page.wait_for_selector("#grid figure")
        page.click("#tab-heads")
        page.wait_for_selector("#heads svg line", state="attached", timeout=60_000)
        lines = page.eval_on_selector_all("#heads svg line", "ls => ls.map((l) => [+l.dataset.head, +l.dataset.q, "
                                                              "+l.dataset.k, +l.dataset.w])")
        assert errors == []
    finally:
        stop(proc)
    assert {h for h, *_ in lines} == {0, 1}
    for h in (0, 1):
        w = softmax(x[0, h])
        for i in range(64):
            mine = [(k, wt) for hh, q, k, wt in lines if hh == h and q == i]
            k, wt = max(mine, key=lambda t: t[1])
            assert k == int(np.argmax(w[i])) and wt == pytest.approx(w[i].max(), abs=1e-4)
            want = sorted(j for j in np.argsort(-w[i])[:8] if w[i, j] >= 0.02)
            assert sorted(kk for kk, _ in mine) == want


@pytest.mark.slow
def test_model_view_opens_layer_2_head_3(tmp_path: Path, browser: Any) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=24, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50, max_position_embeddings=64)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(tmp_path / "model")
    ids = (torch.arange(12) * 7 % 50)[None]
    with torch.no_grad():
        res = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    hidden = torch.stack(res.hidden_states).numpy().astype(np.float32)  # (5, 1, 12, 32)
    np.save(tmp_path / "hidden.npy", hidden)
    want = res.attentions[2][0, 3].double().numpy()  # transformers' own weights, layer 2, head 3
    proc, url = start_view([str(tmp_path / "hidden.npy"), "--weights", str(tmp_path / "model"), "--layer", "all",
                            "--from-residual"], tmp_path)
    try:
        page, errors = opened(browser, url)
        page.wait_for_function("() => { const im = [...document.querySelectorAll('#model img')]; return im.length === 16 "
                               "&& im.every((i) => i.complete && i.naturalWidth > 0); }", timeout=120_000)
        page.click('#model img[data-layer="2"][data-entry="3"]')
        page.wait_for_selector("#focus-section:not([hidden])")
        state = page.evaluate("() => [window.attncliView.layer, window.attncliView.entry]")
        title = page.inner_text("#focus-title")
        cells = page.evaluate("""async () => {
            const t = new URLSearchParams(location.search).get('token');
            const r = await fetch(`/api/cells?token=${t}&layer=2&entry=0,3&step=weights&r0=0&r1=12&c0=0&c1=12`);
            return (await r.json()).values; }""")
        assert errors == []
    finally:
        stop(proc)
    assert state == [2, 3] and title.startswith("layer 2, head 3:")  # one batch entry: not named
    got = np.array([[0.0 if v is None else v for v in row] for row in cells])
    assert np.abs(got - want).max() < 1e-5
    np.save(tmp_path / "h2.npy", hidden[2])
    r = runner.invoke(app, ["self", str(tmp_path / "h2.npy"), "--weights", str(tmp_path / "model"), "--layer", "2",
                            "--from-residual", "--head", "3", "-f", "json"])
    assert r.exit_code == 0, r.output
    cli = np.array(json.loads(r.stdout)["weights"])[0, 3]
    assert np.abs(got - cli).max() < 1e-6  # the same float32 pipeline, a block of rows at a time

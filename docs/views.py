"""Make the README's pictures of the views (issue 21), each by the command shown beside it:

    python docs/views.py            # needs chromium + playwright; transformers for the model view

docs/view_grid.png   attncli view x.npy --causal        (32 heads × 2048 tokens: the grid)
docs/view_cell.png   the same, zoomed into head 5 and a cell clicked (its arithmetic)
docs/view_heads.png  attncli view words.npy --labels ... (the head view, 24 tokens, 4 heads)
docs/view_model.png  attncli view hidden.npy --weights tiny-llama --layer all --from-residual
docs/notebook.png    attncli.attend(...) as a Jupyter cell shows it (_repr_html_)

The inputs are made here: positions encoded with sines and cosines at a different scale per head
(so each head attends to a band of its own width), and a tiny random Llama saved with
save_pretrained. Pictures are saved as 256-colour PNGs (small).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def positions(T: int, d: int, scale: float) -> np.ndarray:
    """Sinusoidal position codes (T, d), times ``scale``: q·k is large for nearby positions."""
    pos = np.arange(T)[:, None]
    freq = 1.0 / (64.0 ** (np.arange(d // 2) / (d // 2)))
    return scale * np.concatenate([np.sin(pos * freq), np.cos(pos * freq)], axis=1)


def start(args: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "attncli", "view", *args, "--no-open"], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split(": ", 1)[1].strip()


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def save(page: object, name: str, clip: dict[str, float] | None = None) -> None:
    from PIL import Image

    raw = DOCS / f".{name}.raw.png"
    page.screenshot(path=str(raw), clip=clip)  # type: ignore[attr-defined]
    Image.open(raw).convert("RGB").quantize(256).save(DOCS / name, optimize=True)
    raw.unlink()
    print(f"docs/{name}: {(DOCS / name).stat().st_size // 1024} KB")


def main() -> None:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    tmp = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(0)
    x = np.stack([positions(2048, 16, s) + 0.3 * rng.standard_normal((2048, 16)) for s in np.linspace(0.6, 3.0, 32)])
    np.save(tmp / "x.npy", x[None].astype(np.float32))  # (1, 32, 2048, 16)
    words = "the cat sat on the mat because it was warm and the dog lay by the door since it was cold too .".split()
    np.save(tmp / "words.npy", np.stack([positions(len(words), 8, s) + 0.4 * rng.standard_normal((len(words), 8))
                                         for s in (0.8, 1.4, 2.0, 2.6)])[None])
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = b.new_page(viewport={"width": 1180, "height": 760})
        proc, url = start(["x.npy", "--causal"], tmp)
        try:
            page.goto(url)
            page.wait_for_function("() => { const im = [...document.querySelectorAll('#grid img')]; return im.length "
                                   "=== 32 && im.every((i) => i.complete && i.naturalWidth > 0); }", timeout=300_000)
            save(page, "view_grid.png")
            page.click('#grid figure[data-entry="5"]')
            box = page.locator("#focus").bounding_box()
            page.mouse.move(box["x"] + 96 + 640 * 0.52, box["y"] + 80 + 640 * 0.55)
            for _ in range(19):
                page.mouse.wheel(0, -100)
                page.wait_for_timeout(40)
            page.wait_for_timeout(1500)
            d = page.eval_on_selector("#focus", "e => ({...e.dataset})")
            cell = float(d["cell"])
            i, j = int(float(d["r0"])) + 8, int(float(d["c0"])) + 4
            page.mouse.click(box["x"] + 96 + (j - float(d["c0"]) + 0.5) * cell,
                             box["y"] + 80 + (i - float(d["r0"]) + 0.5) * cell)
            page.wait_for_function("() => document.getElementById('explain').dataset.i !== undefined")
            page.wait_for_timeout(800)
            save(page, "view_cell.png")
        finally:
            stop(proc)
        proc, url = start(["words.npy", "--labels", ",".join(words)], tmp)
        try:
            page.goto(url)
            page.wait_for_selector("#grid figure")
            page.click("#tab-heads")
            page.wait_for_selector("#heads svg line", state="attached")
            save(page, "view_heads.png")
        finally:
            stop(proc)
        try:
            import torch
            import transformers
        except ImportError:
            print("transformers missing: no model view picture")
        else:
            torch.manual_seed(0)
            config = transformers.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                              num_attention_heads=8, num_key_value_heads=4, vocab_size=100)
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
            model.save_pretrained(tmp / "tiny-llama")
            with torch.no_grad():
                res = model(input_ids=(torch.arange(40) * 7 % 100)[None], output_hidden_states=True)
            np.save(tmp / "hidden.npy", torch.stack(res.hidden_states).numpy())
            proc, url = start(["hidden.npy", "--weights", "tiny-llama", "--layer", "all", "--from-residual"], tmp)
            try:
                page.goto(url)
                page.wait_for_function("() => { const im = [...document.querySelectorAll('#model img')]; return "
                                       "im.length === 32 && im.every((i) => i.complete && i.naturalWidth > 0); }")
                save(page, "view_model.png", {"x": 0, "y": 0, "width": 820, "height": 430})
            finally:
                stop(proc)
        sys.path.insert(0, str(ROOT))
        import attncli

        q = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=float)
        cell = attncli.attend(q, query_labels=["cat", "milk", "it", "sweet"], key_labels=["cat", "milk", "it", "sweet"]
                              )._repr_html_()
        page.set_content("<html><body style='margin:16px;font-family:monospace'><div style='color:#999'>In [3]: "
                         "attncli.attend(q, query_labels=words, key_labels=words)</div><div style='color:#999'>Out[3]:"
                         f"</div>{cell}</body></html>")
        page.frames[1].wait_for_selector("table.qk td")
        page.frames[1].click('table.qk[data-step="weights"] td[data-q="3"][data-k="2"]')
        page.wait_for_timeout(300)
        save(page, "notebook.png", {"x": 0, "y": 0, "width": 1180, "height": 640})
        b.close()
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()

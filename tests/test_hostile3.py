"""Hostile inputs, round three (issue 22): text from files is data in every output; readers that
never block and never read without bound; options whose values used to crash (exit 70).

The escaping tests feed tensor names, folder names, ``model_type`` and labels holding control
characters, bidi overrides, HTML and LaTeX specials to every output, and parse each output back with
an independent parser (xml.etree for SVG, markdown-it's CommonMark renderer for Markdown, html.parser
for the page) to show nothing live came through. The refusal table runs each case in a child process
under an address-space cap and a time limit.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import unicodedata
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.render import escape

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

HOSTILE = ("\x1b]52;c;aGk=\x07\x1b[2J\u202e<img src=x onerror=alert(2)></script><script>alert(1)</script>"
           "$\\&%_#{}^~[x](javascript:alert(3))")
LABELS = ["<img src=x onerror=alert(2)>", "</script><script>alert(1)</script>", "[x](javascript:alert(3))",
          "a\x1b[2Jb\u202ec\u2066d", "$\\x$ & % _ ^ ~ {} #", "<b>bold</b>"]


def invisible(text: str) -> list[str]:
    """Characters a terminal acts on or a reader cannot see: C0/C1 controls (but newline) and format
    characters (bidi overrides and isolates, zero-width ones), by Unicode category."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]


def llama_layer(folder: Path, prefix: str = "model", E: int = 8, config: dict[str, Any] | None = None) -> Path:
    """A one-layer Llama-style safetensors checkpoint whose tensor names start with ``prefix``."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    save_file({f"{prefix}.layers.0.self_attn.{n}.weight": rng.standard_normal((E, E)).astype(np.float32)
               for n in ("q_proj", "k_proj", "v_proj", "o_proj")}, str(folder / "model.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


class Tags(HTMLParser):
    """Every start tag an HTML parser sees, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def tags_of(html_text: str) -> Tags:
    p = Tags()
    p.feed(html_text)
    p.close()
    return p


# ---------------------------------------------------------------- 1. text from files is data

def test_each_helper_leaves_nothing_live() -> None:
    t = escape.terminal(HOSTILE)
    assert invisible(t) == [] and "\\x1b" in t and "\\u202e" in t
    assert [tag for tag, _ in tags_of(escape.html(HOSTILE)).tags] == []
    ET.fromstring(f'<svg a="{escape.xml(HOSTILE)}">{escape.xml(HOSTILE)}</svg>')  # parses: no control character
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    tokens = [c for t in md.parse(escape.markdown(HOSTILE)) for c in (t.children or [t])]
    assert not [t.type for t in tokens if t.type in ("html_inline", "html_block", "link_open", "image")]
    tex = escape.latex(HOSTILE)  # every LaTeX special behind a backslash; no brace left unbalanced
    assert not re.search(r"(?<!\\)[$&%#_^~<>]", tex.replace(r"\textless{}", "").replace(r"\textgreater{}", ""))
    assert brace_balance(tex) == 0


def brace_balance(tex: str) -> int:
    depth = 0
    for m in re.finditer(r"\\.|[{}]", tex):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
            assert depth >= 0, tex
    return depth


@pytest.fixture(scope="module")
def hostile_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("hostile3")
    named = llama_layer(base / "names", prefix="model" + HOSTILE.replace(".", ","))
    folder = llama_layer(base / "m\x1b[31m<b>\u202e", config={
        "model_type": "llama\x1b]0;pwn\x07<i>", "num_attention_heads": 2, "hidden_size": 8,
        "torch_dtype": "float32\x1b[2J<script>"})
    x = base / "x.npy"
    np.save(x, np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32))
    return {"file": named / "model.safetensors", "folder": folder, "x": x, "base": base}


def test_inspect_shows_names_model_type_and_folder_visibly(hostile_checkpoint: dict[str, Path]) -> None:
    for target in (hostile_checkpoint["file"], hostile_checkpoint["folder"]):
        r = runner.invoke(app, ["inspect", str(target)])
        assert r.exit_code == 0, r.output
        assert invisible(r.stdout) == [], r.stdout
        assert "\\x1b" in r.stdout and "\\u202e" in r.stdout
    r = runner.invoke(app, ["inspect", str(hostile_checkpoint["folder"]), "--format", "json"])
    info = json.loads(r.stdout)  # JSON keeps the name exactly, escaped by the JSON encoder
    assert info["model_type"] == "llama\x1b]0;pwn\x07<i>" and invisible(r.stdout) == []


def test_self_view_svg_page_markdown_latex_of_a_hostile_checkpoint(hostile_checkpoint: dict[str, Path]) -> None:
    base, x = hostile_checkpoint["base"], str(hostile_checkpoint["x"])
    svg, page = base / "v.svg", base / "v.html"
    r = runner.invoke(app, ["self", x, "--weights", str(hostile_checkpoint["file"]), "--heads", "2", "--svg", str(svg),
                            "--html", str(page)])
    assert r.exit_code == 0, r.output
    assert "W_q (from model" in r.stdout and invisible(r.stdout) == []
    tree = ET.parse(svg)  # parses as XML whatever the names
    texts = "".join(tree.getroot().itertext())
    assert "\\x1b" in texts and invisible(texts) == [] and "<img" in texts.replace("\xa0", " ")  # as text, not a tag
    check_page(page.read_text(encoding="utf-8"))
    for fmt in ("markdown", "latex"):
        r = runner.invoke(app, ["self", x, "--weights", str(hostile_checkpoint["file"]), "--heads", "2", "--format", fmt])
        assert r.exit_code == 0, r.output
        assert invisible(r.stdout) == []
        (check_markdown if fmt == "markdown" else check_latex)(r.stdout)


def check_page(text: str) -> None:
    p = tags_of(text)
    allowed = {"html", "head", "meta", "title", "style", "body", "header", "h1", "div", "label", "select", "main",
               "section", "aside", "h2", "p", "script"}
    assert {t for t, _ in p.tags} <= allowed
    assert sum(t == "script" for t, _ in p.tags) == 2  # the data and the program, no third
    data = json.loads(p.scripts[0])
    assert invisible(json.dumps(data, ensure_ascii=False)) == []


def check_markdown(text: str) -> None:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    tokens = [c for t in md.parse(text) for c in (t.children or [t])]
    assert not [t.content for t in tokens if t.type in ("html_inline", "html_block")]
    assert not [t for t in tokens if t.type in ("link_open", "image")]
    rendered = tags_of(md.render(text))
    assert {t for t, _ in rendered.tags} <= {"h2", "h3", "p", "em", "strong", "code", "br"}


def check_latex(text: str) -> None:
    assert brace_balance(text) == 0  # no label closes a group it did not open
    assert not re.search(r"\\text\{[^{}]*[<>]", text)  # in text mode < and > are \textless{}, \textgreater{}
    assert r"\backslash _" not in text  # a label's _ is \_, not a subscript of a backslash
    assert not re.search(r"(?<!\\)[#%]", text)  # a label's # or % would be a parameter or a comment


def test_labels_with_html_and_latex_in_markdown_latex_page_and_svg(tmp_path: Path) -> None:
    q = [[1, 0], [0, 1], [1, 1], [0.5, 0.2], [0.3, 0.9], [0.2, 0.1]]
    problem = tmp_path / "lab.json"
    problem.write_text(json.dumps({"q": q, "k": q, "v": q, "labels": LABELS}), encoding="utf-8")
    for fmt, check in (("markdown", check_markdown), ("latex", check_latex)):
        r = runner.invoke(app, ["run", str(problem), "--format", fmt, "--explain", "1,2", "--explain-row", "0"])
        assert r.exit_code == 0, r.output
        assert invisible(r.stdout) == []
        check(r.stdout)
    r = runner.invoke(app, ["run", str(problem), "--svg", str(tmp_path / "l.svg"), "--html", str(tmp_path / "l.html")])
    assert r.exit_code == 0, r.output
    ET.parse(tmp_path / "l.svg")
    check_page((tmp_path / "l.html").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- the refusal table, in child processes

MiB = 1 << 20


def _cap(limit: int) -> Any:
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return set_limit


def child(command: str, folder: Path, memory: int, seconds: float) -> subprocess.CompletedProcess[str]:
    """``command`` (bash, for process substitution) run in ``folder`` with its own HOME, under an
    address-space cap and a time limit; attncli is this interpreter's."""
    env = {**os.environ, "HOME": str(folder), "PYTHONPATH": str(ROOT), "COLUMNS": "100",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=seconds, preexec_fn=_cap(memory))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty working folder holding the inputs the table's commands name."""
    d = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(3)
    np.save(d / "q.npy", rng.standard_normal((3, 4)))
    np.save(d / "k.npy", rng.standard_normal((5, 4)))
    (d / "qk.json").write_text(json.dumps({"q": rng.standard_normal((3, 4)).tolist(),
                                           "k": rng.standard_normal((5, 4)).tolist()}), encoding="utf-8")
    os.mkfifo(d / "fifo.npy")  # nobody ever writes to it
    os.mkfifo(d / "fifo.json")
    for name in ("zero.npy", "zero.json", "zero.csv", "zero.pt"):
        os.symlink("/dev/zero", d / name)
    (d / "deep.txt").write_text('{"factor": ' + "[" * 30_000 + "]" * 30_000 + "}", encoding="utf-8")
    (d / "big.txt").write_text('{"rope_type": "linear", "factor": ' + "9" * 400 + "}", encoding="utf-8")
    np.save(d / "no_sink.npy", np.array([-np.inf]))
    return d


# (id, command, expected exit code, words the message must name, memory cap, seconds)
REFUSALS: list[tuple[str, str, int, tuple[str, ...], int, float]] = [
    ("fifo-no-writer", "attncli run fifo.npy", 2, ("fifo.npy", "empty", "pipe"), 512 * MiB, 20),
    ("fifo-json-no-writer", "attncli run qk.json --sinks fifo.json", 2, ("fifo.json", "empty"), 512 * MiB, 20),
    ("dev-zero-npy", "attncli run zero.npy", 2, ("zero.npy", "device"), 512 * MiB, 20),
    ("dev-zero-json", "attncli run zero.json", 2, ("zero.json", "device"), 512 * MiB, 20),
    ("dev-zero-pt", "attncli run zero.pt", 2, ("zero.pt", "device"), 512 * MiB, 20),
    ("dev-zero-sinks", "attncli run qk.json --sinks zero.csv", 2, ("zero.csv", "device"), 512 * MiB, 20),
    ("dev-zero-slopes", "attncli run qk.json --alibi --alibi-slopes zero.csv", 2, ("zero.csv", "device"), 512 * MiB, 20),
    ("substituted-zeros", "attncli run <(cat /dev/zero)", 2, ("/dev/fd/", "more than"), 512 * MiB, 20),
    ("substituted-zeros-npy-name", "attncli run q.npy <(cat /dev/zero)", 2, ("/dev/fd/",), 512 * MiB, 20),
    ("substituted-zero-sinks", "attncli run qk.json --sinks <(cat /dev/zero)", 2, ("/dev/fd/", "per head"),
     512 * MiB, 20),
    ("substituted-big-sinks", "attncli run qk.json --sinks <(seq 1 400000)", 2, ("/dev/fd/", "per head"),
     512 * MiB, 20),
    # options that crashed with exit 70
    ("window-10**30", f"attncli run qk.json --window {10**30}", 2, ("--window", "sliding window"), 512 * MiB, 20),
    ("q-offset-2**63", f"attncli run qk.json --causal --q-offset {2**63}", 2, ("--q-offset",), 512 * MiB, 20),
    ("rope-scaling-30000-deep", 'attncli run qk.json --rope half --rope-scaling "$(cat deep.txt)"', 2,
     ("--rope-scaling", "nested too deeply"), 512 * MiB, 20),
    ("rope-scaling-400-digits", 'attncli run qk.json --rope half --rope-scaling "$(cat big.txt)"', 2,
     ("--rope-scaling", "factor", "finite"), 512 * MiB, 20),
    ("llama3-low-freq-0", "attncli run qk.json --rope half --rope-scaling '{\"rope_type\": \"llama3\", \"factor\": 8, "
     "\"low_freq_factor\": 0, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}'", 2,
     ("--rope-scaling", "low_freq_factor"), 512 * MiB, 20),
    ("llama3-high-equals-low", "attncli run qk.json --rope half --rope-scaling '{\"rope_type\": \"llama3\", \"factor\": 8, "
     "\"low_freq_factor\": 4, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}'", 2,
     ("--rope-scaling", "high_freq_factor"), 512 * MiB, 20),
    ("yarn-beta-slow-1", "attncli run qk.json --rope half --rope-scaling '{\"rope_type\": \"yarn\", \"factor\": 4, "
     "\"beta_slow\": -1, \"original_max_position_embeddings\": 4096}'", 2, ("--rope-scaling", "beta_slow"),
     512 * MiB, 20),
    ("yarn-original-0", "attncli run qk.json --rope half --rope-scaling '{\"rope_type\": \"yarn\", \"factor\": 4, "
     "\"original_max_position_embeddings\": 0}'", 2, ("--rope-scaling", "original_max_position_embeddings"),
     512 * MiB, 20),
    ("figsize-1e-9", "attncli run qk.json --figsize 1e-9,1e-9 --plot p.png", 2, ("--figsize", "inches"), 1 << 30, 30),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused_in_one_line(case: tuple[str, str, int, tuple[str, ...], int, float], corpus: Path) -> None:
    _, command, code, words, memory, seconds = case
    before = sorted(p.name for p in corpus.iterdir())
    r = child(command, corpus, memory, seconds)
    assert r.returncode == code, (r.returncode, r.stderr[-600:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and "Traceback" not in r.stderr, r.stderr[-600:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == "" and sorted(p.name for p in corpus.iterdir()) == before  # nothing written


def sdpa64(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(Q Kᵀ / √d) V in float64, written out here."""
    s = q @ k.T / np.sqrt(q.shape[-1])  # (m, d) x (d, n) -> (m, n)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v  # (m, n) x (n, d_v) -> (m, d_v)


def output_of(stdout: str) -> np.ndarray:
    steps = {s["name"]: s for s in json.loads(stdout)["steps"]}
    return np.asarray(steps["output"]["values"], dtype=np.float64)


def test_process_substitution_is_read_once(corpus: Path) -> None:
    r = child("attncli run <(cat q.npy) <(cat k.npy) --format json", corpus, 1 << 30, 20)
    assert r.returncode == 0, r.stderr
    q, k = np.load(corpus / "q.npy"), np.load(corpus / "k.npy")
    np.testing.assert_allclose(output_of(r.stdout), sdpa64(q, k, k), rtol=1e-6, atol=1e-9)


@pytest.mark.slow
def test_torch_file_from_process_substitution_is_read_once(corpus: Path) -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    torch.save({"q": q, "k": k, "v": v}, corpus / "qkv.pt")
    try:
        r = child("attncli run <(cat qkv.pt) --format json", corpus, 1 << 30, 60)
    finally:
        (corpus / "qkv.pt").unlink()
    assert r.returncode == 0, r.stderr
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v).numpy()
    np.testing.assert_allclose(output_of(r.stdout), want, rtol=1e-6, atol=1e-9)


def test_no_sink_in_json_is_null_and_changes_nothing(corpus: Path) -> None:
    """--help: a sink of -inf is no sink. JSON spells it null (as every non-finite number); the weights are the
    plain softmax's."""
    r = child("attncli run qk.json --sinks no_sink.npy --format json", corpus, 1 << 30, 20)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sinks"] == [None]
    qk = json.loads((corpus / "qk.json").read_text(encoding="utf-8"))
    q, k = np.asarray(qk["q"]), np.asarray(qk["k"])
    np.testing.assert_allclose(output_of(r.stdout), sdpa64(q, k, k), rtol=1e-9, atol=1e-12)

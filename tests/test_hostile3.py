"""Hostile inputs, round three (issue 22): text from files is data in every output; readers that
never block and never read without bound; options whose values used to crash (exit 70).

The escaping tests feed tensor names, folder names, ``model_type`` and labels holding control
characters, bidi overrides, HTML and LaTeX specials to every output, and parse each output back with
an independent parser (xml.etree for SVG, markdown-it's CommonMark renderer for Markdown, html.parser
for the page) to show nothing live came through. The refusal table runs each case in a child process
under an address-space cap and a time limit.
"""

from __future__ import annotations

import html
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
    r = runner.invoke(app, ["self", x, "--weights", str(hostile_checkpoint["file"]), "--heads", "2",
                            "--layout", "llama", "--svg", str(svg),
                            "--html", str(page)])
    assert r.exit_code == 0, r.output
    assert "W_q (from model" in r.stdout and invisible(r.stdout) == []
    tree = ET.parse(svg)  # parses as XML whatever the names
    texts = "".join(tree.getroot().itertext())
    assert "\\x1b" in texts and invisible(texts) == [] and "<img" in texts.replace("\xa0", " ")  # as text, not a tag
    check_page(page.read_text(encoding="utf-8"))
    for fmt in ("markdown", "latex"):
        r = runner.invoke(app, ["self", x, "--weights", str(hostile_checkpoint["file"]), "--heads", "2",
                            "--layout", "llama", "--format", fmt])
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
    checkpoints(d)
    return d


def raw_safetensors(path: Path, header: bytes | str, data: bytes = b"") -> None:
    """A .safetensors file written by hand: 8-byte little-endian length, the header as given, data."""
    h = header.encode() if isinstance(header, str) else header
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


def entry(dtype: Any = '"F32"', shape: Any = "[1]", offsets: Any = "[0, 4]") -> str:
    return f'{{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}'


def checkpoints(d: Path) -> None:
    """The checkpoint corpus of issue 22: headers with wrong types, huge numbers, a tensor named twice;
    indexes whose weight_map lies, that are devices, whose shards are a folder or a FIFO; a model folder
    whose weights are a FIFO; a real layer saved as .safetensors and .pt (read through pipes)."""
    for name, one in (("dtype-list", entry(dtype='["F32"]')), ("dtype-map", entry(dtype='{"F32": 1}')),
                      ("shape-5000", entry(shape="[" + "9" * 5000 + "]")),
                      ("offsets-5000", entry(offsets="[0, " + "9" * 5000 + "]")),
                      ("twice", entry() + ', "a": ' + entry())):
        raw_safetensors(d / f"{name}.safetensors", '{"a": ' + one + "}", b"\0" * 4)
    llama_layer(d / "layer")
    for name, value in (("number", 1), ("null", None), ("list", ["layer.safetensors"]), ("mapping", {"a": 1})):
        folder = d / f"map-{name}"
        folder.mkdir()
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.layers.0.self_attn.q_proj.weight": value}}), encoding="utf-8")
    os.symlink("/dev/zero", d / "zero.index.json")
    (d / "zero-index").mkdir()
    os.symlink("/dev/zero", d / "zero-index" / "model.safetensors.index.json")
    for kind in ("dir", "fifo"):
        folder = d / f"shard-{kind}"
        folder.mkdir()
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"model.layers.0.self_attn.q_proj.weight": "s.safetensors"}}), encoding="utf-8")
        (os.mkdir if kind == "dir" else os.mkfifo)(folder / "s.safetensors")
    for name, extra in (("rotary-3", {"rotary_dim": 3, "partial_rotary_factor": None}),
                        ("eps-minus-1", {"rms_norm_eps": -1})):
        llama_layer(d / f"cfg-{name}", config={**LLAMA, **extra})
    from safetensors.numpy import load_file, save_file

    with_norm = load_file(str(d / "cfg-eps-minus-1" / "model.safetensors"))
    with_norm["model.layers.0.input_layernorm.weight"] = np.ones(8, np.float32)
    save_file(with_norm, str(d / "cfg-eps-minus-1" / "model.safetensors"))
    np.save(d / "h.npy", np.random.default_rng(6).standard_normal((3, 8)))
    np.save(d / "slopes3.npy", np.ones(3))
    np.save(d / "slopes-nan.npy", np.array([np.nan]))
    round_two(d)
    (d / "fifo-model").mkdir()
    os.mkfifo(d / "fifo-model" / "model.safetensors")
    (d / "fifo-model" / "config.json").write_text(json.dumps(LLAMA), encoding="utf-8")


def round_two(d: Path) -> None:
    """Round two's leftovers: a YAML merge key inside options, 1_000, heads: 0 in a file, 33-dimension arrays."""
    q = "q: [[1.0, 0.0], [0.0, 1.0]]\n"
    (d / "merge.yaml").write_text(q + "options:\n  <<: {temperature: 2}\n  causal: true\n", encoding="utf-8")
    (d / "underscore.yaml").write_text(q + "options:\n  window: 1_000\n", encoding="utf-8")
    (d / "underscore-q.yaml").write_text("q: [[1_000, 0.0], [0.0, 1.0]]\n", encoding="utf-8")
    (d / "heads0.yaml").write_text("x: [[1.0, 0.0], [0.0, 1.0]]\nheads: 0\n", encoding="utf-8")
    (d / "d33.yaml").write_text("q: " + "[" * 33 + "1.0" + "]" * 33 + "\n", encoding="utf-8")
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (" + "1, " * 33 + "), }"  # the .npy format, by hand
    header = header.ljust(-(-(len(header) + 11) // 64) * 64 - 11) + "\n"
    (d / "d33.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(8))


LLAMA = {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": 8}


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
    # checkpoints: exit 70 (unhashable dtype, 5,000 digits, weight_map values), silent misreads (a tensor named
    # twice), hangs (a FIFO in a model folder), unbounded reads (/dev/zero as an index), wrong culprits (a
    # shard that is a folder or a FIFO was "missing")
    ("st-dtype-list", "attncli inspect dtype-list.safetensors", 2, ("dtype-list.safetensors", "'a'", "dtype"),
     512 * MiB, 20),
    ("st-dtype-mapping", "attncli inspect dtype-map.safetensors", 2, ("dtype-map.safetensors", "'a'", "dtype"),
     512 * MiB, 20),
    ("st-shape-5000-digits", "attncli inspect shape-5000.safetensors", 2, ("shape-5000.safetensors", "5000 digits"),
     512 * MiB, 20),
    ("st-offsets-5000-digits", "attncli inspect offsets-5000.safetensors", 2,
     ("offsets-5000.safetensors", "5000 digits"), 512 * MiB, 20),
    ("st-tensor-named-twice", "attncli inspect twice.safetensors", 2, ("twice.safetensors", "'a' twice"), 512 * MiB, 20),
    ("weight-map-number", "attncli inspect map-number", 2, ("map-number/model.safetensors.index.json", "q_proj",
                                                            "weight_map"), 512 * MiB, 20),
    ("weight-map-null", "attncli inspect map-null", 2, ("map-null/model.safetensors.index.json", "null"), 512 * MiB, 20),
    ("weight-map-list", "attncli inspect map-list", 2, ("map-list/model.safetensors.index.json", "weight_map"),
     512 * MiB, 20),
    ("weight-map-mapping", "attncli inspect map-mapping", 2, ("map-mapping/model.safetensors.index.json", "weight_map"),
     512 * MiB, 20),
    ("index-dev-zero", "attncli inspect zero.index.json", 2, ("zero.index.json", "device"), 512 * MiB, 20),
    ("folder-index-dev-zero", "attncli inspect zero-index", 2, ("zero-index/model.safetensors.index.json", "device"),
     512 * MiB, 20),
    ("shard-is-a-folder", "attncli inspect shard-dir", 2, ("shard-dir/model.safetensors.index.json", "s.safetensors",
                                                           "a directory"), 512 * MiB, 20),
    ("shard-is-a-fifo", "attncli inspect shard-fifo", 2, ("shard-fifo/model.safetensors.index.json", "s.safetensors",
                                                          "a FIFO"), 512 * MiB, 20),
    ("folder-weights-fifo", "attncli inspect fifo-model", 2, ("fifo-model/model.safetensors", "a FIFO"), 512 * MiB, 20),
    ("self-folder-weights-fifo", "attncli self q.npy --weights fifo-model", 2, ("fifo-model/model.safetensors", "FIFO"),
     512 * MiB, 20),
    ("checkpoint-pipe-of-zeros", "attncli inspect <(cat /dev/zero)", 2, ("/dev/fd/", "neither"), 512 * MiB, 20),
    ("checkpoint-empty-pipe", "attncli inspect <(true)", 2, ("/dev/fd/", "empty pipe"), 512 * MiB, 20),
    # the wrong culprit: a flag the user did not give, or the input, blamed for a file's value
    ("alibi-slopes-shape", "attncli run qk.json --alibi --alibi-slopes slopes3.npy", 2, ("slopes3.npy", "ALiBi slopes"),
     512 * MiB, 20),
    ("alibi-slopes-nan", "attncli run qk.json --alibi --alibi-slopes slopes-nan.npy", 2,
     ("slopes-nan.npy", "ALiBi slopes", "NaN"), 512 * MiB, 20),
    ("config-rotary-dim-3", "attncli self h.npy --weights cfg-rotary-3 --layer 0", 2,
     ("cfg-rotary-3", "config.json", "rotary_dim"), 512 * MiB, 20),
    ("config-rms-norm-eps-minus-1", "attncli self h.npy --weights cfg-eps-minus-1 --layer 0 --from-residual", 2,
     ("cfg-eps-minus-1", "config.json", "eps"), 512 * MiB, 20),
    # round two's leftovers
    ("yaml-merge-key-in-options", "attncli run merge.yaml", 2, ("merge.yaml", "merge key", "line 3"), 512 * MiB, 20),
    ("underscore-number-option", "attncli run underscore.yaml", 2, ("underscore.yaml", "1_000", "line 3"), 512 * MiB, 20),
    ("underscore-number-array", "attncli run underscore-q.yaml", 2, ("underscore-q.yaml", "1_000", "line 1"),
     512 * MiB, 20),
    ("heads-0-in-a-file", "attncli self heads0.yaml", 2, ("heads0.yaml", "'heads'"), 512 * MiB, 20),
    ("seed-2**70", f"attncli run qk.json --seed {2**70}", 2, ("--seed",), 512 * MiB, 20),
    ("d-v-3-heads-2", "attncli self h.npy --d-v 3 --heads 2", 2, ("--d-v", "W_v", "2 K/V heads"), 512 * MiB, 20),
    ("npy-33-dimensions", "attncli run d33.npy", 2, ("d33.npy", "33 dimensions"), 512 * MiB, 20),
    ("yaml-33-dimensions", "attncli run d33.yaml", 2, ("d33.yaml", "33 dimensions"), 512 * MiB, 20),
    ("checkpoint-pipe-zip-then-zeros", "attncli inspect <(printf PK; cat /dev/zero)", 2, ("/dev/fd/", "more than"),
     512 * MiB, 20),
]


# words the message must not name: what used to be blamed (a flag not given, the input)
NOT_BLAMED = {"alibi-slopes-shape": ("sinks",), "alibi-slopes-nan": ("sinks",), "config-rotary-dim-3": ("--rotary-dim",),
              "config-rms-norm-eps-minus-1": ("h.npy", "overflow"), "d-v-3-heads-2": ("--seed",)}


@pytest.mark.parametrize("case", REFUSALS, ids=[c[0] for c in REFUSALS])
def test_refused_in_one_line(case: tuple[str, str, int, tuple[str, ...], int, float], corpus: Path) -> None:
    name, command, code, words, memory, seconds = case
    before = sorted(p.name for p in corpus.iterdir())
    r = child(command, corpus, memory, seconds)
    assert r.returncode == code, (r.returncode, r.stderr[-600:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and "Traceback" not in r.stderr, r.stderr[-600:]
    for w in words:
        assert w in lines[0], (w, lines[0])
    for w in NOT_BLAMED.get(name, ()):
        assert w not in lines[0], (w, lines[0])
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


def weights_step(stdout: str, name: str) -> np.ndarray:
    steps = {s["name"]: s for s in json.loads(stdout)["steps"]}
    return np.asarray(steps[name]["values"], dtype=np.float64)


def test_safetensors_from_a_pipe_is_read_once(corpus: Path) -> None:
    """`self --weights <(cat model.safetensors)`: read once into memory (a pipe cannot be opened twice); W_q is
    the saved q_proj.weight transposed (the textbook convention), as safetensors' own reader gives it."""
    from safetensors.numpy import load_file

    saved = load_file(str(corpus / "layer" / "model.safetensors"))
    r = child("attncli self q2.npy --weights <(cat layer/model.safetensors) --layer 0 --heads 2 --layout llama "
                      "--format json",
              corpus, 1 << 30, 20) if (corpus / "q2.npy").exists() else None
    if r is None:
        np.save(corpus / "q2.npy", np.random.default_rng(4).standard_normal((3, 8)))
        try:
            r = child("attncli self q2.npy --weights <(cat layer/model.safetensors) --layer 0 --heads 2 --layout llama "
                      "--format json",
                      corpus, 1 << 30, 20)
        finally:
            (corpus / "q2.npy").unlink()
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(weights_step(r.stdout, "W_q"), saved["model.layers.0.self_attn.q_proj.weight"].T)
    np.testing.assert_array_equal(weights_step(r.stdout, "W_v"), saved["model.layers.0.self_attn.v_proj.weight"].T)


@pytest.mark.slow
def test_torch_checkpoint_from_a_pipe_is_read_once(corpus: Path) -> None:
    """`inspect <(cat layer.pt)` and `self --weights <(cat layer.pt) --layer 0` used to read the magic bytes, close
    the pipe and have torch.load reopen it (blocking forever): now read once, loaded from memory."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    saved = load_file(str(corpus / "layer" / "model.safetensors"))
    torch.save({k: torch.from_numpy(v) for k, v in saved.items()}, corpus / "layer.pt")
    np.save(corpus / "x8.npy", np.random.default_rng(5).standard_normal((3, 8)))
    try:
        r = child("attncli inspect <(cat layer.pt) --format json", corpus, 1 << 30, 60)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tensors"] == len(saved)
        r = child("attncli self x8.npy --weights <(cat layer.pt) --layer 0 --heads 2 --layout llama --format json", corpus,
                  1 << 30, 60)
    finally:
        (corpus / "layer.pt").unlink()
        (corpus / "x8.npy").unlink()
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(weights_step(r.stdout, "W_k"), saved["model.layers.0.self_attn.k_proj.weight"].T)


@pytest.mark.slow
def test_huge_headers_and_60000_shards_are_bounded(tmp_path: Path) -> None:
    """A 99 MB header of {} (under the package's 100,000,000-byte limit) peaked at 2.6 GB: refused from a count
    of its values before parsing. An index of 60,000 one-tensor shards was quadratic (still running at 25 s):
    linear now, read (or refused) within the time limit."""
    raw_safetensors(tmp_path / "braces.safetensors", b'{"x": [' + b"{}," * 33_000_000 + b"{}]}")
    r = child("attncli inspect braces.safetensors", tmp_path, 512 * MiB, 20)
    assert r.returncode == 2 and "braces.safetensors" in r.stderr and "JSON values" in r.stderr, r.stderr
    (tmp_path / "braces.safetensors").unlink()
    shards = tmp_path / "shards"
    shards.mkdir()
    weight_map = {}
    for i in range(60_000):
        name = f"s{i:05d}.safetensors"
        raw_safetensors(shards / name, f'{{"t{i}": {entry()}}}', b"\0" * 4)
        weight_map[f"t{i}"] = name
    (shards / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}), encoding="utf-8")
    r = child("attncli inspect shards --format json", tmp_path, 1 << 30, 20)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tensors"] == 60_000


def test_safetensors_headers_of_random_json_never_crash(tmp_path: Path) -> None:
    """Hypothesis: random JSON values in dtype / shape / data_offsets, random names and data lengths. Each header
    either reads (and then every tensor lies inside the data, and its size is its shape times its item size) or
    is refused with one InputError naming the file: never another exception (exit 70)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from attncli.errors import InputError
    from attncli.io.checkpoint import DTYPES, read_safetensors_header

    scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                        st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                        st.sampled_from(list(DTYPES)))
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c,
                                                                                        max_size=3), max_leaves=8)
    small = st.integers(min_value=0, max_value=64)
    tensor = st.fixed_dictionaries({"dtype": st.one_of(st.sampled_from(list(DTYPES)), values),
                                    "shape": st.one_of(st.lists(small, max_size=3), values),
                                    "data_offsets": st.one_of(st.lists(small, min_size=2, max_size=2), values)})
    header = st.dictionaries(st.text(max_size=6), st.one_of(tensor, values), max_size=4)
    path = tmp_path / "h.safetensors"

    @settings(max_examples=int(os.environ.get("ATTNCLI_FUZZ_EXAMPLES", "50")), deadline=None,
              derandomize="ATTNCLI_FUZZ_EXAMPLES" not in os.environ, suppress_health_check=[HealthCheck.too_slow])
    @given(header=header, data=st.integers(min_value=0, max_value=300))
    def run(header: dict[str, Any], data: int) -> None:
        raw_safetensors(path, json.dumps(header), b"\0" * data)
        try:
            infos = read_safetensors_header(path)
        except InputError as e:
            assert str(path) in str(e) and "\n" not in str(e)
            return
        for name, t in infos.items():
            item = DTYPES[header[name]["dtype"]][1]  # bytes per element, from the format's table
            assert t.stop - t.start == int(np.prod(t.shape, dtype=np.int64)) * item
            assert path.stat().st_size >= t.stop

    run()


def test_a_tab_after_a_colon_is_separation(corpus: Path) -> None:
    """`temperature:<TAB>2` is YAML 1.2 separation white space: the value is 2, used as such (softmax(s / 2),
    with s = q·k/√d computed here in float64)."""
    (corpus / "tab.yaml").write_text("q: [[1.0, 0.0], [0.5, 2.0]]\noptions:\n  temperature:\t2\n", encoding="utf-8")
    try:
        r = child("attncli run tab.yaml --format json", corpus, 1 << 30, 20)
    finally:
        (corpus / "tab.yaml").unlink()
    assert r.returncode == 0, r.stderr
    q = np.array([[1.0, 0.0], [0.5, 2.0]])
    s = q @ q.T / np.sqrt(2) / 2  # (2, 2) x (2, 2) -> (2, 2), at temperature 2
    w = np.exp(s - s.max(axis=1, keepdims=True))
    np.testing.assert_allclose(weights_step(r.stdout, "weights"), w / w.sum(axis=1, keepdims=True), rtol=1e-12)


@pytest.mark.slow
def test_explain_row_with_100000_key_labels_is_quick(tmp_path: Path) -> None:
    """`--explain-row 0 --html` over 10⁵ labelled keys took 48 s (every exp() of the row formatted for each
    explained cell, then elided): now only the shown terms are formatted. The row lists the key a float64
    softmax computed here weighs most."""
    rng = np.random.default_rng(7)
    q, k = rng.standard_normal((2, 4)), rng.standard_normal((100_000, 4))
    (tmp_path / "keys.json").write_text(json.dumps({"q": q.tolist(), "k": k.tolist(),
                                                    "key_labels": [f"key{i}" for i in range(len(k))]}), encoding="utf-8")
    r = child("attncli run keys.json --explain-row 0 --html page.html", tmp_path, 1 << 30, 20)
    assert r.returncode == 0, r.stderr
    page = html.unescape((tmp_path / "page.html").read_text(encoding="utf-8"))  # beyond 64 keys: the big page
    strongest = int(np.argmax(q[0] @ k.T))  # softmax keeps the order of the scores
    assert re.search(rf"^\s*key{strongest}: scaled", page, re.M), page[:2000]

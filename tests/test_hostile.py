"""Hostile and broken input files: each gets one line on stderr and exit code 2, fast, with
nothing on stdout; no traceback, no hang, no allocation of what a header merely declares.

The table below is (file name, how its bytes are made, words the message must contain).
The memory-bound cases also run in a subprocess under an address-space limit and a timeout.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attncli.cli import app
from attncli.errors import InputError
from attncli.io.files import LOADERS, MAX_TEXT_BYTES, MAX_TEXT_ITEMS, MAX_YAML_BYTES, check_text_size

runner = CliRunner()


def npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    """A valid .npy header (format 1.0) declaring ``shape``, with no data after it."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def npy(a: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=allow_pickle)
    return buf.getvalue()


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def npz_member(name: str, data: bytes) -> bytes:
    """An .npz (a zip) with one member written by hand, e.g. a header declaring a huge shape."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(name, data)
    return buf.getvalue()


def yaml_bomb(levels: int = 9, width: int = 10) -> bytes:
    """"Billion laughs": each anchor is a list of ``width`` aliases of the one before, so the
    last stands for width**levels numbers; q is that last one."""
    names = "abcdefghijklmnop"
    parts = ["&a [" + ",".join(["1.5"] * width) + "]"]
    for i in range(1, levels):
        parts.append(f"&{names[i]} [" + ",".join([f"*{names[i - 1]}"] * width) + "]")
    return ("description: [" + ", ".join(parts) + f"]\nq: *{names[levels - 1]}\n").encode()


GOOD = np.arange(12, dtype=np.float64).reshape(3, 4)
GOOD_NPY = npy(GOOD)

# (file name, bytes, words the one-line message must contain)
CASES: list[tuple[str, Callable[[], bytes], str]] = [
    # truncated / corrupt binaries
    ("trunc.npy", lambda: GOOD_NPY[:-10], "truncated"),
    ("trunc_header.npy", lambda: GOOD_NPY[:20], "not a valid .npy"),
    ("magic_only.npy", lambda: b"\x93NUMPY", "not a valid .npy"),
    ("junk.npy", lambda: bytes(range(256)) * 4, "not a valid .npy"),
    ("bad_header.npy", lambda: b"\x93NUMPY\x01\x00\x10\x00{'descr': 'X'}   \n", "not a valid .npy"),
    ("trunc.npz", lambda: npz(q=GOOD)[:100], "not a valid .npz"),
    ("junk.npz", lambda: b"PK\x03\x04" + bytes(200), "not a valid .npz"),
    ("trunc_member.npz", lambda: npz_member("q.npy", GOOD_NPY[:-8]), "truncated"),
    # headers declaring enormous shapes: must fail before allocating
    ("huge.npy", lambda: npy_header((10**6, 10**6)) + bytes(64), "declares shape (1000000, 1000000)"),
    ("huge_1d.npy", lambda: npy_header((2**40,)) + bytes(64), "truncated"),
    ("huge_member.npz", lambda: npz_member("q.npy", npy_header((10**6, 10**6)) + bytes(64)), "q]"),
    ("huge_unnamed.npz", lambda: npz_member("q", npy_header((10**6, 10**6)) + bytes(64)), "q]"),
    # object arrays and pickles
    ("object.npy", lambda: npy(np.array([1, "a", None], dtype=object), allow_pickle=True), "pickle"),
    ("pickle.npy", lambda: pickle.dumps({"q": [[1.0]]}), "pickle"),
    ("object.npz", lambda: npz_member("q.npy", npy(np.array([{}], dtype=object), allow_pickle=True)), "pickle"),
    ("pickle.pt", lambda: pickle.dumps({"q": [[1.0]]}), "weights_only"),
    ("junk.pt", lambda: bytes(range(256)), "not a PyTorch file"),
    ("junk_zip.pt", lambda: npz(q=GOOD), "PyTorch"),
    # YAML / JSON bombs and nesting
    ("bomb.yaml", yaml_bomb, "expands to more than"),
    ("deep.yaml", lambda: b"q: " + b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    ("deep.json", lambda: b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("deep70.json", lambda: b"[" * 70 + b"1" + b"]" * 70, "ragged"),
    ("bigint.json", lambda: b"[[" + b"9" * 5000 + b"]]", "cannot be read"),
    ("bigint.yaml", lambda: b"q: [[" + b"9" * 5000 + b"]]", "cannot be read"),
    ("hugeint.json", lambda: b"[[" + b"9" * 400 + b", 1]]", "numbers too large"),
    ("python_tag.yaml", lambda: b"q: !!python/object/apply:os.system ['echo hi']", "not plain data"),
    # text that is not text
    ("latin1.yaml", lambda: "q: [[1, 2]]  # café".encode("latin-1"), "not UTF-8"),
    ("binary.yaml", lambda: bytes(range(128, 256)) * 8, "not UTF-8"),
    ("binary.json", lambda: b"\xff\xfe\x00\x01" * 100, "not UTF-8"),
    ("binary.csv", lambda: b"1,2\n\xff\xfe\n", "not UTF-8"),
    ("nul.yaml", lambda: b"q: [[1, 2]]\x00\x00", "not valid YAML"),
    ("bad.json", lambda: b"[[1, 2], [3, 4]", "not valid JSON"),
    # the wrong kind of value where numbers belong
    ("words.yaml", lambda: b"q: [[a, b], [c, d]]", "text where numbers belong"),
    ("mixed_words.json", lambda: b'[[1, "2"], [3, 4]]', "text where numbers belong"),
    ("scalar.yaml", lambda: b"hello", "text where numbers belong"),
    ("bools.yaml", lambda: b"q: [[true, false], [false, true]]", "booleans"),
    ("mixed_bool.json", lambda: b"[[1, true], [0, 1]]", "true/false"),
    ("null.json", lambda: b"[[1, null], [2, 3]]", "non-numbers"),
    ("mapping.yaml", lambda: b"q: {a: 1, b: 2}", "non-numbers"),
    ("complex.npy", lambda: npy(np.eye(2) * 1j), "complex"),
    ("struct.npy", lambda: npy(np.zeros(3, dtype=[("a", "f4")])), "expected numbers"),
    ("strings.npy", lambda: npy(np.array([["a", "b"]])), "text where numbers belong"),
    ("nan.csv", lambda: b"1,nan\n2,3\n", "NaN"),
    ("inf.json", lambda: b"[[1e400, 1]]", "infinite"),
    ("words.csv", lambda: b"1,2\n3,four\n", "'four'"),
    ("ragged.csv", lambda: b"1,2\n3\n", "ragged"),
    # zero-sized and scalar arrays
    ("empty.npy", lambda: npy(np.zeros((0, 3))), "empty"),
    ("empty_cols.npy", lambda: npy(np.zeros((3, 0))), "empty"),
    ("empty_list.json", lambda: b"[]", "empty"),
    ("scalar.npy", lambda: npy(np.float64(3.0)), "single number"),
    ("only_spaces.yaml", lambda: b"   \n\n  ", "empty"),
    ("comments_only.csv", lambda: b"# nothing\n", "empty"),
    # text too big to parse in bounded time and memory (a .npy is memory-mapped instead)
    ("big.yaml", lambda: b"q: [" + b"1.5, " * (MAX_YAML_BYTES // 5) + b"1]", "YAML inputs are read up to"),
    ("big.json", lambda: b"[[" + b"1, " * (MAX_TEXT_BYTES // 3) + b"1]]", "JSON inputs are read up to"),
    # a very long line that is not numbers
    ("long_junk.csv", lambda: b"1," * 200_000 + b"x\n", "'x'"),
    ("long_line.yaml", lambda: b"q: [[" + b"1, " * 20_000 + b"oops]]", "text where numbers belong"),
]


@pytest.mark.parametrize(("name", "make", "words"), CASES, ids=[c[0] for c in CASES])
def test_hostile_file_one_line_exit_2(tmp_path: Path, name: str, make: Callable[[], bytes], words: str) -> None:
    path = tmp_path / name
    path.write_bytes(make())
    res = runner.invoke(app, ["run", str(path), "--format", "json"])
    assert res.exit_code == 2, (res.exit_code, res.stderr, res.exception)
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attncli: error: "), res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert name in lines[0], lines[0]  # the message names the file
    assert words in lines[0], lines[0]
    assert lines[0].count(name) == 1, lines[0]  # one message, not one wrapped in another


# ---- inputs that are odd but fine ---------------------------------------------------------

def _json_output(res: object) -> np.ndarray:
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    return np.asarray(json.loads(res.stdout)["output"])  # type: ignore[attr-defined]


def test_integer_arrays_are_converted(tmp_path: Path) -> None:
    """int8 / uint16 / int64 inputs compute as float64: same output as the float64 array."""
    x = np.array([[1, 0, 2], [0, 3, 1]])
    outs = []
    for dt in ("int8", "uint16", "int64", "float64"):
        np.save(tmp_path / f"x_{dt}.npy", x.astype(dt))
        outs.append(_json_output(runner.invoke(app, ["run", str(tmp_path / f"x_{dt}.npy"), "--format", "json"])))
    # reference: float64 softmax(x xᵀ / sqrt(3)) x, by hand in numpy
    s = x @ x.T / np.sqrt(3)
    w = np.exp(s - s.max(1, keepdims=True))
    ref = (w / w.sum(1, keepdims=True)) @ x
    for o in outs:
        np.testing.assert_allclose(o, ref, rtol=1e-12)


def test_yaml_reads_exponent_floats() -> None:
    """YAML 1.1 reads `1e3` as text; attncli reads it as the number 1000 (as YAML 1.2 does)."""
    doc = LOADERS[".yaml"](b"q: [[1e-1, 2E0], [.5e1, -3e+0]]\nw: 1e3\nname: e3\n", "e.yaml")
    assert doc["q"] == [[0.1, 2.0], [5.0, -3.0]] and doc["w"] == 1000.0 and doc["name"] == "e3"


def test_yaml_aliases_that_stay_small_are_fine(tmp_path: Path) -> None:
    """An anchor reused for K and V (self-attention written out) is not a bomb."""
    (tmp_path / "alias.yaml").write_text("q: &x [[1.0, 0.0], [0.0, 1.0]]\nk: *x\nv: *x\n")
    out = _json_output(runner.invoke(app, ["run", str(tmp_path / "alias.yaml"), "--format", "json"]))
    e, one = np.exp(1 / np.sqrt(2)), 1.0  # softmax([1, 0]/sqrt(2)) by hand
    np.testing.assert_allclose(out, [[e / (e + one), one / (e + one)], [one / (e + one), e / (e + one)]])


def test_check_text_size_counts_expanded_aliases() -> None:
    leaf = [1.0] * 10
    doc = {"q": [[leaf] * 10] * 10}  # 1000 numbers through shared lists, 100 + 10 + 1 lists
    check_text_size(doc, "x.yaml", limit=1200)
    with pytest.raises(InputError, match="expands to more than 1,000"):
        check_text_size(doc, "x.yaml", limit=1000)
    cyclic: list[object] = [1.0]
    cyclic.append(cyclic)  # a list that contains itself terminates
    check_text_size(cyclic, "x.yaml")
    assert MAX_TEXT_ITEMS >= 1_000_000


def test_long_numeric_line_is_read(tmp_path: Path) -> None:
    """A CSV with one 100,000-number row is one key of width 100,000: the weight is 1, output = row."""
    row = np.linspace(-1, 1, 100_000)
    (tmp_path / "wide.csv").write_text(",".join(repr(float(x)) for x in row) + "\n")
    out = _json_output(runner.invoke(app, ["run", str(tmp_path / "wide.csv"), "--format", "json",
                                           "--steps", "output"]))
    np.testing.assert_allclose(out, row[None, :])


# ---- every loader, called directly on junk: only InputError escapes --------------------------

@pytest.mark.parametrize("ext", sorted(LOADERS))
def test_every_loader_rejects_junk_with_input_error(ext: str) -> None:
    for junk in (b"\x00", b"\xff" * 50, b"PK\x03\x04junk", b"\x93NUMPY\x01\x00", b"[[1, 2", b"}{", b"!!binary"):
        try:
            LOADERS[ext](junk, f"junk{ext}")
        except InputError as e:
            assert str(e).startswith(f"junk{ext}: ")


# ---- bounded memory and time, in a subprocess under limits -----------------------------------

LIMITED = r"""
import resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from attncli.cli import main
sys.argv = ["attncli", "run", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize("name", ["huge.npy", "huge_member.npz", "bomb.yaml", "deep.json"])
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is reliable on Linux")
def test_bounded_memory_and_time(tmp_path: Path, name: str) -> None:
    """Under a 1.5 GiB address-space limit and a 60 s timeout (a hang guard, not a benchmark),
    the declared-huge inputs still end with exit 2 and one line; without the checks they would
    ask for terabytes (huge.npy: 7.3 TiB) or expand 10**9 YAML numbers."""
    make = dict((c[0], c[1]) for c in CASES)[name]
    path = tmp_path / name
    path.write_bytes(make())
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", LIMITED, str(3 << 29), str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr


# ---- the same files in every place a command reads one -------------------------------------

PLACES = [
    ["self", "{f}"],
    ["check", "-e", "[[1]]", "{f}"],
    ["check", "{f}", "{q}"],
    ["run", "{q}", "--mask", "{f}"],
    ["run", "{q}", "--valid-lens", "{f}"],
    ["run", "{q}", "--score", "additive", "--weights", "{f}"],
    ["self", "{q}", "--weights", "{f}"],
    ["examples", "run", "cat_milk_sweet", "--mask", "{f}"],
]
FEW = ["huge.npy", "trunc.npz", "object.npz", "bomb.yaml", "deep.json", "latin1.yaml", "mixed_bool.json",
       "bigint.json", "complex.npy", "pickle.npy"]


@pytest.mark.parametrize("place", PLACES, ids=lambda p: " ".join(p[:2]))
def test_hostile_files_in_every_place(tmp_path: Path, place: list[str]) -> None:
    q = tmp_path / "q.npy"
    np.save(q, np.eye(3))
    made = dict((c[0], c[1]) for c in CASES)
    for name in FEW:
        path = tmp_path / name
        path.write_bytes(made[name]())
        args = [a.format(f=path, q=q) for a in place]
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.exit_code, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attncli: error: ") and name in lines[0], (args, res.stderr)


# ---- hostile option values: one line (or Typer's usage box for a type error), exit 2 ----------

OPTION_CASES = [
    (["--scale", "nan"], "finite"),
    (["--scale", "-1e400"], "finite"),
    (["--temperature", "0"], "positive"),
    (["--temperature", "nan"], "positive"),
    (["--mask-value", "nan"], "-inf"),
    (["--mask-value", "inf", "--causal"], "-inf"),
    (["--valid-lens", "nan"], "NaN"),
    (["--valid-lens", "1e400"], "infinite"),
    (["--valid-lens", "99"], "out of range"),
    (["--valid-lens", "1,2;3"], "different lengths"),
    (["--labels", "a,b"], "2 query labels"),
    (["--steps", "bogus"], "bogus"),
    (["--score", "gaussian", "--bandwidth", "nan"], "positive"),
    (["--seed", "-1"], "seed"),
    (["--dropout", "2"], "Usage"),
    (["--precision", "100"], "Usage"),
]


@pytest.mark.parametrize(("args", "words"), OPTION_CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else a)
def test_hostile_option_values(tmp_path: Path, args: list[str], words: str) -> None:
    np.save(tmp_path / "x.npy", np.eye(3))
    res = runner.invoke(app, ["run", str(tmp_path / "x.npy"), *args])
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    assert words in res.stderr and "Traceback" not in res.stderr
    if words != "Usage":
        assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("attncli: error: ")


def test_npz_member_larger_than_free_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An .npz member is decompressed into memory: one declaring more than the free memory (here
    pretended to be 1000 bytes) is refused before numpy allocates or inflates it."""
    import attncli.io.files as aio

    monkeypatch.setattr(aio, "memory_limit", lambda: 1000)
    small = LOADERS[".npz"](npz(q=np.ones((10, 10))), "small.npz")  # 800 bytes: read
    np.testing.assert_array_equal(small["q"], np.ones((10, 10)))
    with pytest.raises(InputError, match=r"big.npz\[q\]: declares shape \(20, 20\) \(3.1 KiB\), more than"):
        LOADERS[".npz"](npz(q=np.ones((20, 20))), "big.npz")
    with pytest.raises(InputError, match=r"two.npz: holds arrays of 1.2 KiB in all, more than"):
        LOADERS[".npz"](npz(q=np.ones(75), k=np.ones(75)), "two.npz")  # 600 bytes each


def test_float_mask_of_zeros_and_ones_is_added_with_a_warning(tmp_path: Path) -> None:
    """A float 0/1 mask is an additive mask (as SDPA's float attn_mask): weights are
    softmax(x xᵀ/√2 + mask), computed by hand here; a warning says it was not keep/drop."""
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    mk = np.array([[1.0, 0.0], [0.0, 0.0]])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "fm.npy", mk)
    res = runner.invoke(app, ["run", str(tmp_path / "x.npy"), "--mask", str(tmp_path / "fm.npy"), "--format", "json"])
    assert res.exit_code == 0, res.stderr
    assert "holds only 0s and 1s as floats" in res.stderr
    s = x @ x.T / np.sqrt(2) + mk
    ref = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(json.loads(res.stdout)["weights"], ref, rtol=1e-12)


# ---- PyTorch state dicts with unusual tensors ------------------------------------------------

def _state_dict(kind: str) -> dict[str, object]:
    import torch

    w = {"W_q.weight": torch.ones(4, 4), "W_k.weight": torch.ones(4, 4), "w_v.weight": torch.ones(1, 4)}
    if kind == "empty":
        w["W_q.weight"] = torch.ones(0, 4)
    elif kind == "meta":
        w["W_q.weight"] = torch.ones(4, 4, device="meta")
    elif kind == "nan":
        w["W_q.weight"] = torch.full((4, 4), float("nan"))
    elif kind == "complex":
        w["W_q.weight"] = torch.ones(4, 4, dtype=torch.complex64)
    elif kind == "sparse":
        w["W_q.weight"] = torch.ones(4, 4).to_sparse()
    elif kind == "int":
        w["W_q.weight"] = torch.ones(4, 4, dtype=torch.int64)
    return w


@pytest.mark.parametrize(("kind", "code", "words"), [
    ("empty", 2, "is empty"), ("meta", 2, "cannot be read as numbers"), ("nan", 2, "NaN"),
    ("complex", 2, "complex"), ("sparse", 0, ""), ("int", 0, ""),
])
def test_state_dict_tensors(tmp_path: Path, kind: str, code: int, words: str) -> None:
    """Odd tensors in a --weights .pt: exit 2 with one line, or read as numbers (sparse made
    dense, integers converted): then the weights are the dense float ones, so the output equals
    the run with all-ones weights."""
    torch = pytest.importorskip("torch")
    torch.save(_state_dict(kind), tmp_path / "w.pt")
    torch.save(_state_dict("plain"), tmp_path / "plain.pt")
    np.save(tmp_path / "x.npy", np.arange(12.0).reshape(3, 4) / 10)
    args = ["run", str(tmp_path / "x.npy"), "--score", "additive", "--format", "json", "--weights"]
    res = runner.invoke(app, [*args, str(tmp_path / "w.pt")])
    assert res.exit_code == code, (res.exit_code, res.stderr)
    if code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "w.pt" in lines[0] and words in lines[0], res.stderr
    else:
        plain = runner.invoke(app, [*args, str(tmp_path / "plain.pt")])
        np.testing.assert_allclose(json.loads(res.stdout)["output"], json.loads(plain.stdout)["output"], rtol=1e-12)


def test_huge_files_are_refused_unread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file larger than its format's bound (or than half the free memory) is refused from
    its size alone: a sparse 1 TiB .yaml/.npz takes no time and no memory."""
    import attncli.io.files as aio

    for name in ("huge.yaml", "huge.json", "huge.npz"):
        path = tmp_path / name
        with open(path, "wb") as f:
            f.truncate(1 << 40)  # sparse: no disk used
        monkeypatch.setattr(aio, "memory_limit", lambda: 1 << 30)
        res = runner.invoke(app, ["run", str(path)])
        assert res.exit_code == 2, res.stderr
        assert "1.0 TiB" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


# ---- text from files reaches the terminal: never markup, never control sequences --------------

def test_labels_are_text_not_markup_nor_escape_sequences(tmp_path: Path) -> None:
    """Labels are printed as written: rich markup ([/], [bold red]) and emoji codes (:cat:) are not interpreted (an
    unbalanced tag used to crash the view) and control characters (ESC [2J clears a terminal)
    are shown as escapes, in the view and in the JSON."""
    (tmp_path / "lab.yaml").write_text('q: [[1, 0], [0, 1], [1, 1]]\nlabels: ["[/]", "[bold red]x\\u001b[2Jy", ":cat:"]\n')
    res = runner.invoke(app, ["run", str(tmp_path / "lab.yaml"), "--steps", "weights"])
    assert res.exit_code == 0, res.stderr
    assert "\x1b" not in res.stdout
    assert "[/]" in res.stdout and "[bold red]x\\x1b[2Jy" in res.stdout
    assert ":cat:" in res.stdout and "\U0001f431" not in res.stdout  # nor an emoji code
    res = runner.invoke(app, ["run", str(tmp_path / "lab.yaml"), "--format", "json"])
    assert json.loads(res.stdout)["labels"]["queries"] == ["[/]", "[bold red]x\\x1b[2Jy", ":cat:"]


def test_error_messages_stay_one_line(tmp_path: Path) -> None:
    """A key with a newline and an escape sequence in a problem file: the message quotes it
    escaped, on one line."""
    (tmp_path / "key.yaml").write_text('q: [[1]]\n"a\\nb\\u001b[2J": 1\n')
    res = runner.invoke(app, ["run", str(tmp_path / "key.yaml")])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "\x1b" not in res.stderr and "a\\nb\\x1b[2J" in res.stderr

"""Robustness, round two (issue 17): no input lost, no silent misreading, no internal error
from bad input. Each test covers a class of defects through its mechanism:

- every file a run reads is protected from every file it writes, whatever the command
  (attncli.io.session records reads; atomic_write refuses), and two outputs never name one file;
- a replaced file keeps its mode; names too long for the system are said, legal ones work;
- every bad input or option is one line under 300 characters, exit 2 (a table);
- YAML is read with the 1.2 core schema, duplicate keys are refused in YAML, JSON and .npz;
- the same bytes get the same verdict from a file and from stdin (hypothesis);
- the Python API raises InputError naming the argument.

Faults (full disks, closed stdout, signals) are in tests/test_faults.py.
"""

from __future__ import annotations

import io
import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import attncli
from attncli.cli import app
from attncli.errors import InputError
from attncli.io.files import load_json, load_yaml, sniff

runner = CliRunner()

# the seeds' cat/milk/it/sweet embeddings: milk's weights are softmax(4, 5, 4, 6) / sqrt(4) scaled
X = np.array([[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]], dtype=np.float64)


def one_line_error(res: object, code: int = 2) -> str:
    """The CLI result's single stderr line (asserting exit ``code``, one line, < 300 chars)."""
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)  # type: ignore[attr-defined]
    lines = res.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, res.stderr  # type: ignore[attr-defined]
    assert lines[0].startswith("attncli: error: ") and len(lines[0]) < 300, lines[0]
    assert "Traceback" not in lines[0] and "internal error" not in lines[0]
    return lines[0]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "m.npy", np.ones((4, 4), dtype=bool))
    np.save(tmp_path / "vl.npy", np.array([4, 4, 4, 4]))
    (tmp_path / "lens.json").write_text("[2, 3, 3, 3]")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "w.npz", W_q=rng.normal(size=(4, 4)), W_k=rng.normal(size=(4, 4)), W_v=rng.normal(size=(4, 4)))
    (tmp_path / "afile").write_text("not a folder")
    return tmp_path


# ---- no input lost ------------------------------------------------------------------------------

OVERWRITES = [
    # every command, every kind of input, every kind of output; the cases first
    ["self", "x.npy", "--valid-lens", "vl.npy", "--save", "vl.npy"],
    ["examples", "run", "cat_milk_sweet", "--mask", "m.npy", "--save", "m.npy"],
    ["examples", "run", "cat_milk_sweet", "--valid-lens", "lens.json", "--save", "lens.json"],
    ["self", "x.npy", "--weights", "w.npz", "--save", "w.npz"],
    ["self", "x.npy", "--weights", "w.npz", "--save", "./sub/../w.npz"],
    ["self", "x.npy", "--mask", "m.npy", "--svg", "m.svg"],  # m.svg: a symlink to m.npy
    ["run", "x.npy", "--html", "x.html"],  # x.html: a hard link to x.npy
    ["run", "x.npy", "--valid-lens", "lens.json", "--plot", "lens.png"],  # a symlink to lens.json
    ["run", "x.npy", "--save", "link.npy"],  # a symlink to x.npy
    ["run", "x.npy", "--save", "hard.npy"],  # a hard link to x.npy
    ["examples", "run", "cat_milk_sweet", "--mask", "m.npy", "--svg", "sub/../m.svg"],
]


@pytest.mark.parametrize("args", OVERWRITES, ids=[" ".join(a) for a in OVERWRITES])
def test_no_command_writes_over_a_file_it_read(work: Path, args: list[str]) -> None:
    (work / "sub").mkdir()
    (work / "link.npy").symlink_to(work / "x.npy")
    (work / "m.svg").symlink_to(work / "m.npy")
    (work / "lens.png").symlink_to(work / "lens.json")
    os.link(work / "x.npy", work / "hard.npy")
    os.link(work / "x.npy", work / "x.html")
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    line = one_line_error(runner.invoke(app, args))
    assert "is one of the inputs; refusing to overwrite it" in line
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("args", [
    ["run", "x.npy", "--svg", "a.svg", "--plot", "a.svg"],
    ["run", "x.npy", "--svg", "a.svg", "--plot", "./a.svg"],
    ["self", "x.npy", "--svg", "a.svg", "--plot", "sub/../a.svg"],
    ["examples", "run", "cat_milk_sweet", "--svg", "a.svg", "--plot", "a.svg"],
])
def test_two_outputs_never_name_one_file(work: Path, args: list[str]) -> None:
    (work / "sub").mkdir()
    line = one_line_error(runner.invoke(app, args))
    assert "named by two outputs" in line


def test_a_run_after_another_may_write_what_the_first_read(work: Path) -> None:
    """The record is per command: a second command (same process) may replace the first one's input."""
    assert runner.invoke(app, ["run", "x.npy", "--save", "o.npz", "-q"]).exit_code == 0
    res = runner.invoke(app, ["run", "x.npy", "--save", "o.npz", "-q"])  # o.npz is no input of this run
    assert res.exit_code == 0, res.stderr


def test_a_replaced_file_keeps_its_mode_and_a_new_one_follows_the_umask(work: Path) -> None:
    secret = work / "secret.json"
    secret.write_text("old")
    secret.chmod(0o600)
    assert runner.invoke(app, ["run", "x.npy", "--save", "secret.json", "-q"]).exit_code == 0
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert json.loads(secret.read_text())["output"]  # replaced
    umask = os.umask(0o027)
    try:
        assert runner.invoke(app, ["run", "x.npy", "--save", "new.json", "-q"]).exit_code == 0
    finally:
        os.umask(umask)
    assert stat.S_IMODE((work / "new.json").stat().st_mode) == 0o640  # 0666 & ~0027, as open() makes it


def test_file_names_at_and_beyond_the_limit(work: Path) -> None:
    legal = "a" * 250 + ".json"  # 255 bytes: legal, though the temporary's usual name would be longer
    assert runner.invoke(app, ["run", "x.npy", "--save", legal, "-q"]).exit_code == 0
    assert (work / legal).exists()
    assert not [p for p in work.iterdir() if p.name.endswith(".tmp")]
    line = one_line_error(runner.invoke(app, ["run", "x.npy", "--save", "b" * 252 + ".json", "-q"]))
    assert "257 bytes" in line and "255" in line
    line = one_line_error(runner.invoke(app, ["run", "x.npy", "--save", "afile/o.json", "-q"]))
    assert "'afile' is not a folder" in line
    line = one_line_error(runner.invoke(app, ["run", "x.npy", "--save", "nowhere/o.json", "-q"]))
    assert "'nowhere' does not exist" in line


# ---- every bad input: one line, exit 2 -------------------------------------------------------------

def npy_header(shape: str, descr: str = "'<f8'") -> bytes:
    """An .npy (version 1.0) header with the given shape text, written by hand (numpy would refuse)."""
    d = "{'descr': " + descr + ", 'fortran_order': False, 'shape': " + shape + ", }"
    h = d + " " * (118 - len(d)) + "\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h.encode()


def npz_with(members: list[tuple[str, bytes]]) -> bytes:
    import warnings

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Duplicate name": the point of one case
        for name, data in members:
            zf.writestr(name, data)
    return buf.getvalue()


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


FILES = {
    "d33.npy": lambda: npy_bytes(np.zeros((1,) * 33)),
    "d33.json": lambda: json.dumps(np.zeros((1,) * 33).tolist()).encode(),
    "zero_huge.npy": lambda: npy_header("(0, 100000000000000000000)"),
    "bool_shape.npy": lambda: npy_header("(True, 4)") + bytes(32),
    "neg_shape.npy": lambda: npy_header("(-1, 4)") + bytes(32),
    "scale400.yaml": lambda: b"q: [[1, 2], [3, 4]]\noptions: {scale: " + b"9" * 400 + b"}\n",
    "dtype_int.yaml": lambda: b"q: [[1.5, 2], [3, 4]]\noptions: {dtype: int64}\n",
    "dtype_banana.yaml": lambda: b"q: [[1.5, 2], [3, 4]]\noptions: {dtype: banana}\n",
    "dtype_f16.json": lambda: b'{"q": [[1.5, 2], [3, 4]], "options": {"dtype": "float16"}}',
    "dup.yaml": lambda: b"q: [[1, 2]]\nq: [[3, 4]]\n",
    "dup.json": lambda: b'{"q": [[1, 2]], "q": [[3, 4]]}',
    "dup.npz": lambda: npz_with([("q.npy", npy_bytes(np.eye(2))), ("q.npy", npy_bytes(np.ones((2, 2))))]),
    "unhashable.yaml": lambda: b"? [1, 2]\n: 3\n",
    "mask2.yaml": lambda: b"q: [[1, 2], [3, 4]]\nmask: [[1, 2], [0, 1]]\n",
    "mask_neg.json": lambda: b'{"q": [[1, 2], [3, 4]], "mask": [[1, -1], [0, 1]]}',
    "many_keys.json": lambda: json.dumps({f"k{i}": 1 for i in range(100_000)}).encode(),
    "many_members.npz": lambda: npz_with([(f"a{i}.npy", npy_bytes(np.zeros(1))) for i in range(2_000)]),
    "long_option.yaml": lambda: b"q: [[1, 2], [3, 4]]\noptions: {score: " + b"x" * 1_000_000 + b"}\n",
    "esc\x1b[2J.yaml": lambda: b"q: [[1, 2], [3, 4]]\nbanana: 1\n",
    "deep.yaml": lambda: b"q: " + b"[" * 100_000 + b"]" * 100_000,
    "deep_block.yaml": lambda: b"q:\n  " + b"- " * 1_000_000 + b"1\n",  # libyaml's composer crashed (SIGSEGV)
    "deep_map.yaml": lambda: b"q: " + b"{a: " * 20_000 + b"1" + b"}" * 20_000,
    "big_f32.yaml": lambda: b"q: [[1.0e39, 2], [3, 4]]\n",
    "mask_inf.yaml": lambda: b"q: [[1, 2], [3, 4]]\nmask: [[.inf, 0.0], [0.0, 0.0]]\n",
    "f128.npy": lambda: npy_bytes(np.full((2, 2), np.longdouble("1e4000"))),
}

BAD_RUNS = [
    # (arguments, words the line holds); files from FILES are written first
    *[(["run", name, "-q"], [name.encode("unicode_escape").decode()]) for name in FILES if name != "big_f32.yaml"],
    (["run", "big_f32.yaml", "--dtype", "float32", "-q"], ["big_f32.yaml"]),
    (["run", "x.npy", "--score", "gaussian", "--bandwidth", "1e-200", "-q"], ["--bandwidth"]),
    (["run", "x.npy", "--score", "additive", "--hidden", str(10**12), "-q"], ["--hidden"]),
    (["run", "x.npy", "--score", "additive", "--hidden", str(2**63), "-q"], ["--hidden"]),
    (["self", "x.npy", "--d-k", str(10**12), "-q"], ["--d-k"]),
    (["self", "x.npy", "--d-k", str(2**63), "-q"], ["--d-k"]),
    (["run", "x.npy", "--temperature", "1e-320", "-q"], ["--temperature"]),
    (["run", "x.npy", "--scale", "1e308", "-q"], ["--scale"]),
    (["run", "x.npy", "--mask-value", "1e308", "--causal", "-q"], ["--mask-value"]),
    (["run", "x.npy", "--mask-value", "nan", "-q"], ["--mask-value"]),
    (["run", "x.npy", "--save", "o.npy", "--steps", "weights,output", "-q"], ["--save", "weights, output"]),
    (["run", "x.npy", "--threads", str(2**32), "-q"], ["--threads"]),
    (["run", "x.npy", "--threads", "1000000", "--backend", "torch", "-q"], ["--threads"]),
    (["check", "--atol", "nan", "-e", json.dumps(X.tolist()), "x.npy", "-q"], ["--atol"]),
    (["self", "x.npy", "--labels", "a,b", "-q"], ["--labels"]),
    (["self", "kpm.yaml", "-q"], ["key padding mask", "holding 2"]),
    (["run", "x.npy", "--save", "s" * 256 + ".npz", "-q"], ["bytes"]),
]


@pytest.mark.parametrize(("args", "words"), BAD_RUNS, ids=[" ".join(a)[:60] for a, _ in BAD_RUNS])
def test_every_bad_input_is_one_short_line_and_exit_2(work: Path, args: list[str], words: list[str]) -> None:
    for name, make in FILES.items():
        if name in args:
            (work / name).write_bytes(make())
    (work / "kpm.yaml").write_text("x: [[1, 2], [3, 4]]\nkey_padding_mask: [1, 2]\n")
    line = one_line_error(runner.invoke(app, args))
    for w in words:
        assert w in line, line
    assert "\x1b" not in line


def test_options_in_a_file_are_named_by_the_file_and_key(work: Path) -> None:
    (work / "p.yaml").write_bytes(FILES["dtype_int.yaml"]())
    line = one_line_error(runner.invoke(app, ["run", "p.yaml", "-q"]))
    assert "p.yaml: option dtype" in line and "--dtype" not in line


def test_a_mapped_npy_truncated_while_read_is_one_line(work: Path) -> None:
    """Another program truncates the memory-mapped input: SIGBUS becomes one line and exit 2."""
    import subprocess
    import sys

    np.save(work / "big.npy", np.ones((2048, 2048)))
    code = ("import os; from attncli.__main__ import install; install()\n"  # the console script's SIGBUS handler
            "from attncli.io.files import Reader\n"
            "a = Reader().read('big.npy')\n"
            "os.truncate('big.npy', 4096)\n"
            "print(float(a.sum()))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(attncli.__file__).parent.parent)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "attncli: error: big.npy: changed while it was read (truncated by another program?); run again when nothing "
        "else writes it"]
    assert proc.stdout == ""


# ---- YAML 1.2, duplicates, numbers -------------------------------------------------------------------

# The YAML 1.2.2 spec, section 10.3.2 (core schema tag resolution): these plain scalars and what they mean.
YAML_12 = [
    ("010", 10), ("0o10", 8), ("0x1A", 26), ("-17", -17), ("+5", 5),
    ("1e3", 1000.0), (".5", 0.5), ("-.inf", float("-inf")), ("1.", 1.0),
    ("true", True), ("False", False), ("null", None), ("~", None),
    ("1:20", "1:20"), ("on", "on"), ("no", "no"), ("yes", "yes"), ("y", "y"), ("2001-12-14", "2001-12-14"),
    ("0b101", "0b101"),
]
# 1_000 is text in YAML 1.2 and 1000 in YAML 1.1: refused with its line (tests/test_hostile3.py), not guessed


@pytest.mark.parametrize(("text", "value"), YAML_12)
def test_yaml_is_read_with_the_1_2_core_schema(text: str, value: object) -> None:
    assert load_yaml(f"a: {text}\n".encode(), "t.yaml") == {"a": value}


def test_yaml_labels_mean_what_they_say(work: Path) -> None:
    (work / "p.yaml").write_text("q: [[1, 0], [0, 1]]\nlabels: [on, no]\n")
    res = runner.invoke(app, ["run", "p.yaml", "--format", "json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["labels"]["queries"] == ["on", "no"]


def test_a_big_json_integer_that_fits_a_float_is_read() -> None:
    assert load_json(b"[123456789012345678901234567890, 1]", "t.json") == [1.2345678901234568e29, 1]
    with pytest.raises(InputError, match="too large for a float"):
        load_json(b"[1" + b"0" * 400 + b"]", "t.json")


# ---- the same bytes, the same verdict, whichever way they come --------------------------------------

def verdict(res: object, source: str) -> tuple[int, str]:
    """(exit code, the message without the name of the source, or stdout)."""
    code = res.exit_code  # type: ignore[attr-defined]
    assert code in (0, 2), (code, res.stderr)  # type: ignore[attr-defined]
    line = res.stderr.strip().splitlines()[-1] if code else ""  # type: ignore[attr-defined]
    if code:
        assert len(res.stderr.strip().splitlines()) == 1 and len(line) < 300, res.stderr  # type: ignore[attr-defined]
    return code, line.replace(source, "SOURCE") if code else res.stdout  # type: ignore[attr-defined]


dims = st.lists(st.integers(0, 5), min_size=0, max_size=4)
descrs = st.sampled_from(["'<f8'", "'<f4'", "'<f2'", "'<i8'", "'|b1'", "'<c16'", "'|O'", "'<U3'", "'|V8'",
                          "('<f8', (2,))", "[('a', '<f8')]", "'>f8'", "'banana'"])
npy_files = st.builds(lambda shape, descr, extra: npy_header(repr(tuple(shape)), descr) + bytes(extra),
                      dims, descrs, st.integers(0, 300))
json_values = st.recursive(st.one_of(st.integers(-(10**30), 10**30), st.floats(allow_nan=False), st.none(),
                                     st.text(max_size=3), st.booleans()),
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(["q", "k", "v", "x"]),
                                                                               c, max_size=3), max_leaves=20)
csv_files = st.lists(st.lists(st.sampled_from(["1", "2.5", "-3e2", "nan", "x", "", "#c", "1e400"]), min_size=1,
                              max_size=4), min_size=1, max_size=4).map(
    lambda rows: ("# comment\n" + "\n".join(",".join(r) for r in rows) + "\n").encode())
yaml_files = st.lists(st.tuples(st.sampled_from(["q", "k", "v", "labels", "mask", "options"]),
                                st.sampled_from(["[[1, 2], [3, 4]]", "010", "1:20", "[on, no]", "{scale: 1e3}",
                                                 "[[1, 0], [0, 1]]", "{dtype: int64}", "!!binary aGk=", "[[1, 2]]"])),
                      min_size=1, max_size=4).map(lambda kv: "".join(f"{k}: {v}\n" for k, v in kv).encode())


npz_files = st.lists(st.tuples(st.sampled_from(["q.npy", "k.npy", "v.npy", "q.npy", "notes.txt", "x"]),
                               st.one_of(npy_files, st.binary(max_size=40),
                                         st.just(npy_bytes(np.eye(2))), st.just(npy_bytes(np.ones((3, 2)))))),
                     min_size=1, max_size=4).map(npz_with)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(npy_files.map(lambda b: (b, ".npy")), json_values.map(lambda v: (json.dumps(v).encode(), ".json")),
                      csv_files.map(lambda b: (b, ".csv")), yaml_files.map(lambda b: (b, ".yaml")),
                      npz_files.map(lambda b: (b, ".npz"))))
def test_hostile_files_same_verdict_from_a_file_and_stdin(tmp_path_factory: pytest.TempPathFactory,
                                                          data: tuple[bytes, str]) -> None:
    """Generated files of every format (odd headers, dtypes, shapes, nesting, 1.1-style YAML,
    commented CSV): exit 0 or 2 with one line, never an internal error; and the same verdict
    whether the bytes come from a file or from stdin."""
    raw, ext = data
    if sniff(raw) != ext:  # stdin cannot know the extension: compare only what sniffing recognises
        return
    path = tmp_path_factory.mktemp("h") / f"in{ext}"
    path.write_bytes(raw)
    from_file = verdict(runner.invoke(app, ["run", str(path), "--format", "json"]), str(path))
    from_stdin = verdict(runner.invoke(app, ["run", "-", "--format", "json"], input=raw), "<stdin>")
    assert from_file == from_stdin


def test_stdin_csv_starting_with_a_comment_is_csv() -> None:
    assert sniff(b"# a table\n1,2\n3,4\n") == ".csv"
    assert sniff(b"# a problem\nq: [[1, 2]]\n") == ".yaml"
    res = runner.invoke(app, ["run", "-", "--format", "json"], input=b"# comment\n1,0\n0,1\n")
    assert res.exit_code == 0, res.stderr
    # identity Q = K = V, d = 2: weights softmax([1, 0] / sqrt 2) by hand
    e = np.exp(1 / np.sqrt(2))
    np.testing.assert_allclose(json.loads(res.stdout)["weights"], [[e / (e + 1), 1 / (e + 1)], [1 / (e + 1), e / (e + 1)]])


def test_subarray_dtype_npy_same_from_file_and_stdin(work: Path) -> None:
    raw = npy_bytes(np.arange(8.0).reshape(2, 2, 2))
    sub = raw.replace(b"'descr': '<f8'", b"'descr': ('<f8', (2,))").replace(b"'shape': (2, 2, 2)", b"'shape': (2, 2)   ")
    (work / "sub.npy").write_bytes(sub)
    a = verdict(runner.invoke(app, ["run", "sub.npy", "--format", "json"]), "sub.npy")
    b = verdict(runner.invoke(app, ["run", "-", "--format", "json"], input=sub), "<stdin>")
    assert a == b and a[0] == 0


# ---- the Python API ------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "named"), [
    ({"dtype": "int64"}, "dtype"),
    ({"dtype": "banana"}, "dtype"),
    ({"temperature": 10**400}, "temperature"),
    ({"scale": 10**400}, "scale"),
    ({"mask_value": 10**400}, "mask_value"),
    ({"hidden": 10**12, "score": "additive"}, "hidden"),
    ({"bandwidth": 1e-200, "score": "gaussian"}, "bandwidth"),
    ({"query_labels": 5}, "query_labels"),
    ({"query_labels": "abc"}, "query"),
    ({"params": [1, 2]}, "params"),  # the former name: the message names the argument given
    ({"score_weights": [1, 2]}, "score_weights"),
])
def test_attend_raises_input_error_naming_the_argument(kwargs: dict[str, object], named: str) -> None:
    with pytest.raises(InputError, match=named):
        attncli.attend(np.eye(2), **kwargs)


def test_attend_refuses_40_dimensions() -> None:
    with pytest.raises(InputError, match="40 dimensions"):
        attncli.attend(np.zeros((1,) * 40))


def test_plot_labels_are_shown_literally_not_parsed_as_mathtext(work: Path) -> None:
    """Labels like $\\frac$, $x^{$ or $$ were parsed by matplotlib's mathtext (an internal error);
    they are text, drawn as written."""
    pytest.importorskip("matplotlib")
    (work / "p.yaml").write_text('q: [[1, 0, 0], [0, 1, 0], [0, 0, 1]]\nlabels: ["$\\\\frac$", "$x^{$", "$$"]\n')
    res = runner.invoke(app, ["run", "p.yaml", "--plot", "w.svg", "-q"])
    assert res.exit_code == 0, res.stderr
    svg = (work / "w.svg").read_text()
    assert "$x^{$" in svg and "$\\frac$" in svg  # the label text itself, kept (svg.fonttype 'path' aside)


@pytest.mark.parametrize(("options", "key"), [
    ("{temperature: -1}", "temperature"), ("{score: nonsense}", "score"), ("{dropout: 2}", "dropout"),
    ("{dtype: int64}", "dtype"), ("{mask_value: 5}", "mask_value"), ("{bandwidth: 1e-200, score: gaussian}", "bandwidth"),
    ("{scale: .nan}", "scale"), ("{activation: banana, score: additive}", "activation"),
])
def test_a_bad_option_in_a_file_is_named_by_the_file_and_its_key(work: Path, options: str, key: str) -> None:
    (work / "p.yaml").write_text(f"q: [[1, 2], [3, 4]]\noptions: {options}\n")
    line = one_line_error(runner.invoke(app, ["run", "p.yaml", "-q"]))
    assert f"p.yaml: option {key}" in line and "--" not in line.split(": ", 3)[2], line


@settings(max_examples=200, deadline=None)
@given(message=st.text(), source=st.one_of(st.none(), st.text()))
def test_every_input_error_is_one_short_printable_line(message: str, source: str | None) -> None:
    """Whatever a message or a file name holds (newlines, escape sequences, a megabyte): one line,
    under 300 characters with the program's prefix, nothing the terminal would act on."""
    line = "attncli: error: " + str(InputError(message * 50, source))
    assert len(line) < 300 and "\n" not in line and "\r" not in line and "\x1b" not in line
    assert all(c.isprintable() for c in line)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(npy_files, json_values.map(lambda v: json.dumps(v).encode()), csv_files, yaml_files, npz_files),
       cmd=st.sampled_from([["self", "-", "-q"], ["self", "-", "--heads", "2", "-q"], ["check", "-e", "[[1, 2]]", "-"],
                            ["run", "-", "--score", "additive", "-q"], ["run", "-", "--causal", "--format", "npz"]]))
def test_hostile_stdin_for_every_command_is_never_an_internal_error(data: bytes, cmd: list[str]) -> None:
    """The generated files piped into each command: exit 0 or 2 with one short line (and 1 from check,
    a mismatch: run and self never return it); never 70 (found: a ragged X in `self`, a mapping as X in `check`)."""
    res = runner.invoke(app, cmd, input=data)
    assert res.exit_code in ((0, 1, 2) if cmd[0] == "check" else (0, 2)), (res.exit_code, res.stderr)
    if res.exit_code == 2:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and len(lines[0]) < 300, res.stderr


def test_checkpoint_shards_and_configs_are_inputs_too(tmp_path: Path) -> None:
    """Files a checkpoint reader opens itself (a .safetensors shard, its index, config.json) are
    recorded like any input: an output of the run that is one of them (here through a link) is refused."""
    import safetensors.numpy

    from attncli.io.checkpoint import open_checkpoint
    from attncli.io.files import atomic_write, session

    shard = tmp_path / "model.safetensors"
    safetensors.numpy.save_file({"w": np.eye(2, dtype=np.float32)}, str(shard))
    (tmp_path / "out.npz").symlink_to(shard)
    session.begin()
    try:
        ckpt = open_checkpoint(shard)
        np.testing.assert_array_equal(ckpt.tensor("w"), np.eye(2))
        with pytest.raises(InputError, match="is one of the inputs"), atomic_write(tmp_path / "out.npz") as f:
            f.write(b"x")
    finally:
        session.end()
    assert shard.read_bytes()[:8] != b"x"
    assert np.array_equal(open_checkpoint(shard).tensor("w"), np.eye(2))


@pytest.mark.parametrize("steps", [[], ["--steps", "output"]], ids=["explicit", "blocked"])
def test_a_mask_value_above_a_kept_score_is_refused_on_every_path(work: Path, steps: list[str]) -> None:
    """Every score here is 1·(-5) + 1·(-5) over sqrt(2) = -7.07: a mask value of -1 would give the
    masked keys more weight than the kept ones. -1e6 is below: causal rows are then uniform over
    their kept keys (row i: 1/(i+1) each, by hand), as with the default -inf."""
    np.save(work / "q.npy", np.ones((3, 2)))
    np.save(work / "k.npy", -5 * np.ones((3, 2)))
    line = one_line_error(runner.invoke(app, ["run", "q.npy", "k.npy", "--causal", "--mask-value", "-1", *steps, "-q"]))
    assert "--mask-value" in line and "-7.07107" in line
    res = runner.invoke(app, ["run", "q.npy", "k.npy", "--causal", "--mask-value", "-1e6", "--format", "json"])
    assert res.exit_code == 0, res.stderr
    np.testing.assert_allclose(json.loads(res.stdout)["weights"], [[1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3]],
                               atol=1e-12)


def test_an_npy_with_bytes_after_its_data_reads_the_same_from_a_file_and_stdin(work: Path) -> None:
    raw = npy_bytes(X) + b"trailing bytes, ignored as numpy ignores them"
    (work / "t.npy").write_bytes(raw)
    a = verdict(runner.invoke(app, ["run", "t.npy", "--format", "json"]), "t.npy")
    b = verdict(runner.invoke(app, ["run", "-", "--format", "json"], input=raw), "<stdin>")
    assert a == b and a[0] == 0

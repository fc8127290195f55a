"""`attncli run` end to end: a table of arguments -> exit code -> output, every bad input of the spine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from attncli import __version__
from attncli.cli import app

runner = CliRunner()
CAT_MILK = [[0, 2, 2, 0], [0, 1, 3, 0], [0, 2, 2, 0], [0, 0, 4, 0]]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """Inputs in every format, plus broken ones, in a temporary folder."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 2))
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "k.npy", k)
    np.save(tmp_path / "v.npy", v)
    np.save(tmp_path / "q32.npy", q.astype(np.float32))
    np.savez(tmp_path / "problem.npz", q=q, k=k, v=v, valid_lens=np.array([2, 5]),
             labels=np.array(["a", "b", "c"]))
    (tmp_path / "cm.yaml").write_text(
        f"# cat/milk\nq: {CAT_MILK}\nlabels: [cat, milk, it, sweet]\noptions: {{score: scaled-dot}}\n")
    (tmp_path / "cm.json").write_text(json.dumps(CAT_MILK))
    (tmp_path / "cm.csv").write_text("\n".join(",".join(map(str, r)) for r in CAT_MILK) + "\n")
    (tmp_path / "k5.yaml").write_text("[[1, 2, 3, 4, 5]]\n")
    (tmp_path / "v3.yaml").write_text("[[1, 2], [3, 4], [5, 6]]\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "ragged.yaml").write_text("[[1, 2], [3]]\n")
    (tmp_path / "words.yaml").write_text("[[1, two], [3, 4]]\n")
    (tmp_path / "tag.yaml").write_text("!!python/object/apply:os.system ['echo hi']\n")
    (tmp_path / "nan.json").write_text("[[1, NaN], [3, 4]]")
    (tmp_path / "bad.json").write_text("[[1, 2], [3, 4]")
    (tmp_path / "q.xyz").write_text("1 2")
    (tmp_path / "folder.npy").mkdir()
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    np.save(tmp_path / "mask_bad.npy", np.ones((4, 3), dtype=bool))
    np.save(tmp_path / "kb3.npy", rng.standard_normal((3, 5, 4)))
    return tmp_path


def run(*args: str, stdin: str | bytes | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args), input=stdin)


def test_version_and_help() -> None:
    assert run("--version").stdout.strip() == f"attncli {__version__}"
    res = run("run", "--help")
    assert res.exit_code == 0 and "--valid-lens" in res.stdout
    assert "attncli examples show cat_milk_sweet | attncli run -" in res.stdout


def test_cat_milk_json_from_yaml(files: Path) -> None:
    res = run("run", str(files / "cm.yaml"), "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)  # nothing but JSON on stdout
    assert [s["name"] for s in doc["steps"]] == ["scores", "scaled", "weights", "output"]
    assert doc["labels"] == {"queries": ["cat", "milk", "it", "sweet"], "keys": ["cat", "milk", "it", "sweet"]}
    # milk row: softmax(4, 5, 4, 6), by hand
    e = [math.exp(x) for x in (4, 5, 4, 6)]
    assert doc["weights"][1] == pytest.approx([x / sum(e) for x in e], rel=1e-14)
    assert doc["output"][0] == pytest.approx([0, 1.25, 2.75, 0], abs=1e-15)
    assert doc["steps"][0]["formula"].startswith("scores = Q Kᵀ")


@pytest.mark.parametrize("name", ["cm.yaml", "cm.json", "cm.csv"])
def test_text_formats_agree(files: Path, name: str) -> None:
    res = run("run", str(files / name), "-f", "json", "--steps", "output")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["output"][2] == pytest.approx([0, 1.25, 2.75, 0], abs=1e-15)


def test_npy_inputs_match_sdpa_and_save(files: Path) -> None:
    out = files / "trace.npz"
    res = run("run", "--score", "scaled-dot", *(str(files / f"{n}.npy") for n in "qkv"),
              "--valid-lens", "2,5", "--save", str(out), "--quiet")
    assert res.exit_code == 0 and res.stdout == ""
    q, k, v = (np.load(files / f"{n}.npy") for n in "qkv")
    keep = np.arange(5) < np.array([2, 5])[:, None, None]
    want = F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)),
                                          attn_mask=torch.from_numpy(np.broadcast_to(keep, (2, 3, 5)).copy()))
    with np.load(out) as z:
        assert {"scores", "scaled", "masked", "weights", "output", "q", "k", "v"} <= set(z.files)
        np.testing.assert_allclose(z["output"], want.numpy(), rtol=1e-12, atol=1e-12)
        assert np.isneginf(z["masked"][0, :, 2:]).all()


def test_problem_npz_and_cli_override(files: Path) -> None:
    res = run("run", str(files / "problem.npz"), "-f", "json")
    doc = json.loads(res.stdout)
    assert doc["labels"]["queries"] == ["a", "b", "c"]
    w = np.array(doc["weights"])
    assert (w[0, :, 2:] == 0).all() and (w[1] > 0).all()
    res = run("run", str(files / "problem.npz"), "-f", "json", "--valid-lens", "1,1")  # the option wins
    w = np.array(json.loads(res.stdout)["weights"])
    assert (w[..., 1:] == 0).all()


def test_stdin_and_format_npz(files: Path) -> None:
    res = run("run", "-", str(files / "cm.yaml"), "-f", "json", stdin=json.dumps(CAT_MILK))
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["output"][0] == pytest.approx([0, 1.25, 2.75, 0])
    res = runner.invoke(app, ["run", str(files / "cm.yaml"), "-f", "npz"])
    assert res.exit_code == 0
    import io

    with np.load(io.BytesIO(res.stdout_bytes)) as z:
        assert z["output"][0] == pytest.approx([0, 1.25, 2.75, 0])


def test_float32_default_and_dtype_option(files: Path) -> None:
    doc = json.loads(run("run", str(files / "q32.npy"), "-f", "json").stdout)
    assert doc["dtype"] == "float32"
    doc = json.loads(run("run", str(files / "q32.npy"), "-f", "json", "--dtype", "float64").stdout)
    assert doc["dtype"] == "float64"
    doc = json.loads(run("run", str(files / "cm.yaml"), "-f", "json").stdout)
    assert doc["dtype"] == "float64"  # textbook inputs from YAML


def test_torch_backend_same_numbers(files: Path) -> None:
    a = json.loads(run("run", str(files / "cm.yaml"), "-f", "json").stdout)
    b = json.loads(run("run", str(files / "cm.yaml"), "-f", "json", "--backend", "torch").stdout)
    assert b["backend"] == "torch"
    np.testing.assert_allclose(a["output"], b["output"], rtol=1e-15)


def test_labels_and_causal(files: Path) -> None:
    res = run("run", str(files / "cm.json"), "--query-labels", "cat,milk,it,sweet", "--key-labels",
              "cat,milk,it,sweet", "--causal", "-f", "json")
    doc = json.loads(res.stdout)
    w = np.array(doc["weights"])
    assert np.all(np.triu(w, 1) == 0) and doc["labels"]["keys"][1] == "milk"
    assert [s["name"] for s in doc["steps"]][2] == "masked"
    assert doc["steps"][2]["values"][0][1] is None  # -inf is null in JSON


def test_fully_masked_row_warning_and_mask_value(files: Path) -> None:
    res = run("run", str(files / "cm.yaml"), "--valid-lens", "0", "-f", "json")
    assert res.exit_code == 0
    assert json.loads(res.stdout)["weights"][0] == [0, 0, 0, 0]
    assert "query 'cat' has every key masked" in res.stderr
    res = run("run", str(files / "cm.yaml"), "--valid-lens", "0", "--mask-value", "-1e6", "-f", "json")
    assert json.loads(res.stdout)["weights"][0] == pytest.approx([0.25] * 4)


def test_mask_conventions(files: Path) -> None:
    np.save(files / "m.npy", np.array([[1, 1, 0, 0]] * 4))
    keep = np.array(json.loads(run("run", str(files / "cm.yaml"), "--mask", str(files / "m.npy"),
                                   "-f", "json").stdout)["weights"])
    drop = np.array(json.loads(run("run", str(files / "cm.yaml"), "--mask", str(files / "m.npy"),
                                   "--mask-convention", "drop", "-f", "json").stdout)["weights"])
    assert (keep[:, 2:] == 0).all() and (drop[:, :2] == 0).all()


def test_rich_view_and_save_json(files: Path) -> None:
    out = files / "t.json"
    res = run("run", str(files / "cm.yaml"), "--save", str(out))
    assert res.exit_code == 0
    for text in ("1. scores = Q Kᵀ", "2. scaled = S / √d = S / √4", "3. weights", "4. output = weights · V",
                 "milk", "0.0826", "0.6103"):
        assert text in res.stdout
    assert json.loads(out.read_text())["output"][0] == pytest.approx([0, 1.25, 2.75, 0])


BAD = [
    # (args, what the one-line message must contain)
    (["missing.npy"], "missing.npy: no such file"),
    (["folder.npy"], "folder.npy: is a directory"),
    (["q.xyz"], "q.xyz: has an unknown extension '.xyz'"),
    (["empty.yaml"], "empty.yaml: is empty"),
    (["ragged.yaml"], "ragged.yaml: Q is ragged"),
    (["words.yaml"], "words.yaml: Q holds text where numbers belong"),
    (["tag.yaml"], "tag.yaml: holds a YAML tag that is not plain data"),
    (["bad.json"], "bad.json: is not valid JSON at line 1"),
    (["pickled.npy"], "pickled.npy: holds an object array that needs pickle"),
    (["nan.json"], "nan.json: Q holds NaN at index [0, 1]"),
    (["cm.yaml", "k5.yaml"], "k5.yaml: K has width 5 but Q has width 4; --score scaled-dot needs equal widths "
                             "(use --score additive for different widths)"),
    (["cm.yaml", "cm.yaml", "v3.yaml"], "v3.yaml: V has 3 rows but K has 4 keys"),
    (["q.npy", "kb3.npy"], "kb3.npy: batch axes do not match"),
    (["q.npy", "k.npy", "v.npy", "--valid-lens", "-1,2"], "--valid-lens: valid length -1 is out of range"),
    (["q.npy", "k.npy", "v.npy", "--valid-lens", "2,6"], "--valid-lens: valid length 6 is out of range: there are 5 keys"),
    (["q.npy", "k.npy", "v.npy", "--valid-lens", "1,2,3"],
     "--valid-lens: valid lengths have shape (3,); expected (2,) or (2, 3)"),
    (["q.npy", "k.npy", "v.npy", "--valid-lens", "x"], "--valid-lens: 'x' is neither numbers"),
    (["cm.yaml", "--mask", "mask_bad.npy"], "mask_bad.npy: mask has shape (4, 3), which does not broadcast"),
    (["cm.yaml", "--query-labels", "a,b"], "--query-labels: 2 query labels given for 4 queries"),
    (["cm.yaml", "--temperature", "-1"], "--temperature: temperature must be a positive number"),
    (["cm.yaml", "cm.yaml", "cm.yaml", "cm.yaml"], "expected 1 to 3 inputs"),
    (["cm.yaml", "--steps", "bogus"], "--steps: unknown step(s) bogus"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line_exit_2(files: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files)
    res = run("run", *args, "--save", "out.npz")
    assert res.exit_code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attncli: error: "), res.stderr
    assert message in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (files / "out.npz").exists()  # no output file, not even half-written
    assert not list(files.glob(".out.npz.*"))


def test_usage_errors_exit_2(files: Path) -> None:
    assert run("run").exit_code == 2
    assert run("run", str(files / "cm.yaml"), "--score", "nope").exit_code == 2
    assert run("run", str(files / "cm.yaml"), "--format", "xml").exit_code == 2


@pytest.mark.parametrize(("args", "message"), [
    (["run"], "Missing argument 'Q [K [V]]'. (see 'python -m attncli run --help')"),
    (["run", "cm.yaml", "--scroe", "dot"], "No such option"),
    (["run", "cm.yaml", "--score", "nope"], "'nope' is not one of 'dot', 'scaled-dot'"),
    (["run", "cm.yaml", "--format", "xml"], "'xml' is not one of"),
    (["runn"], "No such command 'runn'. Did you mean 'run'? (see 'python -m attncli --help')"),
])
def test_usage_errors_are_one_line_from_the_shell(files: Path, args: list[str], message: str) -> None:
    """Through the real entry point (CliRunner would use Typer's boxed panel): one line, exit 2."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "attncli", *args], cwd=files, capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("attncli: error: "), res.stderr
    assert message in res.stderr


@pytest.mark.parametrize("command", ["run", "self", "check", "examples"])
def test_entry_point_builds_only_the_invoked_command(command: str) -> None:
    """main() hands Typer the one command named first (start-up): its help is the whole app's,
    and the app itself keeps every command. Anything else gets the commands' names and summaries."""
    from attncli.cli import COMMANDS, invoked

    one = invoked([command, "--help"])
    assert [c.name for c in one.registered_commands] + [g.name for g in one.registered_groups] == [command]
    assert runner.invoke(one, [command, "--help"]).stdout == runner.invoke(app, [command, "--help"]).stdout
    assert {c.name for c in app.registered_commands} == {"run", "self", "view", "check", "inspect", "capture",
                                                          "heads"} \
        and app.registered_groups
    for args in ([], ["--version"], ["rnu"], ["--help", "run"]):
        listed = invoked(args)
        assert [c.name for c in listed.registered_commands] == list(COMMANDS) and listed.registered_groups == []


def test_cuda_without_gpu_is_one_line(files: Path) -> None:
    res = run("run", str(files / "cm.yaml"), "--device", "cuda")
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "--device cuda was requested but torch.cuda.is_available() is False" in res.stderr


def test_save_refuses_to_overwrite_an_input(files: Path) -> None:
    before = (files / "problem.npz").read_bytes()
    res = run("run", str(files / "problem.npz"), "--save", str(files / "problem.npz"), "-q")
    assert res.exit_code == 2 and "is one of the inputs" in res.stderr
    assert (files / "problem.npz").read_bytes() == before


def test_save_with_unknown_extension(files: Path) -> None:
    res = run("run", str(files / "cm.yaml"), "--save", str(files / "out.txt"))
    assert res.exit_code == 2 and "cannot save as '.txt'" in res.stderr and res.stdout == ""
    assert not (files / "out.txt").exists()


def test_saved_file_respects_umask(files: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        assert run("run", str(files / "cm.yaml"), "-q", "--save", str(files / "t.npz")).exit_code == 0
    finally:
        os.umask(old)
    assert (files / "t.npz").stat().st_mode & 0o777 == 0o644


def test_stdin_is_named_once() -> None:
    """`-` twice (two arguments, or an argument and --mask) is refused in one line naming the second one:
    standard input can be read once."""
    for args, culprit in ((["run", "-", "-"], "argument 2"), (["run", "-", "--mask", "-"], "--mask")):
        res = run(*args, stdin="[[1, 0], [0, 1]]")
        assert res.exit_code == 2 and res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"attncli: error: {culprit}: '-' (standard input)")


def test_typos_in_a_file_get_a_did_you_mean(tmp_path: Path) -> None:
    """A near miss among a problem file's options and entries is named with the word it resembles."""
    f = tmp_path / "p.yaml"
    f.write_text("q: [[1, 0]]\nk: [[1, 0]]\noptions: {scor: additive}\n")
    res = run("run", str(f))
    assert res.exit_code == 2 and res.stderr.strip() == f"attncli: error: {f}: unknown option 'scor'; did you mean 'score'?"
    f.write_text("q: [[1, 0]]\nlables: [a]\n")
    res = run("run", str(f))
    assert res.exit_code == 2 and "unknown entry 'lables'; did you mean 'labels'?" in res.stderr
    f.write_text("q: [[1, 0]]\nzzzz: 1\n")
    res = run("run", str(f))
    assert res.exit_code == 2 and "did you mean" not in res.stderr and "holds" in res.stderr

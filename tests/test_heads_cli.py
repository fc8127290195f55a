"""attncli heads on the command line: outputs, --save and merge (the union of halves is the whole), hostile statistics
files refused in one line, the induction probe against TransformerLens's own score, rollout against a float64
product."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def model(tmp_path_factory: Any) -> tuple[Path, Any]:
    """A tiny causal GQA Llama (eager attention) saved with its config, and the model itself."""
    folder = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   bos_token_id=1, eos_token_id=2)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():  # sharper heads than the default init
        for p in m.parameters():
            if p.ndim == 2:
                p.mul_(8.0)
    m.save_pretrained(folder)
    return folder, m


def states(m: Any, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        out = m(torch.as_tensor(ids), output_hidden_states=True, output_attentions=True)
    return (np.stack([h.numpy() for h in out.hidden_states]), np.stack([a.numpy() for a in out.attentions]))


@pytest.fixture(scope="module")
def files(model: tuple[Path, Any], tmp_path_factory: Any) -> Path:
    folder, m = model
    d = tmp_path_factory.mktemp("inputs")
    ids = np.random.default_rng(0).integers(3, 50, size=(4, 10))
    hidden, _ = states(m, ids)
    np.save(d / "all.npy", hidden)
    np.save(d / "a.npy", hidden[:, :2])
    np.save(d / "b.npy", hidden[:, 2:])
    return d


def cli(*args: str) -> Any:
    return runner.invoke(app, ["heads", *args])


def test_json_holds_every_head_with_definitions_and_thresholds(model: Any, files: Path) -> None:
    r = cli(str(files / "all.npy"), "--weights", str(model[0]), "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["statistics"]) == 2 * 4 and "sums" not in doc
    assert doc["thresholds"]["sink"]["at_least"] == 0.3 and set(doc["definitions"]) >= {"entropy", "induction"}
    row = doc["statistics"][0]
    assert row["entropy"]["n"] == 4 * 10 and row["entropy"]["n_inputs"] == 4
    assert row["induction"]["mean"] is None  # HIDDEN alone has no token ids
    assert len(doc["model"]["config_sha256"]) == 64 and str(model[0]) not in json.dumps(doc)


def test_csv_is_one_row_per_head(model: Any, files: Path) -> None:
    r = cli(str(files / "all.npy"), "--weights", str(model[0]), "--format", "csv")
    assert r.exit_code == 0
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 + 8 and lines[0].startswith("layer,head,patterns,entropy,entropy_std,entropy_n")


def test_merge_of_halves_equals_the_whole(model: Any, files: Path, tmp_path: Path) -> None:
    w = str(model[0])
    for name in ("a", "b", "all"):
        assert cli(str(files / f"{name}.npy"), "-w", w, "--save", str(tmp_path / f"{name}.json")).exit_code == 0
    r = cli("merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--save", str(tmp_path / "m.json"))
    assert r.exit_code == 0, r.output
    whole, merged = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("all", "m"))
    for f in ("total", "input_sum", "input_sq"):
        np.testing.assert_allclose(merged["sums"][f], whole["sums"][f], rtol=1e-12, atol=1e-15)
    for f in ("count", "inputs"):
        assert merged["sums"][f] == whole["sums"][f]
    assert sorted(merged["inputs"]) == sorted(whole["inputs"])


def hostile(tmp_path: Path, base: dict[str, Any], name: str, change: Any) -> Path:
    doc = json.loads(json.dumps(base))
    change(doc)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(doc))
    return p


def _set(path: list[Any], value: Any) -> Any:
    def change(doc: dict[str, Any]) -> None:
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return change


HOSTILE = {
    "other model": (_set(["model", "config_sha256"], "0" * 64), "another model"),
    "other definitions": (_set(["definitions_version"], "attncli-heads/0"), "definitions"),
    "other thresholds": (_set(["thresholds", "sink", "at_least"], 0.2), "thresholds"),
    "overlapping inputs": (lambda d: None, "each input merges once"),
    "negative count": (lambda d: d["sums"]["count"][0][0].__setitem__(0, -1), "negative count"),
    "NaN sum": (lambda d: d["sums"]["total"][0][0].__setitem__(0, float("nan")), "NaN"),
    "wrong shape": (lambda d: d["sums"]["total"].pop(), "shape"),
    "not a stats file": (lambda d: d.pop("format"), "not a statistics file"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_statistics_files_are_refused_in_one_line(model: Any, files: Path, tmp_path: Path, case: str) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    cli(str(files / "a.npy"), "-w", str(model[0]), "--save", str(a))
    cli(str(files / "b.npy"), "-w", str(model[0]), "--save", str(b))
    change, said = HOSTILE[case]
    other = hostile(tmp_path, json.loads((a if case == "overlapping inputs" else b).read_text()), "x", change)
    res = subprocess.run([sys.executable, "-m", "attncli", "heads", "merge", str(a), str(other), "--save",
                          str(tmp_path / "m.json")], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300 and said in lines[0], res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "m.json").exists()


def test_bad_options_are_one_line(model: Any, files: Path) -> None:
    for args, said in ((["--metric", "nope"], "--metric"), (["--top", "3"], "--top"),
                       (["--threshold", "sink=2"], "--threshold"), (["--layer", "9"], "--layer")):
        r = cli(str(files / "all.npy"), "-w", str(model[0]), *args)
        assert r.exit_code == 2 and said in r.output, r.output


def test_induction_probe_agrees_with_transformer_lens(model: Any) -> None:
    """Our induction over the probe's second copy against TransformerLens's detect_head score ('mul') computed from
    the model's own eager weights on the same tokens: TL's score sums a_ij over its induction pattern and divides by
    Σ a = T, so with no token repeated inside a copy, ours (a mean over the N scored queries) = TL · T / N."""
    from transformer_lens import head_detector as tl_heads

    from attncli.core import headstats as hs

    folder, m = model
    N = 6
    seed = next(s for s in range(1000)  # the first seed whose probe repeats no token inside a copy
                if all(len(set(r[1:1 + N].tolist())) == N for r in hs.induction_probe(1, 50, N, 4, s, {1, 2})[0]))
    r = cli("--induction", str(N), "-w", str(folder), "--format", "json", "--dtype", "float64", "--seed", str(seed))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    ids, _ = hs.induction_probe(1, 50, N, 4, seed, {1, 2})
    _, att = states(m, ids)
    T = ids.shape[1]
    for row in doc["statistics"]:
        tl = []
        for b in range(4):
            pat = tl_heads.get_induction_head_detection_pattern(torch.as_tensor(ids[b]))
            tl.append(tl_heads.compute_head_attention_similarity_score(
                torch.as_tensor(att[row["layer"], b, row["head"]]).double(), pat.double(), exclude_bos=False,
                exclude_current_token=False, error_measure="mul"))
        assert row["induction"]["n"] == 4 * N
        assert row["induction"]["mean"] == pytest.approx(np.mean(tl) * T / N, rel=1e-5, abs=1e-7)


def test_rollout_against_a_float64_product(model: Any, files: Path, tmp_path: Path) -> None:
    folder, m = model
    ids = np.random.default_rng(0).integers(3, 50, size=(4, 10))
    _, att = states(m, ids)
    out = tmp_path / "r.npy"
    r = cli(str(files / "all.npy"), "-w", str(folder), "--rollout", str(out), "--format", "json")
    assert r.exit_code == 0, r.output
    got = np.load(out)
    assert got.shape == (4, 2, 10, 10)
    R = np.eye(10)
    for layer in range(2):  # Abnar & Zuidema: Â = 0.5·mean_h A + 0.5·I, rows renormalised; R_l = Â_l ⋯ Â_1
        A = 0.5 * att[layer, 0].astype(np.float64).mean(axis=0) + 0.5 * np.eye(10)
        A /= A.sum(axis=-1, keepdims=True)
        R = A @ R
        np.testing.assert_allclose(got[0, layer], R, rtol=1e-5, atol=1e-6)
    assert "approximat" in json.loads(r.stdout)["rollout"]["caveat"]


def _means(doc: dict[str, Any], stat: str) -> np.ndarray:
    return np.array([[r[stat]["mean"] for r in doc["statistics"] if r["layer"] == L] for L in (0, 1)], dtype=float)


@pytest.mark.parametrize("dtype, tol", [("float32", 2e-6), ("float64", 1e-10)])
def test_heads_on_torch_agree_with_the_models_own_weights_and_numpy(model: Any, files: Path, tmp_path: Path,
                                                                    dtype: str, tol: float) -> None:
    """--backend torch (on the CPU here; --device cuda in tests/test_gpu.py) computes the projections and scores
    with torch: its statistics are those of the model's own eager weights (transformers, float32) by a plain loop,
    and equal the numpy path's to float rounding; its rollout too."""
    folder, m = model
    ids = np.random.default_rng(0).integers(3, 50, size=(4, 10))
    _, att = states(m, ids)
    a = att.astype(np.float64)  # (layers, B, H, T, T), causal: row i holds keys 0..i
    T = a.shape[-1]
    prev = a[..., np.arange(1, T), np.arange(T - 1)]  # each query's weight on the previous position (i >= 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(a > 0, a * np.log(a), 0.0).sum(axis=-1)
    ref = {"first": a[..., 0].mean(axis=(1, 3)), "self": np.diagonal(a, axis1=-2, axis2=-1).mean(axis=(1, 3)),
           "previous": prev.mean(axis=(1, 3)), "max": a.max(axis=-1).mean(axis=(1, 3)), "entropy": ent.mean(axis=(1, 3))}
    docs = {}
    for backend in ("numpy", "torch"):
        out = tmp_path / f"{backend}.npy"
        r = cli(str(files / "all.npy"), "-w", str(folder), "--format", "json", "--backend", backend, "--dtype", dtype,
                "--rollout", str(out))
        assert r.exit_code == 0, r.output
        docs[backend] = json.loads(r.stdout)
    for stat, want in ref.items():  # the model's own weights are float32: the reference holds to ~1e-6
        np.testing.assert_allclose(_means(docs["torch"], stat), want, rtol=0, atol=2e-6, err_msg=stat)
        np.testing.assert_allclose(_means(docs["torch"], stat), _means(docs["numpy"], stat), rtol=0, atol=tol,
                                   err_msg=stat)
    np.testing.assert_allclose(np.load(tmp_path / "torch.npy"), np.load(tmp_path / "numpy.npy"), rtol=0, atol=tol)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: tests/test_gpu.py runs --device cuda")
def test_heads_device_cuda_without_cuda_is_one_line(model: Any, files: Path) -> None:
    r = cli(str(files / "all.npy"), "-w", str(model[0]), "--device", "cuda")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "--device cuda" in lines[0] and "Traceback" not in r.output


def test_model_view_badges_are_what_heads_says(model: Any, files: Path) -> None:
    """The model view (attncli view --layer all) badges each head with the patterns and statistics heads reports."""
    from attncli.io.model import load_layer
    from attncli.render.viewer import Layer, Viewer

    folder, _ = model
    hidden = np.load(files / "all.npy")
    cl = load_layer(folder, 1)
    viewer = Viewer([Layer(cl.problem(hidden[1], from_residual=True), "layer 1")], "t" * 32, model=True)
    badges = viewer.meta()["layers"][0]["patterns"]
    r = cli(str(files / "all.npy"), "-w", str(folder), "--layer", "1", "--format", "json")
    rows = json.loads(r.stdout)["statistics"]
    assert len(badges) == 4
    for h, row in enumerate(rows):
        assert badges[h]["patterns"] == row["patterns"]
        assert badges[h]["stats"]["entropy"] == pytest.approx(row["entropy"]["mean"], abs=1e-4)
        assert badges[h]["stats"]["first"] == pytest.approx(row["first"]["mean"], abs=1e-4)


def test_a_capture_brings_ids_labels_padding_and_special_tokens(model: Any, tmp_path: Path) -> None:
    """A capture (issue 31's members) through the command line: every statistic of each head over both inputs (one
    right-padded) against the plain-loop reference on the model's own eager weights."""
    from test_heads import reference

    from attncli.core import headstats as hs

    folder, m = model
    ids = np.array([[1, 5, 6, 7, 5, 6, 7, 8, 9, 3, 4, 5], [1, 9, 8, 3, 9, 8, 3, 4, 2, 2, 2, 2]])
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    words = {3: ",", 4: "."}
    labels = np.array([[words.get(int(t), f" w{t}") for t in row] for row in ids])
    with torch.no_grad():
        out = m(torch.as_tensor(ids), attention_mask=torch.as_tensor(mask), output_hidden_states=True,
                output_attentions=True)
    hidden = np.stack([h.numpy() for h in out.hidden_states])
    np.savez(tmp_path / "cap.npz", format=np.array("attncli-capture/1"), hidden_states=hidden, input_ids=ids,
             labels=labels, tokens=labels, attention_mask=mask, special_tokens_mask=(ids == 1).astype(np.int64),
             provenance=np.array(json.dumps({"model_type": "llama"})))  # issue 31's members (attncli.io.capture)
    r = cli(str(tmp_path / "cap.npz"), "-w", str(folder), "--layer", "0", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["statistics"]
    att = out.attentions[0].double().numpy()  # layer 0: its keys' states are the embeddings, finite at padding too
    total = np.zeros((4, hs.S))
    count = np.zeros((4, hs.S))
    for b in range(2):
        v = mask[b] == 1
        s, c = reference(att[b], v, ids[b], ids[b] == 1, np.isin(ids[b], [3, 4]))
        total += s
        count += c
    for h, row in enumerate(rows):
        for k, name in enumerate(hs.STATS):
            assert row[name]["n"] == count[h, k], name
            if count[h, k]:
                assert row[name]["mean"] == pytest.approx(total[h, k] / count[h, k], rel=1e-5, abs=1e-6), name


def test_model_view_badges_of_a_capture_use_its_token_ids(model: Any, tmp_path: Path) -> None:
    """attncli view CAPTURE --layer all: the badges' statistics come with the capture's token ids and special tokens
    (induction, duplicate, special, punctuation: absent before), each against the plain-loop reference on the model's
    own eager weights, and the badges name the patterns `heads CAPTURE` names."""
    from test_heads import reference

    from attncli.cli.options import ProblemArgs
    from attncli.cli.view import model_layers, viewer_layers
    from attncli.core import headstats as hs
    from attncli.io.files import Reader
    from attncli.render.viewer import Viewer

    folder, m = model
    ids = np.array([[1, 5, 6, 7, 5, 6, 7, 8, 9, 3, 4, 5], [1, 9, 8, 3, 9, 8, 3, 4, 9, 8, 3, 4]])
    words = {3: ",", 4: "."}
    labels = np.array([[words.get(int(t), f" w{t}") for t in row] for row in ids])
    with torch.no_grad():
        out = m(torch.as_tensor(ids), output_hidden_states=True, output_attentions=True)
    mask = np.ones_like(ids)
    cap = tmp_path / "cap.npz"
    np.savez(cap, format=np.array("attncli-capture/1"), hidden_states=np.stack([h.numpy() for h in out.hidden_states]),
             input_ids=ids, labels=labels, tokens=labels, attention_mask=mask,
             special_tokens_mask=(ids == 1).astype(np.int64), provenance=np.array(json.dumps({"model_type": "llama"})))
    layers = model_layers([str(cap)], ProblemArgs(weights=folder), Reader())
    badges = [x["patterns"] for x in Viewer(viewer_layers(layers), "t" * 32, model=True).meta()["layers"]]
    rows = json.loads(cli(str(cap), "-w", str(folder), "--format", "json").stdout)["statistics"]
    for layer in (0, 1):
        att = out.attentions[layer].double().numpy()
        total, count = np.zeros((4, hs.S)), np.zeros((4, hs.S))
        for b in range(2):
            s_, c_ = reference(att[b], mask[b] == 1, ids[b], ids[b] == 1, np.isin(ids[b], [3, 4]))
            total += s_
            count += c_
        for h in range(4):
            for k, name in enumerate(hs.STATS):
                got = badges[layer][h]["stats"][name]
                if count[h, k] == 0:
                    assert got is None, name
                else:  # the badges' statistics are rounded to 4 decimals
                    assert got == pytest.approx(total[h, k] / count[h, k], abs=6e-5), (layer, h, name)
            assert badges[layer][h]["patterns"] == rows[4 * layer + h]["patterns"]
    assert all(badges[L][h]["stats"]["induction"] is not None for L in (0, 1) for h in range(4))


def test_the_table_names_each_head_with_its_evidence(model: Any, files: Path) -> None:
    args = [str(files / "all.npy"), "-w", str(model[0])]
    rows = json.loads(cli(*args, "--format", "json").stdout)["statistics"]
    text = runner.invoke(app, ["heads", *args], env={"COLUMNS": "200"}).stdout
    for r in rows:
        for p in r["patterns"]:
            stat = {"sink": "first", "previous-token": "previous", "self": "self", "induction": "induction",
                    "broad": "entropy_norm", "focused": "max"}[p]
            assert f"layer {r['layer']} head {r['head']}: " in text and f"{p} — {r[stat]['mean']:.2f}" in text
    assert "sink: first >= 0.3" in " ".join(text.split())


def test_top_ranks_heads_in_every_format(model: Any, files: Path) -> None:
    args = [str(files / "all.npy"), "-w", str(model[0]), "--metric", "first", "--top", "3"]
    every = json.loads(cli(str(files / "all.npy"), "-w", str(model[0]), "--format", "json").stdout)["statistics"]
    best = sorted(every, key=lambda r: -r["first"]["mean"])[:3]
    got = json.loads(cli(*args, "--format", "json").stdout)["statistics"]
    assert [(r["layer"], r["head"]) for r in got] == [(r["layer"], r["head"]) for r in best]
    rows = cli(*args, "--format", "csv").stdout.strip().splitlines()[1:]
    assert [tuple(map(int, r.split(",")[:2])) for r in rows] == [(r["layer"], r["head"]) for r in best]
    text = runner.invoke(app, ["heads", *args], env={"COLUMNS": "200"}).stdout
    assert "top 3 heads by first" in text and f"{best[0]['first']['mean']:.4f}" in text


def test_plot_is_one_figure_with_a_panel_per_statistic(model: Any, files: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "heads.svg"
    r = cli(str(files / "all.npy"), "-w", str(model[0]), "--plot", str(out), "--format", "csv")
    assert r.exit_code == 0, r.output
    svg = out.read_text()
    for name in ("entropy", "entropy_norm", "first", "previous", "max", "distance"):  # the statistics measured
        assert f"<!-- {name} -->" in svg  # matplotlib writes each text as a comment beside its glyphs
    assert "induction" not in svg  # no token ids: never measured, no panel


def test_text_and_text_file_capture_in_memory(tmp_path: Path) -> None:
    """--text (the capture of issue 31 in memory) measures what `attncli capture` then heads CAPTURE measures;
    --text-file in batches of one gives the same statistics of the corpus (sums over valid queries)."""
    from hf_tiny import CORPUS, llama

    folder = str(llama(tmp_path / "llama"))
    texts = CORPUS[:3]
    r = runner.invoke(app, ["capture", folder, *texts, "-o", str(tmp_path / "cap.npz")])
    assert r.exit_code == 0, r.output
    by_file = json.loads(cli(str(tmp_path / "cap.npz"), "-w", folder, "--format", "json").stdout)
    args = [a for t in texts for a in ("--text", t)]
    r = cli(*args, "-w", folder, "--format", "json")
    assert r.exit_code == 0, r.output
    by_text = json.loads(r.stdout)
    assert by_text["statistics"] == by_file["statistics"] and by_text["inputs"] == by_file["inputs"]
    assert by_text["statistics"][0]["special"]["n"] > 0  # '<s>' is a special token of the capture
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    r = cli("--text-file", str(tmp_path / "texts.txt"), "--batch-size", "1", "-w", folder, "--format", "json")
    assert r.exit_code == 0, r.output
    for a, b in zip(json.loads(r.stdout)["statistics"], by_file["statistics"]):
        for name in ("entropy", "first", "previous", "special", "induction"):
            assert a[name]["n"] == b[name]["n"]
            if b[name]["mean"] is not None:
                assert a[name]["mean"] == pytest.approx(b[name]["mean"], rel=1e-5, abs=1e-6)

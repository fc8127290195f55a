"""The diagnostics of self/view name a head's pattern (issue 33): against a float64 computation from transformers'
own eager attention weights of a tiny model (tests/hf_tiny.py), by the definitions and thresholds issue 33 states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_tiny  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402

runner = CliRunner()
TEXT = "the cat drank the milk because it was sweet the cat drank the milk"
# issue 33's patterns: (statistic, threshold)
THRESHOLDS = {"sink": ("first", 0.3), "previous-token": ("previous", 0.5), "self": ("self", 0.5),
              "induction": ("induction", 0.4), "broad": ("entropy_norm", 0.9), "focused": ("max", 0.9)}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers.utils.logging.set_verbosity_error()
    return hf_tiny.llama(tmp_path_factory.mktemp("hf") / "llama")


def reference(folder: Path, text: str, layer: int) -> dict[int, dict[str, float]]:
    """Per head, issue 33's statistics by a plain loop over the float64 eager weights (one causal entry, no
    padding: every query valid, the first position 0)."""
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok([text], return_tensors="pt")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                              dtype=torch.float64).eval()
    with torch.no_grad():
        a = model(**enc, output_attentions=True).attentions[layer][0].numpy()  # (H, T, T)
    ids = enc["input_ids"][0].tolist()
    out = {}
    for h in range(a.shape[0]):
        first, own, prev, ind, ent_n, top = [], [], [], [], [], []
        for i in range(a.shape[1]):
            row = a[h, i, :i + 1]  # the keys query i may attend (causal)
            first.append(row[0])
            own.append(row[i])
            top.append(row.max())
            if i >= 1:
                prev.append(row[i - 1])
                nz = row[row > 0]
                ent_n.append(float(-(nz * np.log(nz)).sum()) / np.log(i + 1))
            earlier = [p for p in range(i) if ids[p] == ids[i]]
            if earlier:
                ind.append(a[h, i, earlier[-1] + 1])
        out[h] = {"first": float(np.mean(first)), "self": float(np.mean(own)), "previous": float(np.mean(prev)),
                  "induction": float(np.mean(ind)) if ind else float("nan"), "entropy_norm": float(np.mean(ent_n)),
                  "max": float(np.mean(top))}
    return out


@pytest.mark.parametrize("layer", [0, 1])
def test_heads_named_as_the_models_own_weights_say(llama: Path, layer: int) -> None:
    ref = reference(llama, TEXT, layer)
    named = {h: [p for p, (st, t) in THRESHOLDS.items() if ref[h][st] >= t] for h in ref}
    # the statistics are float32 recomputations: no reference value may sit on a threshold
    assert all(abs(ref[h][st] - t) > 2e-3 for h in ref for st, t in THRESHOLDS.values() if ref[h][st] == ref[h][st])
    r = runner.invoke(app, ["self", "--text", TEXT, "-w", str(llama), "--layer", str(layer), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    got = {d["head"]: d for d in json.loads(r.stdout)["diagnostics"]["head_patterns"]}
    assert {h: d["patterns"] for h, d in got.items()} == {h: p for h, p in named.items() if p}
    for h, d in got.items():
        for p, v in d["values"].items():
            assert v == pytest.approx(ref[h][THRESHOLDS[p][0]], abs=1e-5)


def test_a_sink_and_an_unnamed_head(llama: Path) -> None:
    """Layer 1 of this model on TEXT (numbers read off the float64 reference): a head puts most of its weight on
    '<s>', another passes no pattern: the first named with the label, the second by nothing."""
    ref = reference(llama, TEXT, 1)
    sinks = [h for h in ref if ref[h]["first"] >= 0.3]
    none = [h for h in ref if not any(ref[h][st] >= t for st, t in THRESHOLDS.values())]
    assert sinks and none
    r = runner.invoke(app, ["self", "--text", TEXT, "-w", str(llama), "--layer", "1", "--steps", "weights"])
    assert r.exit_code == 0, r.stderr
    text = " ".join(r.stdout.split())  # wrapped to the terminal's width
    for h in sinks:
        assert f"head {h}: sink — {ref[h]['first']:.2f} of its weight on `<s>`" in text
    for h in none:
        assert f"head {h}:" not in text


# ---- heads --cross: the decoder's cross-attention of a --target capture ------------------------------------------


@pytest.mark.parametrize("name, prefix", [("bart", "model.decoder.layers."), ("t5", "decoder.block.")])
def test_heads_cross_against_the_models_cross_attentions(name: str, prefix: str, tmp_path: Path) -> None:
    """Per decoder layer × head: entropy, entropy_norm, max, first and special over the decoder's queries and the
    encoder's real tokens, from transformers' own cross_attentions (eager, float64); the positional statistics
    (self, previous, next, distance, induction, duplicate) need shared positions: null."""
    from attncli.io.capture import read_capture

    transformers.utils.logging.set_verbosity_error()
    folder = getattr(hf_tiny, name)(tmp_path / name)
    texts, target = ["the cat drank the milk", "the dog"], "le chat a bu"
    out = tmp_path / "x.npz"
    assert runner.invoke(app, ["capture", str(folder), *texts, "--target", target, "-o", str(out)]).exit_code == 0
    r = runner.invoke(app, ["heads", str(out), "-w", str(folder), "--cross", "--prefix", prefix,
                            "--format", "json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(texts, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    special = enc.pop("special_tokens_mask").numpy().astype(bool)
    dec_ids = torch.tensor(read_capture(out).decoder.input_ids)
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64).eval()
    with torch.no_grad():
        ref = model(**enc, decoder_input_ids=dec_ids, output_attentions=True).cross_attentions
    real = enc["attention_mask"].numpy().astype(bool)
    rows = {(d["layer"], d["head"]): d for d in doc["statistics"]}
    assert doc["layers"] == [0, 1] and len(rows) == 2 * 4
    for layer in (0, 1):
        a = ref[layer].numpy()  # (B, H, m, n)
        for h in range(a.shape[1]):
            ent, ent_n, top, first, spec = [], [], [], [], []
            for b in range(a.shape[0]):
                keys = np.flatnonzero(real[b])
                for i in range(a.shape[2]):  # one target: every decoder query is a token
                    row = a[b, h, i, keys]
                    e = float(-(row * np.log(row)).sum())
                    ent.append(e)
                    ent_n.append(e / np.log(len(keys)))
                    top.append(row.max())
                    first.append(row[0])
                    spec.append(a[b, h, i, special[b] & real[b]].sum())
            d = rows[(layer, h)]
            want = {"entropy": ent, "entropy_norm": ent_n, "max": top, "first": first, "special": spec}
            for name, values in want.items():
                assert d[name]["n"] == len(values)
                assert d[name]["mean"] == pytest.approx(float(np.mean(values)), abs=1e-5), (layer, h, name)
            for name in ("self", "previous", "next", "distance", "induction", "duplicate"):
                assert d[name]["mean"] is None, name


def test_heads_cross_needs_a_target_capture(llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.npz"
    assert runner.invoke(app, ["capture", str(llama), TEXT, "-o", str(out)]).exit_code == 0
    r = runner.invoke(app, ["heads", str(out), "-w", str(llama), "--cross"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "--target" in lines[0] and len(lines[0]) < 300
    r = runner.invoke(app, ["heads", "--text", TEXT, "-w", str(llama), "--cross"])
    assert r.exit_code == 2 and "--cross" in r.stderr


def test_an_underflowed_weight_is_still_a_key() -> None:
    """A weight of exactly 0 that the mask did not hide (exp underflow) is a key the query may attend: entropy_norm
    divides by ln 2 for the query [1, 0] and counts it; masked, the query sees one key and is not counted."""
    from attncli.core import headstats as hs

    a = np.array([[[[1.0, 0.0], [0.25, 0.75]]]])  # (B, H, m, n): two queries of a bidirectional layer
    seqs = [hs.Sequence.plain(2)]
    i = hs.STATS.index("entropy_norm")
    s, c = hs.weights_sums(a, seqs, masked=np.zeros((1, 1, 2, 2), bool))
    h2 = -(0.25 * np.log(0.25) + 0.75 * np.log(0.75)) / np.log(2)
    assert c[0, 0, i] == 2 and s[0, 0, i] == pytest.approx(h2, abs=1e-12)
    s, c = hs.weights_sums(a, seqs)  # every 0 taken as masked
    assert c[0, 0, i] == 1 and s[0, 0, i] == pytest.approx(h2, abs=1e-12)


# ---- a value beside its threshold: enough digits to read on the right side of it ---------------------------------


@pytest.mark.parametrize("value, threshold, shown", [
    (0.3004, 0.3, "0.3004"),  # "0.30" would read as equal to the threshold it passes
    (0.3, 0.3, "0.30"),  # exactly on it: ≥ holds as printed
    (0.83, 0.3, "0.83"),
    (0.305, 0.3, "0.305"),  # 0.305 is 0.30499999999999999 in binary: "0.30" at two decimals
    (0.2996, 0.3, "0.2996"),  # below: "0.30" would read as passing
    (0.9000001, 0.9, "0.9000001"),
])
def test_a_value_beside_its_threshold_shows_its_side(value: float, threshold: float, shown: str) -> None:
    from attncli.core.headstats import beside

    assert beside(value, threshold) == shown


def test_a_sink_just_above_its_threshold_is_printed_above_it() -> None:
    """Every query of one bidirectional head puts 0.3004 of its weight on the first key (the rest spread evenly):
    its sink share is 0.3004 by construction, just above issue 33's 0.3. The diagnostics line (self/view) and
    the `heads` evidence line print 0.3004, not "0.30 (≥ 0.3)"."""
    import io

    from rich.console import Console

    from attncli.core import headstats as hs
    from attncli.render.heads import evidence

    t = 5
    a = np.full((1, 1, t, t), (1 - 0.3004) / (t - 1))
    a[..., 0] = 0.3004
    named = hs.name_heads(a, [hs.Sequence.plain(t)], first_label="<s>")
    assert [d["head"] for d in named] == [0] and "sink" in named[0]["patterns"]
    assert named[0]["values"]["sink"] == pytest.approx(0.3004, abs=1e-12)
    assert "sink — 0.3004 of its weight on `<s>` (≥ 0.3)" in named[0]["sentence"]

    doc = {"statistics": [{"layer": 2, "head": 0, "patterns": ["sink"], "first": {"mean": 0.3004}}],
           "thresholds": {"sink": {"statistic": "first", "at_least": 0.3}}}
    out = io.StringIO()
    evidence(doc, Console(file=out, width=200, color_system=None))
    assert out.getvalue().strip() == "layer 2 head 0: sink — 0.3004 of its weight on the first token (≥ 0.3)"

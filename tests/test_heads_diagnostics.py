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

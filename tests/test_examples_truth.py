"""Every claim an example's one-line description makes (what `attncli examples` lists) is true.

Each claim is a phrase of the description paired with a check computed here, in numpy float64, from
the example's own q/k/v (never with attncli's stages). A description may say nothing else: once the
checked phrases are removed only punctuation and joining words remain, so a new claim fails this
test until a check for it is written. Also: no example names a path its users do not have.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from attncli.cli import app

EXAMPLES = Path(__file__).resolve().parent.parent / "attncli" / "examples"
Doc = dict[str, Any]


def load(name: str) -> Doc:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text(encoding="utf-8"))


def arr(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def self_weights(doc: Doc) -> np.ndarray:
    """softmax(X Xᵀ / sqrt(d)) for a Q = K = V = X example (its scores are scaled dot products)."""
    x = arr(doc["q"])
    assert doc["options"]["score"] == "scaled-dot" and "k" not in doc and "v" not in doc
    return softmax(x @ x.T / np.sqrt(x.shape[-1]))  # (m, d) x (d, m) -> (m, m)


def attends_most(doc: Doc, w: np.ndarray, query: str, key: str) -> bool:
    lab = doc["labels"]
    row = w[lab.index(query)]
    return bool(np.argmax(row) == lab.index(key)) and int(np.sum(row == row.max())) == 1


def all_tie(doc: Doc, w: np.ndarray, query: str, n: int) -> bool:
    row = w[doc["labels"].index(query)]
    return len(row) == n and bool(np.allclose(row, 1 / n, rtol=0, atol=1e-15))


def d2l_outputs(doc: Doc) -> list[list[float]]:
    """Masked softmax over the valid keys by hand (d2l's recipe), then weights · V, per batch entry."""
    out = []
    for b, n_valid in enumerate(doc["valid_lens"]):
        q, k, v = arr(doc["q"][b]), arr(doc["k"][b]), arr(doc["v"][b])
        if doc["options"]["score"] == "additive":
            wq, wk, wv = arr(doc["weights"]["W_q"]), arr(doc["weights"]["W_k"]), arr(doc["weights"]["w_v"])
            s = np.tanh((q @ wq)[:, None, :] + (k @ wk)[None, :, :]) @ wv.reshape(-1)  # (m, n, h) · (h,) -> (m, n)
        else:
            s = q @ k.T / np.sqrt(q.shape[-1])  # (m, d) x (d, n) -> (m, n)
        s[:, int(n_valid):] = -np.inf
        out.append((softmax(s) @ v).tolist())  # (m, n) x (n, dv) -> (m, dv)
    return out


def masked_weights(doc: Doc) -> np.ndarray:
    x, vl = arr(doc["q"]), np.asarray(doc["valid_lens"])
    s = x @ arr(doc["k"]).T  # (b, m, d) x (d, n) -> (b, m, n); K = I, unscaled dot: the scores are X
    keep = np.arange(s.shape[-1]) < (vl[:, None, None] if vl.ndim == 1 else vl[:, :, None])
    return softmax(np.where(keep, s, float(doc["options"]["mask_value"])))


def nw_samples_match(doc: Doc) -> bool:
    """The stored samples are numpy.random.default_rng(0)'s, drawn as the file's comment says."""
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 5, 50))
    y = 2 * np.sin(x) + x ** 0.8 + rng.normal(0, 0.5, 50)
    return bool(np.allclose(arr(doc["k"]).ravel(), np.round(x, 4), atol=1e-4)
                and np.allclose(arr(doc["v"]).ravel(), np.round(y, 4), atol=1e-4))


def nw_fits_curve(doc: Doc) -> bool:
    """y - (2 sin x + x^0.8) is noise of standard deviation about 0.5."""
    x, y = arr(doc["k"]).ravel(), arr(doc["v"]).ravel()
    return 0.3 < float(np.std(y - (2 * np.sin(x) + x ** 0.8))) < 0.7


def taste_head_sweet(doc: Doc) -> bool:
    x = arr(doc["x"])
    assert np.array_equal(arr(doc["weights"]["W_q"]), np.eye(2)) and np.array_equal(arr(doc["weights"]["W_k"]), np.eye(2))
    t = x[:, 1:2]  # the taste column: head 1, width 1, scaled by sqrt(1)
    w = softmax(t @ t.T)  # (m, 1) x (1, m) -> (m, m)
    sweet = doc["labels"].index("sweet")
    return all(int(np.argmax(r)) == sweet and int(np.sum(r == r.max())) == 1 for r in w)


Check = Callable[[Doc], bool]
CLAIMS: dict[str, list[tuple[str, Check]]] = {
    "cat_milk_sweet": [
        ("the notes' cat/milk/it/sweet sentence", lambda d: d["labels"] == ["cat", "milk", "it", "sweet"]),
        ("self-attention", lambda d: "k" not in d and "v" not in d),
        ("d = 4", lambda d: arr(d["q"]).shape[-1] == 4),
        ("'it' attends to all 4 words alike (all 4 keys tie)", lambda d: all_tie(d, self_weights(d), "it", 4)),
        ("'milk' and 'sweet' most to 'sweet'",
         lambda d: attends_most(d, self_weights(d), "milk", "sweet") and attends_most(d, self_weights(d), "sweet", "sweet")),
    ],
    "cat_milk_hungry": [
        ("the notes' cat/milk/it/hungry sentence", lambda d: d["labels"] == ["cat", "milk", "it", "hungry"]),
        ("self-attention", lambda d: "k" not in d and "v" not in d),
        ("d = 4", lambda d: arr(d["q"]).shape[-1] == 4),
        ("'it' attends to all 4 words alike (all 4 keys tie)", lambda d: all_tie(d, self_weights(d), "it", 4)),
        ("'milk' most to 'milk'", lambda d: attends_most(d, self_weights(d), "milk", "milk")),
        ("'hungry' most to 'hungry'", lambda d: attends_most(d, self_weights(d), "hungry", "hungry")),
    ],
    "d2l_additive": [
        ("d2l AdditiveAttention example", lambda d: d["options"]["score"] == "additive"),
        ("q width 20", lambda d: arr(d["q"]).shape[-1] == 20),
        ("k width 2", lambda d: arr(d["k"]).shape[-1] == 2),
        ("h = 8", lambda d: arr(d["weights"]["W_q"]).shape == (20, 8)),
        ("-> [[2,3,4,5]], [[10,11,12,13]]",
         lambda d: np.allclose(d2l_outputs(d), [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=0, atol=1e-12)),
    ],
    "d2l_dot_product": [
        ("d2l DotProductAttention example", lambda d: d["options"]["score"] == "scaled-dot"),
        ("valid lens [2, 6]", lambda d: d["valid_lens"] == [2, 6]),
        ("-> [[2,3,4,5]], [[10,11,12,13]]",
         lambda d: np.allclose(d2l_outputs(d), [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=0, atol=1e-12)),
    ],
    "d2l_masked_softmax": [
        ("d2l masked_softmax", lambda d: np.allclose(masked_weights(d), arr(d["expected"]["weights"]), atol=5e-5)),
        ("valid lens [2, 3]", lambda d: d["valid_lens"] == [2, 3]),
        ("fixed scores", lambda d: np.array_equal(arr(d["k"]), np.eye(4)) and d["options"]["score"] == "dot"),
        ("mask value -1e6", lambda d: float(d["options"]["mask_value"]) == -1e6),
    ],
    "d2l_masked_softmax_2d": [
        ("d2l masked_softmax", lambda d: np.allclose(masked_weights(d), arr(d["expected"]["weights"]), atol=5e-5)),
        ("2-D valid lens [[1, 3], [2, 4]]", lambda d: d["valid_lens"] == [[1, 3], [2, 4]]),
        ("one per query", lambda d: np.asarray(d["valid_lens"]).shape == arr(d["q"]).shape[:2]),
    ],
    "multihead_cat_milk": [
        ("the cat/milk/it/sweet sentence", lambda d: d["labels"] == ["cat", "milk", "it", "sweet"]),
        ("2 heads, one per column", lambda d: d["heads"] == 2 and arr(d["x"]).shape[-1] == 2),
        ("(state, taste)", lambda d: arr(d["x"]).shape[-1] == 2),
        ("in the taste head every word attends most to 'sweet'", taste_head_sweet),
    ],
    "nadaraya_watson": [
        ("Nadaraya-Watson kernel regression", lambda d: d["options"]["score"] == "gaussian"),
        ("of 2 sin x + x^0.8", nw_fits_curve),
        ("Gaussian scores", lambda d: d["options"]["score"] == "gaussian" and d["options"]["bandwidth"] == 1.0),
        ("50 points", lambda d: arr(d["k"]).shape == (50, 1) and arr(d["v"]).shape == (50, 1)),
        ("seed 0", nw_samples_match),
    ],
    "row_vector_query": [
        ("one row-vector query q (1×4)", lambda d: arr(d["q"]).shape == (1, 4) and d["query_labels"] == ["q"]),
        ("against 3 keys", lambda d: arr(d["k"]).shape[0] == 3),
        ("as in the derivation note", lambda d: d["options"]["score"] == "scaled-dot"),
    ],
}
FILLER = re.compile(r"^(?:[\s,;:()\-—]|\band\b|\bwith\b)*$")


def test_every_example_has_its_claims_listed() -> None:
    assert sorted(CLAIMS) == sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_every_claim_of_the_description_holds(name: str) -> None:
    doc = load(name)
    rest = doc["description"]
    for phrase, check in CLAIMS[name]:
        assert phrase in rest, f"{name}: the description no longer says {phrase!r}"
        assert check(doc), f"{name}: the description says {phrase!r}, which is not true"
        rest = rest.replace(phrase, " ", 1)
    assert FILLER.match(rest), f"{name}: an unchecked claim is left in the description: {rest!r}"


def test_a_wrong_claim_is_caught() -> None:
    """The checks can fail: 'it' in cat_milk_sweet does not attend most to 'milk' (the old description)."""
    doc = load("cat_milk_sweet")
    w = self_weights(doc)
    assert not attends_most(doc, w, "it", "milk") and not attends_most(doc, w, "milk", "milk")
    assert not all_tie(doc, w, "milk", 4)


def test_no_example_names_a_path_users_lack() -> None:
    for p in EXAMPLES.glob("*.yaml"):
        text = p.read_text(encoding="utf-8")
        assert "shared/" not in text and "attncli/examples/" not in text and "../" not in text, p.name


def test_the_list_shows_the_descriptions() -> None:
    r = CliRunner().invoke(app, ["examples"], env={"COLUMNS": "400"})
    assert r.exit_code == 0
    for name in CLAIMS:
        assert " ".join(load(name)["description"].split()) in " ".join(r.stdout.split()), name


def test_ties_are_named_as_ties_in_the_diagnostics_and_the_view() -> None:
    """cat_milk_sweet: 'cat' and 'it' weigh all 4 keys alike (numpy above); JSON counts the tie, the
    view says so instead of naming the first key, and bolds no cell of a uniform row."""
    import json

    from attncli.render.terminal import row_best

    doc = load("cat_milk_sweet")
    w = self_weights(doc)
    ties = [int(np.sum(r == r.max())) for r in w]
    assert ties == [4, 1, 4, 1]
    r = CliRunner().invoke(app, ["examples", "run", "cat_milk_sweet", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["diagnostics"]["top_ties"] == ties
    r = CliRunner().invoke(app, ["examples", "run", "cat_milk_sweet", "--steps", "weights"], env={"COLUMNS": "100"})
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if "keys tie" in line or "sweet │ 0.6103" in line}
    assert "all 4 keys tie" in rows["cat"] and "all 4 keys tie" in rows["it"] and "milk" in rows
    assert row_best(w[0], None) == frozenset() and row_best(w[1], None) == {int(np.argmax(w[1]))}
    assert row_best(np.array([0.4, 0.4, 0.2]), None) == {0, 1}  # two of three tie: both are the strongest
    assert row_best(np.array([0.5, 0.5, 0.0]), np.array([False, False, True])) == frozenset()  # all it sees


def test_a_bundled_example_given_as_a_missing_path_suggests_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # outside the clone: the README's path does not exist here
    for spec, stem in (("cat_milk_sweet.yaml", "cat_milk_sweet"), ("examples/d2l_additive.yaml", "d2l_additive")):
        r = CliRunner().invoke(app, ["run", spec])
        assert r.exit_code == 2
        err = r.stderr.strip()
        assert "\n" not in err and len(err) < 300 and spec in err and f"attncli examples run {stem}" in err
    r = CliRunner().invoke(app, ["run", "not_an_example.yaml"])
    assert r.exit_code == 2 and "examples run" not in r.stderr

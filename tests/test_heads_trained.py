"""A model whose heads are known, named correctly; its untrained twin names no induction head.

The recipe (issue 33): a 2-layer Llama-style model (rotary, hidden 64, 4 heads) trained with AdamW (lr 2e-3, batch
32) on a BOS token, a random prefix and random tokens repeated twice (repeat length 5-19), the loss on the second
copy, forms a previous-token head in layer 0 and induction heads in layer 1 within 500 steps (Olsson et al.
2022's two-layer circuit: the loss falls from 3.6 to 0.4 between steps 200 and 300; at 500 the best previous-token
score is 0.89, the best induction score 0.84). Trained once per session, seeded; slow (seconds on idle cores, minutes
on busy ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from attncli.cli import app  # noqa: E402

V, T, STEPS = 64, 48, 500


def llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=T,
                                   bos_token_id=0, eos_token_id=1, pad_token_id=1)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def train(model: Any, steps: int) -> float:
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        ids = rng.integers(2, V, size=(32, T))
        ids[:, 0] = 0  # BOS
        w = np.zeros((32, T), dtype=bool)
        for b in range(32):
            r = int(rng.integers(5, 20))
            s = 1 + int(rng.integers(0, T - 2 * r))  # after BOS and a random prefix
            ids[b, s + r:s + 2 * r] = ids[b, s:s + r]
            w[b, s + r + 1:s + 2 * r] = True  # the second copy (its first token is not predictable)
        x = torch.as_tensor(ids)
        logits = model(x).logits[:, :-1]
        per = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1), reduction="none")
        mask = torch.as_tensor(w[:, 1:]).reshape(-1)
        loss = (per * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


@pytest.fixture(scope="session")
def trained(tmp_path_factory: Any) -> tuple[Path, Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is fastest, and the machine is shared
    try:
        model = llama()
        folder = tmp_path_factory.mktemp("untrained")
        model.save_pretrained(folder)
        loss = train(model, STEPS)
    finally:
        torch.set_num_threads(threads)
    assert loss < 0.5, loss  # it learnt to copy
    done = tmp_path_factory.mktemp("trained")
    model.eval().save_pretrained(done)
    return done, folder


def heads(folder: Path) -> list[dict[str, Any]]:
    r = CliRunner().invoke(app, ["heads", "--induction", "15", "--weights", str(folder), "--format", "json",
                                 "--seed", "1"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["statistics"]


@pytest.mark.slow
def test_trained_heads_are_named(trained: tuple[Path, Path]) -> None:
    rows = heads(trained[0])
    named = {(r["layer"], r["head"]): r["patterns"] for r in rows}
    layer0 = [r for r in rows if r["layer"] == 0]
    layer1 = [r for r in rows if r["layer"] == 1]
    best_prev = max(r["previous"]["mean"] for r in layer0)
    best_ind = max(r["induction"]["mean"] for r in layer1)
    assert best_prev >= 0.6 and any("previous-token" in named[(0, r["head"])] for r in layer0), layer0
    assert best_ind >= 0.7 and any("induction" in named[(1, r["head"])] for r in layer1), layer1
    assert not any("induction" in named[(0, h)] for h in range(4))  # layer 0 cannot do induction alone


@pytest.mark.slow
def test_the_untrained_twin_names_no_induction_head(trained: tuple[Path, Path]) -> None:
    rows = heads(trained[1])
    assert not any("induction" in r["patterns"] for r in rows)
    assert max(r["induction"]["mean"] for r in rows) < 0.2

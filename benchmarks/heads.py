"""attncli heads, side by side with the blocked output-only pass of the same layer (issue 33).

    python benchmarks/heads.py speed      # one causal layer, T = 4096, 32 heads (d = 64): heads vs output-only
    python benchmarks/heads.py memory     # peak memory of heads at T = 16,384 with 8 heads (limit 1 GB)
    python benchmarks/heads.py corpus     # attncli heads over 100 and 1,000 inputs of a tiny model: peak memory

Each mode prints one line of JSON. Sizes can be made smaller with --t and --heads (the machine is shared).

Measured here (2 cores shared by eight developers, load about 11; numpy, float32, causal, d = 64):
    speed   T = 4096, 32 heads: heads 10.2 s, output-only 8.2 s (ratio 1.24, the shifted exp by ops.softmax_parts, the
            one softmax; 0.95 with an in-place exp of heads' own, which the project's one-softmax rule forbids)
    memory  T = 16,384, 8 heads: 52 MiB of arrays at peak (tracemalloc), 196 MiB resident in all
    corpus  100 and 1,000 captures of 32 tokens, 2 layers: 355 MiB resident at both (ratio 1.0004)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from attncli.core import blocked, engine
from attncli.core import headstats as hs
from attncli.core.backend import get_backend
from attncli.core.options import Options
from attncli.core.problem import Problem
from attncli.core.trace import Trace


def problem(t: int, heads: int, d: int = 64, seed: int = 0) -> Problem:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, heads, t, d), dtype=np.float32) for _ in range(3))
    return Problem.build(q, k, v, options=Options(causal=True, score="scaled-dot"))


def speed(t: int, heads: int, repeat: int) -> dict[str, float]:
    p = problem(t, heads)
    be = get_backend("numpy")
    prep = engine.prepare(p, be)
    seqs = [hs.Sequence.plain(t)]

    def out_only() -> None:
        blocked.output_only(prep.core, be, prep.q, prep.k, prep.v, prep.params, Trace())

    def stats() -> None:
        hs.layer_sums(prep, seqs)

    best = {}
    for name, fn in (("output_only_s", out_only), ("heads_s", stats)):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    best["ratio"] = best["heads_s"] / best["output_only_s"]
    return best


def memory(t: int, heads: int) -> dict[str, float]:
    p = problem(t, heads)
    tracemalloc.start()
    prep = engine.prepare(p, get_backend("numpy"))
    hs.layer_sums(prep, [hs.Sequence.plain(t)])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"T": t, "heads": heads, "peak_traced_mib": peak / 2**20,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def corpus(counts: list[int]) -> dict[str, float]:
    """attncli heads over N capture-like inputs (files of one text each, T = 32) of a tiny random Llama: peak RSS."""
    import torch
    import transformers

    d = Path(tempfile.mkdtemp())
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    m.save_pretrained(d / "model")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(max(counts)):
        ids = rng.integers(0, 64, size=(1, 32))
        with torch.no_grad():
            h = m(torch.as_tensor(ids), output_hidden_states=True).hidden_states
        p = d / f"in{i}.npz"
        np.savez(p, format=np.array("attncli-capture/1"), hidden_states=np.stack([x.numpy() for x in h]),
                 input_ids=ids, attention_mask=np.ones_like(ids), tokens=np.array([[f"t{t}" for t in ids[0]]]),
                 labels=np.array([[f" t{t}" for t in ids[0]]]), provenance=np.array("{}"))
        paths.append(str(p))
    out = {}
    for n in counts:
        code = ("import resource, sys; from attncli.cli import main; sys.argv = ['attncli', 'heads', *sys.argv[1:]]\n"
                "try:\n main()\nexcept SystemExit:\n pass\n"
                "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=sys.stderr)")
        r = subprocess.run([sys.executable, "-c", code, *paths[:n], "--weights", str(d / "model"), "--format", "csv",
                            "-q"], capture_output=True, text=True, check=True)
        out[f"peak_rss_mib_{n}"] = float(r.stderr.strip().splitlines()[-1])
    out["ratio"] = out[f"peak_rss_mib_{max(counts)}"] / out[f"peak_rss_mib_{min(counts)}"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("speed", "memory", "corpus"))
    ap.add_argument("--t", type=int, default=None)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    if a.mode == "speed":
        res = speed(a.t or 4096, a.heads or 32, a.repeat)
    elif a.mode == "memory":
        res = memory(a.t or 16384, a.heads or 8)
    else:
        res = corpus([100, 1000])
    print(json.dumps(res))


if __name__ == "__main__":
    main()

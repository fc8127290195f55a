"""`attncli capture` against transformers' own eager forward, side by side in one run (issue 31).

    python benchmarks/capture.py            # hidden 256, 4 layers, 8 heads, T = 512, batch 4
    python benchmarks/capture.py --quick    # small sizes: checks the script, not the targets

Targets: the capture (tokenize, forward with output_hidden_states/output_attentions, the states and weights as
numpy) costs <= 1.1x transformers' own eager forward on the same input, done as a script would (tokenize, forward
with output_hidden_states=True, output_attentions=True); the file's write is reported separately. Peak memory
<= the model + 2x the states written: measured as the capture's peak over transformers' own (whose eager forward
alone takes more than that, at T = 512: every layer's scores, mask and softmax).

Each side runs in turn (interleaved, best of --repeats) on one model loaded once, so a busy machine slows both
alike; peak memory is each side's own, in a fresh child process (VmHWM of /proc/self/status, read at exit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = [f"w{i}" for i in range(500)]


def build(folder: Path, hidden: int, layers: int, heads: int) -> None:
    import tokenizers as k
    import transformers as t

    tok = k.Tokenizer(k.models.WordLevel({w: i for i, w in enumerate(["[PAD]", "[UNK]", "<s>", *WORDS])},
                                         unk_token="[UNK]"))
    tok.pre_tokenizer = k.pre_tokenizers.Whitespace()
    tok.post_processor = k.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 2)])
    t.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                              bos_token="<s>").save_pretrained(folder)
    cfg = t.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=heads // 2, vocab_size=len(WORDS) + 3,
                        max_position_embeddings=1024)
    t.LlamaForCausalLM(cfg).save_pretrained(folder)


def texts(batch: int, length: int) -> list[str]:
    return [" ".join(WORDS[(b * 7 + i) % len(WORDS)] for i in range(length - 1)) for b in range(batch)]


def own(model: object, tok: object, batch: list[str]) -> object:
    """transformers' own, as a script does it: tokenize, one eager forward with every state and weight."""
    import torch

    enc = tok(batch, padding=True, return_tensors="pt")  # type: ignore[operator]
    with torch.no_grad():
        return model(**enc, output_hidden_states=True, output_attentions=True)  # type: ignore[operator]


def child(kind: str, folder: str, batch: int, length: int, out: str) -> None:
    """One side alone in this process, for its peak memory."""
    import transformers

    from attncli.io.capture import write_capture
    from attncli.io.hf import capture

    transformers.utils.logging.set_verbosity_error()
    batch_texts = texts(batch, length)
    start = _hwm()  # every module imported, nothing loaded
    if kind == "own":
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
        own(model, tok, batch_texts)
    else:
        cap = capture(folder, batch_texts)
        write_capture(cap, out)
    print(json.dumps({"peak": _hwm(), "start": start}))


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--child", nargs=5)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), int(a.child[3]), a.child[4])
        return
    import numpy as np
    import transformers

    from attncli.io.capture import write_capture
    from attncli.io.hf import _quiet, capture_loaded

    transformers.utils.logging.set_verbosity_error()
    hidden, layers, heads, length, batch = (64, 2, 4, 64, 2) if a.quick else (256, 4, 8, 512, 4)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder, hidden, layers, heads)
        tok = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
        batch_texts = texts(batch, length)
        own_times, cap_times, write_times = [], [], []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            ref = own(model, tok, batch_texts)
            own_times.append(time.perf_counter() - t0)
            del ref
            with _quiet(transformers):
                t0 = time.perf_counter()
                cap = capture_loaded(model, tok, batch_texts, str(folder))
                cap_times.append(time.perf_counter() - t0)
            out = Path(tmp) / "cap.npz"
            t0 = time.perf_counter()
            write_capture(cap, out)
            write_times.append(time.perf_counter() - t0)
        states = sum(v.nbytes for v in cap.arrays().values())
        model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        del cap
        peaks = {}
        for kind in ("own", "capture"):
            proc = subprocess.run([sys.executable, __file__, "--child", kind, str(folder), str(batch), str(length),
                                   str(Path(tmp) / f"{kind}.npz")], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
            peaks[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    best_own, best_cap = min(own_times), min(cap_times)
    ratio = best_cap / best_own
    growth = {k: v["peak"] - v["start"] for k, v in peaks.items()}  # loading the model, running it, keeping it
    print(f"model: hidden {hidden}, {layers} layers, {heads} heads, T = {length}, batch {batch}; "
          f"load avg {os.getloadavg()[0]:.2f}")
    print(f"transformers' own eager forward (tokenize + forward, states and weights): best {best_own * 1e3:.0f} ms")
    print(f"attncli capture (the same, as numpy):                                   best {best_cap * 1e3:.0f} ms"
          f"  -> {ratio:.2f}x (target <= 1.1x) {'OK' if ratio <= 1.1 else 'MISSED'}")
    print(f"writing the .npz ({states / 2**20:.0f} MB):                                  best "
          f"{min(write_times) * 1e3:.0f} ms (reported apart)")
    limit = model_bytes + 2 * states
    extra = growth["capture"] - growth["own"]
    print(f"peak memory above the imports: capture (load, forward, write) {growth['capture'] / 2**20:.0f} MB, "
          f"transformers' own (load, forward) {growth['own'] / 2**20:.0f} MB: the capture holds "
          f"{extra / 2**20:.0f} MB more, within 2x the states written ({2 * states / 2**20:.0f} MB) "
          f"{'OK' if extra <= 2 * states else 'MISSED'}; the model {model_bytes / 2**20:.0f} MB + 2x the states = "
          f"{limit / 2**20:.0f} MB {'holds' if growth['capture'] <= limit else 'is below what transformers own eager '}"
          f"{'' if growth['capture'] <= limit else 'forward alone takes (its scores, masks and softmax per layer)'}")
    print(f"  (all repeats: own {np.round(np.array(own_times) * 1e3).tolist()} ms, capture "
          f"{np.round(np.array(cap_times) * 1e3).tolist()} ms)")

if __name__ == "__main__":
    main()

"""``attncli capture MODEL TEXT... -o FILE.npz``: run a model on some text with transformers and keep what it did."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import typer

from attncli.cli import app, handles_errors
from attncli.cli.options import takes_options
from attncli.core.options import COMPUTE, OUTPUT, option
from attncli.errors import InputError

CAPTURE_HELP = """Run a model on some text with its own tokenizer (transformers) and save what it did, for every \
command that takes X or HIDDEN with --weights MODEL.

The .npz holds the residual stream entering every layer (hidden_states, (layers + 1, batch, T, E); the last is \
transformers' last hidden state), the tokens (tokens: the tokenizer's spelling; labels: each decoded alone, \
" cat" with its space), input_ids, attention_mask, position_ids, special_tokens_mask, generated, the model's own \
attention weights (eager) within --max-attention-mb, and provenance (the model folder, the SHA-256 of its \
config.json and of its weights' headers, dtype, transformers' version, the texts). Read back with \
allow_pickle=False. Needs the [hf] extra: pip install 'attncli[hf]'.

Examples:

  attncli capture ./tiny-llama "The cat drank the milk because it was sweet" -o cap.npz

  attncli self cap.npz --weights ./tiny-llama --layer 1

  attncli capture ./tiny-t5 "the cat" --target "le chat" -o t5.npz
"""


@dataclass(frozen=True)
class CaptureArgs:
    """``capture``'s own options."""

    COMMANDS: ClassVar[frozenset[str]] = frozenset({"capture"})

    output: Path | None = option(None, "The capture file to write (.npz).", OUTPUT, short="-o", essential=True)
    text_file: Path | None = option(None, "Texts to capture, one per line (after or instead of TEXT).", COMPUTE)
    target: str | None = option(None, "Encoder-decoder models: the decoder's text (its tokens, hidden states, "
                                      "self- and cross-attention are captured too).", COMPUTE)
    generate: int = option(0, "Greedy decoding of N tokens first (stopping at the end-of-sequence token, as "
                              "generate does), then one forward over prompt and generated tokens.", COMPUTE, min=0)
    dtype: str = option("float32", "The forward's dtype: float32, bfloat16, float16, or auto (the checkpoint's).",
                        COMPUTE, choices=lambda: ("float32", "bfloat16", "float16", "auto"))
    device: str | None = option(None, "The forward's device (cpu, cuda, mps; default: transformers').", COMPUTE)
    device_map: str | None = option(None, "auto: a model larger than one device, spread by accelerate.", COMPUTE,
                                    choices=lambda: ("auto",))
    keep_layers: str | None = option(None, "Save only these layers' states and attention, e.g. 0,5,11.", COMPUTE)
    max_attention_mb: float = option(256.0, "Budget of the model's own attention weights kept, in MB (layers in "
                                            "order; the file lists what it left out). 0: none.", COMPUTE, min=0.0)
    chat: bool = option(False, "Wrap each text in the tokenizer's chat template (a user turn).", COMPUTE)
    padding_side: str | None = option(None, "Pad a batch on the left or the right (default: the tokenizer's).",
                                      COMPUTE, choices=lambda: ("left", "right"))
    trust_remote_code: bool = option(False, "Run the model folder's own Python code (never unless given).", COMPUTE)


@app.command("capture", help=CAPTURE_HELP)
@handles_errors
@takes_options("capture")
def capture_command(
    model: Annotated[str, typer.Argument(metavar="MODEL", show_default=False,
                                         help="A model folder (save_pretrained), or a name in the local cache.")],
    texts: Annotated[list[str] | None, typer.Argument(metavar="TEXT...", show_default=False,
                                                      help="The texts (one batch entry each).")] = None,
    opts: CaptureArgs = CaptureArgs(),
) -> None:
    import sys

    from attncli.io.capture import write_capture
    from attncli.io.hf import capture

    if opts.output is None:
        raise InputError("is needed: the .npz to write (-o FILE.npz)", "--output")
    if opts.output.suffix.lower() != ".npz":
        raise InputError("must end in .npz", str(opts.output))
    every = list(texts or []) + (read_texts(str(opts.text_file)) if opts.text_file is not None else [])
    if not every:
        raise InputError("no text given: TEXT... or --text-file FILE", "TEXT")
    cap = capture(model, every, target=opts.target, generate=opts.generate, dtype=opts.dtype, device=opts.device,
                  device_map=opts.device_map, keep_layers=parse_layers(opts.keep_layers),
                  max_attention_mb=opts.max_attention_mb, chat=opts.chat, trust_remote_code=opts.trust_remote_code,
                  padding_side=opts.padding_side)
    write_capture(cap, opts.output)
    s = cap.stack
    left = cap.provenance.get("attentions_left_out") or []
    sys.stderr.write(f"attncli: captured {s.batch} text{'s' if s.batch > 1 else ''} × {s.input_ids.shape[1]} tokens, "
                     f"{s.layers} layers' states, the model's own attention of {len(s.attention_layers)} layer"
                     f"{'s' if len(s.attention_layers) != 1 else ''}"
                     + (f" ({len(left)} left out by --max-attention-mb)" if left else "") + f" -> {opts.output}\n")


def read_texts(path: str) -> list[str]:
    """--text-file: one text per line (blank lines skipped), UTF-8."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot be read ({e.strerror or e})", path) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("is not UTF-8 text", path) from None
    lines = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    if not lines:
        raise InputError("holds no text", path)
    return lines


def parse_layers(text: str | None) -> list[int] | None:
    """--keep-layers 0,5,11 as numbers."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"must be layer numbers like 0,5,11, got {text[:40]!r}", "--keep-layers") from None

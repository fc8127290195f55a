"""Run a model with transformers on some text and keep what it did: :func:`capture` (io layer).

The only module of attncli that imports transformers (the optional ``[hf]`` extra: transformers, tokenizers,
torch, accelerate); nothing imports it at start-up, and attncli's own computation never does.

    cap = capture("./tiny-llama", ["The cat drank the milk"])          # -> attncli.io.capture.Capture
    cap = capture("./tiny-t5", ["the cat"], target="le chat")           # encoder-decoder: the decoder too
    cap = capture("./tiny-gpt2", ["Once"], generate=3)                  # greedy, then one forward over it all

One forward with ``output_hidden_states=True`` and (for the layers the budget keeps) ``output_attentions=True``,
the model loaded with ``attn_implementation="eager"`` so that its attention weights are the ones it computes.
Errors are :class:`~attncli.errors.InputError` (one line); nothing process-wide changes.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attncli.errors import InputError, printable
from attncli.io.capture import Capture, Layers, Stack, config_digest, headers_digest, readable

DTYPES = ("auto", "float32", "float16", "bfloat16")
MB = 1 << 20


def _hf() -> Any:
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        raise InputError("needs transformers and torch: pip install 'attncli[hf]'", "capture") from None
    return transformers


def capture(model: str | Path, texts: Sequence[str], *, target: str | Sequence[str] | None = None, generate: int = 0,
            dtype: str | None = None, device: str | None = None, device_map: str | None = None,
            keep_layers: Sequence[int] | None = None, max_attention_mb: float = 256, chat: bool = False,
            trust_remote_code: bool = False, padding_side: str | None = None) -> Capture:
    """Tokenize ``texts`` with the model's own tokenizer, run the model once, and return what it did.

    ``target``: the decoder's text (encoder-decoder models; one for all texts or one each); ``generate``: greedy
    decoding of that many tokens first (decoders); ``dtype``/``device``/``device_map``: the forward's;
    ``keep_layers``: the layers whose hidden states and attention are kept (default all); ``max_attention_mb``:
    the budget of the model's own attention weights kept (layers in order until it is spent); ``chat``: the
    tokenizer's chat template; ``padding_side``: left or right (default: the tokenizer's)."""
    texts = list(texts)
    if not texts:
        raise InputError("no text given", "TEXT")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise InputError(f"text {i + 1} is empty", "TEXT")
    transformers = _hf()
    with _quiet(transformers):
        return _capture(transformers, model, texts, target=target, generate=generate, dtype=dtype, device=device,
                        device_map=device_map, keep_layers=keep_layers, max_attention_mb=max_attention_mb, chat=chat,
                        trust_remote_code=trust_remote_code, padding_side=padding_side)


class _quiet:
    """transformers' progress bars and load reports off while a capture runs (restored after)."""

    def __init__(self, transformers: Any) -> None:
        self.logging = transformers.utils.logging

    def __enter__(self) -> None:
        self.level = self.logging.get_verbosity()
        self.bars = self.logging.is_progress_bar_enabled()
        self.logging.set_verbosity_error()
        self.logging.disable_progress_bar()

    def __exit__(self, *exc: object) -> None:
        self.logging.set_verbosity(self.level)
        if self.bars:
            self.logging.enable_progress_bar()


def _capture(transformers: Any, model: str | Path, texts: list[str], *, target: str | Sequence[str] | None,
             generate: int, dtype: str | None, device: str | None, device_map: str | None,
             keep_layers: Sequence[int] | None, max_attention_mb: float, chat: bool, trust_remote_code: bool,
             padding_side: str | None) -> Capture:
    import torch

    name = str(model)
    where = printable(name, 80)
    config = _config(transformers, name, trust_remote_code)
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    targets = _targets(target, len(texts), enc_dec, where)
    if generate and enc_dec:
        raise InputError("--generate decodes with decoder-only models; for an encoder-decoder model give --target",
                         "--generate")
    tok = _tokenizer(transformers, name, trust_remote_code, where)
    if padding_side is not None:
        tok.padding_side = padding_side
    if tok.pad_token is None and len(texts) + (0 if targets is None else 0) > 1:
        if tok.eos_token is None:
            raise InputError("has no padding token (nor an end-of-sequence token to pad with); give one text at a time",
                             where)
        tok.pad_token = tok.eos_token
    torch_dtype = _torch_dtype(dtype, torch)
    kwargs: dict[str, Any] = {"attn_implementation": "eager", "trust_remote_code": trust_remote_code}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    auto = transformers.AutoModelForCausalLM if generate else transformers.AutoModel
    try:
        net = auto.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot be loaded by transformers ({' '.join(str(e).split())[:140]})", where) from None
    try:
        if device is not None and device_map is None:
            net.to(device)
        return capture_loaded(net, tok, texts, name, target=targets, generate=generate, keep_layers=keep_layers,
                              max_attention_mb=max_attention_mb, chat=chat, config=config,
                              flags={"device": device, "device_map": device_map,
                                     "trust_remote_code": trust_remote_code})
    finally:
        del net
        gc.collect()


def capture_loaded(net: Any, tok: Any, texts: Sequence[str], name: str | Path = "model", *,
                   target: str | Sequence[str] | None = None, generate: int = 0,
                   keep_layers: Sequence[int] | None = None, max_attention_mb: float = 256, chat: bool = False,
                   padding_side: str | None = None, config: Any = None, flags: dict[str, Any] | None = None) -> Capture:
    """:func:`capture` with a model and tokenizer already loaded (``net`` with attn_implementation="eager", on its
    device; ``name``: the folder it came from, for the provenance): many captures without loading it again."""
    texts = list(texts)
    import torch

    transformers = _hf()
    name = str(name)
    where = printable(name, 80)
    config = config if config is not None else net.config
    enc_dec = bool(getattr(config, "is_encoder_decoder", False))
    targets = _targets(target, len(texts), enc_dec, where)
    side = tok.padding_side
    if padding_side is not None:
        tok.padding_side = padding_side
    try:
        net.eval()
        run_device = next(net.parameters()).device
        prompts = [_chat(tok, t, where) for t in texts] if chat else texts
        enc = tok(prompts, padding=True, return_tensors="pt", return_special_tokens_mask=True,
                  add_special_tokens=not chat)
        ids, mask = enc["input_ids"], enc["attention_mask"]
        _fits(config, ids.shape[1] + generate, where)
        generated = torch.zeros_like(ids, dtype=torch.bool)
        if generate:
            with torch.no_grad():
                seq = net.generate(input_ids=ids.to(run_device), attention_mask=mask.to(run_device),
                                   max_new_tokens=generate, do_sample=False, pad_token_id=tok.pad_token_id).cpu()
            new = seq.shape[1] - ids.shape[1]
            ids = seq
            mask = torch.cat([mask, torch.ones((mask.shape[0], new), dtype=mask.dtype)], 1)
            generated = torch.cat([generated, torch.ones((generated.shape[0], new), dtype=torch.bool)], 1)
        special = torch.tensor([tok.get_special_tokens_mask(row, already_has_special_tokens=True)
                                for row in ids.tolist()], dtype=torch.bool)
        inputs: dict[str, Any] = {"input_ids": ids.to(run_device), "attention_mask": mask.to(run_device)}
        dec = None
        if targets is not None:
            dec = _decoder_inputs(tok, config, targets)
            inputs["decoder_input_ids"] = dec["input_ids"].to(run_device)
            inputs["decoder_attention_mask"] = dec["attention_mask"].to(run_device)
        layers = _layer_count(config)
        keep = _keep(keep_layers, layers)
        heads = int(getattr(config, "num_attention_heads", 0) or getattr(config, "num_heads", 0) or 0)
        per_layer = ids.shape[0] * max(heads, 1) * ids.shape[1] ** 2 * 4
        if dec is not None:  # the decoder's self- and cross-attention of a layer are kept with it
            t_dec = dec["input_ids"].shape[1]
            per_layer += 2 * ids.shape[0] * max(heads, 1) * t_dec * max(t_dec, ids.shape[1]) * 4
        budget = int(max_attention_mb * MB)
        kept_att = [layer for n, layer in enumerate(keep) if (n + 1) * per_layer <= budget]
        left_out = [layer for layer in keep if layer not in kept_att]
        cross_in: dict[int, Any] = {}  # decoder layer -> its cross-attention's input (the query side)
        hooks = _cross_hooks(net, cross_in) if dec is not None else []
        try:
            with torch.no_grad():
                out = _forward(net, inputs, enc_dec and dec is None, bool(kept_att))
        finally:
            for h in hooks:
                h.remove()
        if enc_dec and dec is None:
            enc_h, enc_a = out.hidden_states, out.attentions
        else:
            enc_h = out.encoder_hidden_states if dec is not None else out.hidden_states
            enc_a = out.encoder_attentions if dec is not None else out.attentions
        torch_dtype_name = str(next(net.parameters()).dtype).removeprefix("torch.")
        states = tuple(keep) if keep_layers is not None else None
        stack = Stack(_states(enc_h, keep), *_words(tok, ids), ids.numpy(), mask.numpy().astype(np.int64),
                      _attentions(enc_a, kept_att), tuple(kept_att) if kept_att else (), states)
        decoder, cross = None, None
        extra: dict[str, Any] = {}
        if dec is not None:
            decoder = Stack(_states(out.decoder_hidden_states, keep), *_words(tok, dec["input_ids"]),
                            dec["input_ids"].numpy(), dec["attention_mask"].numpy().astype(np.int64),
                            _attentions(out.decoder_attentions, kept_att), tuple(kept_att) if kept_att else (), states)
            cross = _attentions(out.cross_attentions, kept_att)
            if cross_in:
                extra["cross_inputs"] = _states([cross_in[i] for i in sorted(cross_in)], keep)[:-1]
        del out
        provenance = _provenance(transformers, name, config, torch_dtype_name, texts, targets, {
            **(flags or {}), "generate": generate, "chat": chat, "device": str(run_device),
            "keep_layers": list(keep) if keep_layers is not None else None, "max_attention_mb": max_attention_mb,
            "padding_side": tok.padding_side}, layers, left_out)
        positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int64), tuple(ids.shape)).copy()
        return Capture(stack, provenance, name, positions, special.numpy(), generated.numpy(), decoder, cross, extra)
    finally:
        tok.padding_side = side


def _forward(net: Any, inputs: dict[str, Any], encoder_only: bool, attentions: bool) -> Any:
    """One forward with every hidden state (and the attention weights); an encoder-decoder without a target: its
    encoder alone."""
    if encoder_only:
        return net.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                 output_hidden_states=True, output_attentions=attentions)
    return net(**inputs, output_hidden_states=True, output_attentions=attentions)


CROSS_MODULES = ("encoder_attn", "EncDecAttention")  # BART's and T5's cross-attention modules (attncli.io.cross)


def _cross_hooks(net: Any, into: dict[int, Any]) -> list[Any]:
    """Forward pre-hooks that keep each decoder layer's cross-attention input (what its query projection reads)."""
    hooks = []
    found = [m for name, m in net.named_modules() if name.rsplit(".", 1)[-1] in CROSS_MODULES]
    for i, module in enumerate(found):
        def keep(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], i: int = i) -> None:
            into[i] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        hooks.append(module.register_forward_pre_hook(keep, with_kwargs=True))
    return hooks


def _config(transformers: Any, name: str, trust: bool) -> Any:
    try:
        return transformers.AutoConfig.from_pretrained(name, trust_remote_code=trust)
    except (OSError, ValueError) as e:
        text = " ".join(str(e).split())
        if "trust_remote_code" in text:
            raise InputError("needs its own code to load; give --trust-remote-code if you trust it",
                             printable(name, 80)) from None
        if not Path(name).exists():
            raise InputError("is neither a model folder nor a model in the local cache (and none could be downloaded)",
                             printable(name, 80)) from None
        raise InputError(f"has no config.json transformers can read ({text[:120]})", printable(name, 80)) from None


def _tokenizer(transformers: Any, name: str, trust: bool, where: str) -> Any:
    try:
        tok = transformers.AutoTokenizer.from_pretrained(name, trust_remote_code=trust)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise InputError(f"has no tokenizer transformers can load ({' '.join(str(e).split())[:120]})", where) from None
    if tok is None or isinstance(tok, bool):
        raise InputError("has no tokenizer (tokenizer.json or the files of a slow tokenizer)", where)
    return tok


def _targets(target: str | Sequence[str] | None, n: int, enc_dec: bool, where: str) -> list[str] | None:
    if target is None:
        return None
    if not enc_dec:
        raise InputError("is not an encoder-decoder model; --target is the decoder's text of one", where)
    targets = [target] * n if isinstance(target, str) else list(target)
    if len(targets) != n:
        raise InputError(f"gives {len(targets)} targets for {n} texts (give one, or one per text)", "--target")
    if any(not t.strip() for t in targets):
        raise InputError("is empty", "--target")
    return targets


def _chat(tok: Any, text: str, where: str) -> str:
    if not getattr(tok, "chat_template", None):
        raise InputError("has no chat template (tokenizer_config.json chat_template); leave out --chat", where)
    return str(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True))


def _torch_dtype(dtype: str | None, torch: Any) -> Any:
    if dtype is None or dtype == "auto":
        return None if dtype is None else "auto"
    if dtype not in DTYPES:
        raise InputError(f"must be one of {', '.join(DTYPES)}, got {printable(dtype, 20)!r}", "--dtype")
    return getattr(torch, dtype)


def _fits(config: Any, length: int, where: str) -> None:
    most = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(most, int) and length > most:
        raise InputError(f"takes at most {most} positions (max_position_embeddings); the text is {length} tokens",
                         where)


def _layer_count(config: Any) -> int:
    for key in ("num_hidden_layers", "num_layers", "n_layer", "encoder_layers"):
        v = getattr(config, key, None)
        if isinstance(v, int):
            return v
    raise InputError("config.json says no number of layers", "config.json")


def _keep(keep: Sequence[int] | None, layers: int) -> list[int]:
    if keep is None:
        return list(range(layers))
    out = sorted(set(int(i) for i in keep))
    bad = [i for i in out if not 0 <= i < layers]
    if bad:
        raise InputError(f"names layer {bad[0]}, but the model has layers 0 to {layers - 1}", "--keep-layers")
    return out


def _states(hidden: Sequence[Any], keep: list[int]) -> np.ndarray:
    """(kept + 1, batch, T, E) float32: the states entering the kept layers, then the last hidden state (the
    float32 of a bfloat16 or float16 state is exact)."""
    chosen = [hidden[i] for i in keep] + [hidden[-1]]
    first = chosen[0]
    out = np.empty((len(chosen), *first.shape), dtype=np.float32)
    for i, h in enumerate(chosen):
        out[i] = h.detach().float().cpu().numpy()
    return out


def _attentions(att: Sequence[Any] | None, kept: list[int]) -> Layers | None:
    """The kept layers' weights as float32 numpy, each without a copy where the model computed float32 on the CPU
    (a view of its tensor; bfloat16 and float16 widen exactly)."""
    if not kept or att is None:
        return None
    return Layers([att[layer].detach().float().cpu().numpy() for layer in kept])


def _decoder_inputs(tok: Any, config: Any, targets: list[str]) -> dict[str, Any]:
    """The decoder's inputs: the model's decoder start token, then the target's tokens (as generation starts)."""
    import torch

    enc = tok(text_target=targets, padding=True, return_tensors="pt")
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = tok.pad_token_id
    ids = enc["input_ids"]
    first = torch.full((ids.shape[0], 1), int(start), dtype=ids.dtype)
    mask = enc["attention_mask"]
    if tok.padding_side == "left":  # the start token comes right before each target's first token
        ids = torch.cat([ids, first], 1)
        mask = torch.cat([mask, torch.ones_like(first)], 1)
        for b in range(ids.shape[0]):
            n = int(mask[b].sum()) - 1
            row = ids[b, -1 - n:-1].clone()
            ids[b, -1 - n] = int(start)
            ids[b, -n:] = row
    else:
        ids = torch.cat([first, ids], 1)
        mask = torch.cat([torch.ones_like(first), mask], 1)
    return {"input_ids": ids, "attention_mask": mask}


def _words(tok: Any, ids: Any) -> tuple[list[list[str]], list[list[str]]]:
    """(tokens as the tokenizer spells them, labels: each decoded on its own, with its spaces)."""
    special = set(getattr(tok, "all_special_tokens", []) or [])
    tokens = [[str(t) for t in tok.convert_ids_to_tokens(row)] for row in ids.tolist()]
    known = {t: _label(tok, t, special) for t in {t for row in tokens for t in row}}  # each distinct token once
    labels = [[known[t] for t in row] for row in tokens]
    return tokens, labels


def _label(tok: Any, token: str, special: set[str]) -> str:
    if token in special:
        return readable(token)
    try:
        text = str(tok.convert_tokens_to_string([token]))
    except Exception:  # a tokenizer whose decoder cannot take one token alone: its own spelling
        return readable(token)
    if token.startswith("▁") and not text.startswith(" "):  # sentencepiece's decoder drops the first space
        text = " " + text.lstrip(" ") if text.strip() else " "
    if "\ufffd" in text:  # a byte of a multi-byte character (byte-level BPE): its bytes, escaped
        raw = _bytes_of(token)
        if raw is not None:
            return "".join(f"\\x{b:02x}" if b >= 0x80 or b < 0x20 else chr(b) for b in raw)
    return readable(text)


def _bytes_of(token: str) -> bytes | None:
    """A byte-level BPE token's bytes (GPT-2's byte-to-unicode table), or None when it is not spelled so."""
    table = {chr(c): b for b, c in _byte_table().items()}
    if all(ch in table for ch in token):
        return bytes(table[ch] for ch in token)
    return None


def _byte_table() -> dict[int, int]:
    """GPT-2's bytes_to_unicode: printable bytes as themselves, the others from U+0100 on."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = b
        else:
            table[b] = 256 + n
            n += 1
    return table


def _provenance(transformers: Any, name: str, config: Any, dtype: str, texts: list[str], targets: list[str] | None,
                flags: dict[str, Any], layers: int, left_out: list[int]) -> dict[str, Any]:
    folder = Path(name) if Path(name).is_dir() else None
    cfg_path: str | None = None
    try:
        from transformers.utils import cached_file

        cfg_path = cached_file(name, "config.json")
    except Exception:  # a config built in memory: nothing to hash
        cfg_path = None
    sha, cfg = config_digest(cfg_path) if cfg_path else (None, {})
    if folder is None and cfg_path:
        folder = Path(cfg_path).parent
    try:
        weights = headers_digest(folder) if folder is not None else None
    except InputError:
        weights = None
    return {"model": os.fspath(folder) if folder is not None else name, "name": name,
            "model_type": getattr(config, "model_type", None), "config_sha256": sha, "config": cfg,
            "weights_sha256": weights, "dtype": dtype, "transformers": transformers.__version__,
            "texts": texts, "targets": targets, "flags": flags, "layers": layers,
            "hidden_states_layers": flags["keep_layers"] if flags["keep_layers"] is not None else list(range(layers)),
            "last_hidden_state": "transformers' last hidden state (after the final norm where the model applies one)",
            "attentions_left_out": left_out,
            "attention_implementation": "eager"}

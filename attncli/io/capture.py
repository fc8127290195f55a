"""A capture: what a model did on some text, as one ``.npz`` (io layer; no transformers here).

    cap = read_capture("run.npz")           # validated; allow_pickle=False, object arrays refused unread
    cap.hidden_states[3]                    # (batch, T, E): the residual stream entering layer 3
    cap.labels[0]                           # entry 0's tokens as text (" cat" keeps its space)
    cap.model_attention(3)                  # (batch, heads, T, T): the model's own weights, or None

``attncli capture`` (attncli.io.hf) writes it; every command that takes X or HIDDEN with ``--weights MODEL``
reads it. Members (``format`` = ``attncli-capture/1`` tells a capture from any other ``.npz``):

    hidden_states       (layers + 1, batch, T, E)  element N < layers enters layer N; the last is transformers'
                                                   last hidden state (after the final norm in most decoders)
    tokens, labels      (batch, T) str             the tokenizer's own spelling / each token decoded alone
    input_ids, attention_mask, position_ids, special_tokens_mask, generated      (batch, T)
    attentions          (kept, batch, heads, T, T) the model's own (eager) weights of ``attention_layers``
    provenance          JSON text: model, model_type, config (and its SHA-256), the weights' headers' SHA-256,
                        dtype, transformers version, texts, flags, what the attention budget left out

With a target (encoder-decoder models) the members above are the encoder's, and ``decoder_*`` (hidden_states,
tokens, labels, input_ids, attention_mask, attentions, attention_layers) and ``cross_attentions`` the decoder's.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attncli.errors import InputError, printable

FORMAT = "attncli-capture/1"
STATE_MEMBERS = ("hidden_states", "tokens", "labels", "input_ids", "attention_mask")
DECODER = ("decoder_hidden_states", "decoder_tokens", "decoder_labels", "decoder_input_ids", "decoder_attention_mask")


class Layers(Sequence[np.ndarray]):
    """Per-layer arrays seen as one (layers, ...) array without copying them: a capture made in memory keeps the
    model's own tensors' memory (numpy views); ``np.asarray`` stacks them (when a file is written)."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self._arrays = tuple(arrays)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self._arrays), *self._arrays[0].shape)

    @property
    def dtype(self) -> np.dtype:
        return self._arrays[0].dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __getitem__(self, i: Any) -> Any:
        return self._arrays[i] if isinstance(i, int) else np.asarray(self)[i]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = np.stack(self._arrays)
        return a if dtype is None else a.astype(dtype)


@dataclass(frozen=True)
class Stack:
    """One stack of a model as captured (the model itself, or an encoder-decoder's encoder or decoder)."""

    hidden_states: np.ndarray  # (layers + 1, batch, T, E)
    tokens: list[list[str]]  # per entry, the tokenizer's spelling
    labels: list[list[str]]  # per entry, each token decoded on its own
    input_ids: np.ndarray  # (batch, T)
    attention_mask: np.ndarray  # (batch, T) 1 = a token, 0 = padding
    attentions: np.ndarray | Layers | None = None  # (kept, batch, heads, T, T)
    attention_layers: tuple[int, ...] = ()
    state_layers: tuple[int, ...] | None = None  # --keep-layers: the layers hidden_states[:-1] enter (None: all)

    @property
    def layers(self) -> int:
        """The model's layers (also those --keep-layers left out)."""
        return int(self.hidden_states.shape[0]) - 1 if self.state_layers is None else max(self.state_layers) + 1

    def state(self, layer: int, source: str = "capture") -> np.ndarray:
        """(batch, T, E): the residual stream entering ``layer``."""
        kept = list(range(self.hidden_states.shape[0] - 1)) if self.state_layers is None else list(self.state_layers)
        if layer not in kept:
            raise InputError(f"holds the states entering layers {_ranges(kept)}, not layer {layer}", source)
        return np.asarray(self.hidden_states[kept.index(layer)])

    @property
    def batch(self) -> int:
        return int(self.hidden_states.shape[1])

    @property
    def padding(self) -> np.ndarray:
        """(batch, T) True = a padded position (PyTorch's key_padding_mask convention)."""
        return np.asarray(self.attention_mask) == 0

    @property
    def padded(self) -> bool:
        return bool(self.padding.any())

    def model_attention(self, layer: int) -> np.ndarray | None:
        """The model's own attention weights of ``layer`` (batch, heads, T, T), or None when not kept."""
        if self.attentions is None or layer not in self.attention_layers:
            return None
        return np.asarray(self.attentions[self.attention_layers.index(layer)])


@dataclass(frozen=True)
class Capture:
    """A capture file's contents, validated (see the module docstring)."""

    stack: Stack  # the model (an encoder-decoder's encoder)
    provenance: dict[str, Any]
    source: str = "capture"
    position_ids: np.ndarray | None = None
    special_tokens_mask: np.ndarray | None = None
    generated: np.ndarray | None = None
    decoder: Stack | None = None  # with --target: the decoder
    cross_attentions: np.ndarray | Layers | None = None  # (kept, batch, heads, T_dec, T_enc), the decoder's attention_layers
    extra: dict[str, Any] = field(default_factory=dict)

    # the model's stack, under the names of the file
    @property
    def hidden_states(self) -> np.ndarray:
        return self.stack.hidden_states

    @property
    def tokens(self) -> list[list[str]]:
        return self.stack.tokens

    @property
    def labels(self) -> list[list[str]]:
        return self.stack.labels

    @property
    def input_ids(self) -> np.ndarray:
        return self.stack.input_ids

    @property
    def attention_mask(self) -> np.ndarray:
        return self.stack.attention_mask

    @property
    def attentions(self) -> np.ndarray | Layers | None:
        return self.stack.attentions

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return self.stack.attention_layers

    @property
    def dtype(self) -> str:
        """The dtype the model ran in (the file's arrays are float32 where that is exact)."""
        return str(self.provenance.get("dtype", str(self.hidden_states.dtype)))

    @property
    def family(self) -> str:
        return str(self.provenance.get("model_type") or "unknown")

    def arrays(self) -> dict[str, Any]:
        """The file's members, by name (what :func:`write_capture` saves)."""
        s = self.stack
        out: dict[str, Any] = {
            "format": np.array(FORMAT), "hidden_states": s.hidden_states, "tokens": _strings(s.tokens),
            "labels": _strings(s.labels), "input_ids": s.input_ids, "attention_mask": s.attention_mask,
            "provenance": np.array(json.dumps(self.provenance, sort_keys=True))}
        for name, a in (("position_ids", self.position_ids), ("special_tokens_mask", self.special_tokens_mask),
                        ("generated", self.generated)):
            if a is not None:
                out[name] = a
        if s.state_layers is not None:
            out["hidden_state_layers"] = np.asarray(s.state_layers, dtype=np.int64)
        if s.attentions is not None:
            out["attentions"], out["attention_layers"] = s.attentions, np.asarray(s.attention_layers, dtype=np.int64)
        d = self.decoder
        if d is not None:
            out.update({"decoder_hidden_states": d.hidden_states, "decoder_tokens": _strings(d.tokens),
                        "decoder_labels": _strings(d.labels), "decoder_input_ids": d.input_ids,
                        "decoder_attention_mask": d.attention_mask})
            if d.state_layers is not None:
                out["decoder_hidden_state_layers"] = np.asarray(d.state_layers, dtype=np.int64)
            if d.attentions is not None:
                out["decoder_attentions"] = d.attentions
                out["decoder_attention_layers"] = np.asarray(d.attention_layers, dtype=np.int64)
            if self.cross_attentions is not None:
                out["cross_attentions"] = self.cross_attentions
            if self.cross_inputs is not None:
                out["cross_inputs"] = self.cross_inputs
        return out

    @property
    def cross_inputs(self) -> np.ndarray | None:
        """(decoder layers kept, batch, T_dec, E): each decoder layer's cross-attention input (what its query
        projection reads: after the self-attention block and its norm)."""
        return self.extra.get("cross_inputs")


def _ranges(layers: list[int]) -> str:
    return f"0 to {layers[-1]}" if layers == list(range(len(layers))) else ", ".join(map(str, layers))


def _strings(rows: list[list[str]]) -> np.ndarray:
    """Tokens as a fixed-width unicode array (batch, T): numpy's own dtype, read back without pickle."""
    return np.array(rows, dtype=str) if rows and rows[0] else np.zeros((len(rows), 0), dtype="<U1")


def write_capture(capture: Capture, path: str | Path, protect: tuple[str, ...] = ()) -> None:
    """Write ``capture`` to ``path`` (.npz, uncompressed) atomically: a failure leaves no partial file."""
    import zipfile

    from attncli.io.files import atomic_write

    with atomic_write(path, protect=protect) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, a in capture.arrays().items():  # as np.savez writes them, each layer of a Layers in turn (no copy)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(a, Layers):
                    header = {"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False, "shape": a.shape}
                    np.lib.format.write_array_header_2_0(member, header)
                    for part in a:
                        member.write(np.ascontiguousarray(part, dtype=a.dtype).data.cast("B"))
                else:
                    np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)


def is_capture(content: Any) -> bool:
    """Whether ``content`` (a file read by attncli.io.files.Reader) is a capture: an .npz whose ``format`` says so."""
    if not isinstance(content, dict) or "format" not in content:
        return False
    f = content["format"]
    return isinstance(f, np.ndarray) and f.dtype.kind == "U" and f.ndim == 0 and str(f).startswith("attncli-capture/")


def read_capture(path: str | Path) -> Capture:
    """A capture file, read with allow_pickle=False (object arrays are refused without being unpickled) and
    validated member by member; each problem is one line naming the file and member."""
    from attncli.io.files import Reader

    spec = str(path)
    return capture_from(Reader().read(spec), spec)


def capture_from(content: Any, source: str) -> Capture:
    """A validated :class:`Capture` from an .npz's members (as attncli.io.files reads them)."""
    if not isinstance(content, dict):
        raise InputError("is not a capture (an .npz written by `attncli capture`)", source)
    fmt = content.get("format")
    if fmt is None:
        raise InputError("has no member 'format'; a capture is an .npz written by `attncli capture`", source)
    if not (isinstance(fmt, np.ndarray) and fmt.dtype.kind == "U" and fmt.ndim == 0):
        raise InputError("member 'format' is not text", source)
    if str(fmt) != FORMAT:
        raise InputError(f"is a capture of format {printable(str(fmt), 40)!r}; this attncli reads {FORMAT!r}", source)
    for name in STATE_MEMBERS + ("provenance",):
        if name not in content:
            raise InputError(f"has no member {name!r}", source)
    try:
        provenance = json.loads(str(content["provenance"]))
    except ValueError as e:
        raise InputError(f"member 'provenance' is not JSON ({str(e)[:80]})", source) from None
    if not isinstance(provenance, dict):
        raise InputError("member 'provenance' is not a JSON object", source)
    stack = _stack(content, "", source)
    layers_given = content.get("attention_layers")
    b, t = stack.input_ids.shape

    def per_position(name: str, kind: str) -> np.ndarray | None:
        a = content.get(name)
        if a is None:
            return None
        a = np.asarray(a)
        if a.shape != (b, t) or a.dtype.kind not in kind:
            raise InputError(f"member {name!r} has shape {a.shape} and dtype {a.dtype}; expected ({b}, {t}) "
                             f"{'integers' if 'i' in kind else 'booleans'}", source)
        return a

    decoder = _stack(content, "decoder_", source) if "decoder_hidden_states" in content else None
    cross = content.get("cross_attentions")
    if cross is not None:
        if decoder is None:
            raise InputError("member 'cross_attentions' comes without the decoder's members", source)
        cross = _floats(cross, "cross_attentions", source, 5)
        want = (len(decoder.attention_layers), decoder.batch, decoder.input_ids.shape[1], t)
        if (cross.shape[0], cross.shape[1], cross.shape[3], cross.shape[4]) != want:
            raise InputError(f"member 'cross_attentions' has shape {cross.shape}; expected (kept layers, batch, heads, "
                             f"decoder T, encoder T) = ({want[0]}, {want[1]}, heads, {want[2]}, {want[3]})", source)
    del layers_given
    extra: dict[str, Any] = {}
    cross_in = content.get("cross_inputs")
    if cross_in is not None:
        if decoder is None:
            raise InputError("member 'cross_inputs' comes without the decoder's members", source)
        cross_in = _floats(cross_in, "cross_inputs", source, 4)
        if cross_in.shape[:3] != (decoder.hidden_states.shape[0] - 1, decoder.batch, decoder.input_ids.shape[1]):
            raise InputError(f"member 'cross_inputs' has shape {cross_in.shape}; expected (decoder layers, batch, "
                             f"decoder T, E) as 'decoder_hidden_states' without its last", source)
        extra["cross_inputs"] = cross_in
    return Capture(stack, provenance, source, per_position("position_ids", "iu"),
                   per_position("special_tokens_mask", "biu"), per_position("generated", "b"), decoder, cross, extra)


def _floats(a: Any, name: str, source: str, ndim: int) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise InputError(f"member {name!r} holds {a.dtype} values; expected floats", source)
    if a.ndim != ndim:
        raise InputError(f"member {name!r} has {a.ndim} axes (shape {a.shape}); expected {ndim}", source)
    return a


def _stack(content: dict[str, Any], pre: str, source: str) -> Stack:
    h = _floats(content[f"{pre}hidden_states"], f"{pre}hidden_states", source, 4)
    if h.shape[0] < 2:
        raise InputError(f"member '{pre}hidden_states' holds {h.shape[0]} state; expected layers + 1 (at least 2)",
                         source)
    _, b, t, _ = h.shape
    ids, mask = np.asarray(content[f"{pre}input_ids"]), np.asarray(content[f"{pre}attention_mask"])
    for name, a in ((f"{pre}input_ids", ids), (f"{pre}attention_mask", mask)):
        if a.shape != (b, t) or a.dtype.kind not in "iub":
            raise InputError(f"member {name!r} has shape {a.shape} and dtype {a.dtype}; expected ({b}, {t}) integers "
                             f"(as {pre}hidden_states)", source)
    if not np.isin(mask, (0, 1)).all():
        raise InputError(f"member '{pre}attention_mask' holds values other than 0 and 1", source)
    if not mask.any(axis=1).all():
        raise InputError(f"member '{pre}attention_mask' has an entry with no token", source)
    rows: dict[str, list[list[str]]] = {}
    for name in ("tokens", "labels"):
        a = np.asarray(content[f"{pre}{name}"])
        if a.dtype.kind != "U" or a.shape != (b, t):
            raise InputError(f"member '{pre}{name}' has shape {a.shape} and dtype {a.dtype}; expected ({b}, {t}) text",
                             source)
        rows[name] = [[str(x) for x in row] for row in a.tolist()]
    att, kept = content.get(f"{pre}attentions"), content.get(f"{pre}attention_layers")
    layers: tuple[int, ...] = ()
    if (att is None) != (kept is None):
        raise InputError(f"members '{pre}attentions' and '{pre}attention_layers' come together", source)
    if att is not None:
        att = _floats(att, f"{pre}attentions", source, 5)
        k = np.asarray(kept)
        if k.ndim != 1 or k.dtype.kind not in "iu" or len(k) != att.shape[0]:
            raise InputError(f"member '{pre}attention_layers' must list the {att.shape[0]} layers of "
                             f"'{pre}attentions' as integers", source)
        layers = tuple(int(i) for i in k)
        if len(set(layers)) != len(layers) or any(i < 0 for i in layers):
            raise InputError(f"member '{pre}attention_layers' lists {list(layers)}, not distinct layers", source)
        if att.shape[1] != b or att.shape[3:] != (t, t):
            raise InputError(f"member '{pre}attentions' has shape {att.shape}; expected (kept layers, {b}, heads, {t}, "
                             f"{t})", source)
    states = content.get(f"{pre}hidden_state_layers")
    state_layers = None
    if states is not None:
        sl = np.asarray(states)
        if sl.ndim != 1 or sl.dtype.kind not in "iu" or len(sl) != h.shape[0] - 1 or (sl < 0).any() \
                or len(set(sl.tolist())) != len(sl):
            raise InputError(f"member '{pre}hidden_state_layers' must list the {h.shape[0] - 1} distinct layers "
                             f"'{pre}hidden_states' holds (and the last state)", source)
        state_layers = tuple(int(i) for i in sl)
    return Stack(h, rows["tokens"], rows["labels"], ids, mask, att, layers, state_layers)


# ---- provenance: what identifies the model a capture came from ------------------------------------

def config_digest(config_path: str | Path) -> tuple[str, dict[str, Any]]:
    """(the SHA-256 of config.json's bytes, its contents)."""
    raw = Path(config_path).read_bytes()
    try:
        content = json.loads(raw)
    except ValueError:
        content = {}
    return hashlib.sha256(raw).hexdigest(), content if isinstance(content, dict) else {}


def headers_digest(model: str | Path) -> str:
    """The SHA-256 of a checkpoint's headers: every tensor's name, shape and dtype (sorted by name), not its data."""
    from attncli.io.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model)
    rows = sorted([name, list(info.shape), info.dtype] for name, info in ckpt.tensors.items())
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def provenance_mismatch(capture: Capture, model: str | Path) -> str | None:
    """What changed in ``model`` since ``capture`` was taken from it: config.json's keys that differ (named), or
    its weights' headers; None when both still match (or the capture does not say)."""
    prov = capture.provenance
    folder = Path(model) if Path(model).is_dir() else Path(model).parent
    said = []
    cfg = folder / "config.json"
    if prov.get("config_sha256") and cfg.is_file():
        digest, now = config_digest(cfg)
        if digest != prov["config_sha256"]:
            said_before = prov.get("config")
            before = _flat(said_before if isinstance(said_before, dict) else {})
            now = _flat(now)
            keys = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            if keys:
                shown = "; ".join(f"{k}: {_short(before.get(k))} -> {_short(now.get(k))}" for k in keys[:3])
                said.append(f"{cfg.name} changed since the capture ({shown}{'; ...' if len(keys) > 3 else ''})")
            else:
                said.append(f"{cfg.name} changed since the capture (its bytes; no key's value)")
    if prov.get("weights_sha256"):
        try:
            if headers_digest(model) != prov["weights_sha256"]:
                said.append("its weights' headers (tensor names, shapes, dtypes) changed since the capture")
        except InputError:
            pass
    return "; ".join(said) or None


def _flat(d: dict[str, Any], pre: str = "") -> dict[str, Any]:
    """A config's keys with nested mappings spelled out: rope_parameters.rope_theta."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{pre}{k}."))
        else:
            out[f"{pre}{k}"] = v
    return out


def _short(v: Any) -> str:
    return "(absent)" if v is None else printable(json.dumps(v), 40)


# ---- labels ----------------------------------------------------------------------------------

def readable(text: str) -> str:
    """A token's text as a label: control and format characters (a newline, a zero-width joiner) escaped, spaces
    kept as they are."""
    return "".join(c if c == " " or not unicodedata.category(c).startswith("C")
                   else c.encode("unicode_escape").decode("ascii") for c in text)


def visible(label: str) -> str:
    """A label with its leading and trailing spaces made visible (␣), for renderers that would drop them."""
    core = label.strip(" ")
    if core == label:
        return label
    lead = len(label) - len(label.lstrip(" "))
    trail = len(label) - len(label.rstrip(" "))
    return "␣" * lead + core + "␣" * trail if core else "␣" * len(label)

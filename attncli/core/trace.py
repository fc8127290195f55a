"""The Trace: the contract between computing attention and showing it.

An ordered list of named steps, each with its array, its typed parameters (which write its formula:
attncli.core.formula), the names of its two last axes (so a renderer can label rows and columns) and notes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from attncli.core.params import Meta
else:
    from attncli.lazy import numpy as np  # imported on first use: `attncli --help` needs none

from attncli.core.backend import to_numpy
from attncli.core.formula import Formula, Name, text

# Names of the axes a step's last two dimensions run over; renderers map them to labels.
QUERIES, KEYS, FEATURES = "queries", "keys", "features"


class StepName(str, Enum):
    """The name of a step: a str, so JSON keys, NPZ names and ``trace["scores"]`` are the plain strings."""

    X = "x"
    X_NORM = "x_norm"
    MEMORY = "memory"
    VALUES = "values"
    W_Q, B_Q, W_K, B_K, W_V, B_V, W_O, B_O = "W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o"
    Q, K, V = "q", "k", "v"
    Q_CLIP, K_CLIP, V_CLIP = "q_clip", "k_clip", "v_clip"  # OLMo's clamp of the projections
    Q_NORM, K_NORM = "q_norm", "k_norm"
    Q_ROT, K_ROT = "q_rot", "k_rot"
    Q_TEMP = "q_temp"  # Llama 4's temperature tuning of the queries
    Q_PROJ, K_PROJ, FEATURES = "q_proj", "k_proj", "features"  # additive's steps inside the score
    SQ_DIST = "sq_dist"  # gaussian's squared distances
    Q_NORMALISED, K_NORMALISED = "q_normalised", "k_normalised"  # cosine's unit vectors
    KEY_SCORES = "key_scores"  # location's one score per key
    # DeepSeek's multi-head latent attention: the latents, their norms, their weights, each head's keys without RoPE
    Q_LATENT, Q_LATENT_NORM, KV_LATENT, KV_LATENT_NORM, K_NOPE = ("q_latent", "q_latent_norm", "kv_latent",
                                                                  "kv_latent_norm", "k_nope")
    W_QA, B_QA, W_KVA, B_KVA = "W_qa", "b_qa", "W_kva", "b_kva"
    SCORES = "scores"
    SCALED = "scaled"
    CAPPED = "capped"
    ALIBI = "alibi"  # the bias step when ALiBi is the only bias (its name since before there was a bias step)
    BIAS = "bias"  # ALiBi and T5's relative position bias, added
    MASKED = "masked"
    SINK = "sink"
    SOFTMAX = "softmax"
    WEIGHTS = "weights"
    HARD = "hard"
    DROPOUT = "dropout"
    HEAD_OUTPUT = "head_output"
    OUTPUT = "output"
    CONCAT = "concat"
    SUB_NORM = "sub_norm"  # BitNet's RMSNorm of the concatenated heads, before W_o
    W_G = "W_g"  # an output gate's weight (AFMoE gate_proj, Laguna g_proj)
    GATE = "gate"  # act(x · W_g): the gate values
    GATED = "gated"  # concat ⊙ gate, before W_o
    AVG_WEIGHTS = "avg_weights"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


def _meta() -> Meta:
    from attncli.core.params import Meta  # here: `attncli --help` builds its options without defining every dataclass

    return Meta()


@dataclass
class Step:
    """One named step of the computation: ``values`` has shape ``(..., rows, cols)``.

    ``params`` are its numbers, typed (attncli.core.params, attncli.core.chain: Scale, Cap, Bias, Mask, ...); they
    write its formula (:meth:`terms`, one head's for a step of each head, its output written ``head_h``).
    ``per_head`` marks a step computed for each head (its values carry the head axis, ``meta.head_axis``) and
    ``head`` a view of one head of it (:func:`attncli.core.engine.select_head`). ``formula``, the text every output
    shows, is written from these: the marker is data, never text added to the formula and stripped again."""

    name: str
    values: Any
    axes: tuple[str, str] = (QUERIES, KEYS)
    notes: list[str] = field(default_factory=list)
    rows: list[int] | None = None  # computed for these queries only (the corners of a big view); None: all
    params: Any = None  # the step's numbers, typed; None: none (its formula is then its name)
    per_head: bool = False  # computed for each head of a layer
    head: int | None = None  # this is head ``head`` of a per-head step (a view of one head)

    def terms(self) -> Formula:
        """The formula as its parameters write it (attncli.core.formula): every output's, in its own way."""
        write = getattr(self.params, "formula", None)
        return write() if write is not None else Formula((Name(str(self.name)),))

    @property
    def text(self) -> str:
        """The formula as computed, in plain text (one head's for a step of each head: ``head_h = weights · V``)."""
        return text(self.terms(), self.head)

    @property
    def formula(self) -> str:
        """The display formula: ``text``, with "(each head h)" for a step of each head, or "head 2: ..." (head_2)
        for a view of one head."""
        if self.head is not None:
            return f"head {self.head}: " + self.text
        return self.text + "  (each head h)" if self.per_head else self.text

    def numpy(self) -> np.ndarray:
        return to_numpy(self.values)


@dataclass
class Trace:
    """What ``attend`` returns: the steps in order, labels, warnings and run facts."""

    steps: list[Step] = field(default_factory=list)
    query_labels: list[str] | None = None
    key_labels: list[str] | None = None
    warnings: list[str] = field(default_factory=list)
    meta: Meta = field(default_factory=lambda: _meta())  # score, backend, device, dtype, shapes, ...
    inputs: dict[str, Any] = field(default_factory=dict)  # q, k, v as computed on (backend arrays)
    extra: dict[str, Any] = field(default_factory=dict)  # more JSON fields (e.g. diagnostics)
    dead: Any = None  # (..., m) bool: the rows with every key masked (None: none, or not computed)
    seq_first: bool = False  # the output as nn.MultiheadAttention(batch_first=False) returns it: (T, B, E)

    def add(self, name: str, values: Any, axes: tuple[str, str] = (QUERIES, KEYS), notes: list[str] | None = None,
            params: Any = None) -> Any:
        """Append the step ``name``: its values, axes, notes, and its typed parameters (which write its formula)."""
        self.steps.append(Step(name, values, axes, list(notes or []), params=params))
        return values

    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def step(self, name: str) -> Step:
        """The step called ``name``; ``weights`` is always the weights that multiplied V (the step
        ``softmax`` is followed by ``hard`` or ``dropout`` when those were asked for)."""
        for s in self.steps:
            if s.name == name:
                return s
        if name == "weights" and self.meta.weights_step not in (None, "weights"):
            return self.step(self.meta.weights_step)
        raise KeyError(f"no step named {name!r}; steps are {', '.join(self.names())}")

    def __getitem__(self, name: str) -> np.ndarray:
        """The step's array; ``output`` laid out as the inputs were given ((T, B, E) when ``seq_first``; the
        step itself, shown with its queries as rows, stays (B, T, E))."""
        a = self.step(name).numpy()
        return np.swapaxes(a, 0, 1) if name == "output" and self.seq_first else a

    def __contains__(self, name: object) -> bool:
        if name == "weights" and self.meta.weights_step not in (None, "weights"):
            name = self.meta.weights_step
        return any(s.name == name for s in self.steps)

    @property
    def weights(self) -> np.ndarray:
        return self["weights"]

    @property
    def output(self) -> np.ndarray:
        return self["output"]

    def inputs_numpy(self) -> dict[str, np.ndarray]:
        return {k: to_numpy(v) for k, v in self.inputs.items()}

    def arrays(self) -> dict[str, np.ndarray]:
        """Every step as a numpy array, by name (what ``--save x.npz`` writes), and ``weights``: the
        weights that multiplied V, also when that step is ``hard`` or ``dropout``."""
        out = {s.name: self[s.name] if s.name == "output" else s.numpy() for s in self.steps}
        if "weights" not in out and "weights" in self:
            out["weights"] = self.weights
        return out

    def _repr_html_(self) -> str | None:
        """Jupyter's rich display: the page's view of this trace, by the renderer that attncli/__init__.py
        registers in ``HTML_VIEW`` (core imports no renderer); None (plain repr) when none is set."""
        return HTML_VIEW(self) if HTML_VIEW is not None else None


HTML_VIEW: Callable[[Trace], str] | None = None  # set by attncli/__init__.py: attncli.render.notebook.cell_html

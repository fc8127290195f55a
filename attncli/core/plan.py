"""Which path computes a problem: the explicit one, blocks of queries, or PyTorch's fused kernel.

    plan(problem, Needs(weights=False))            # output only: blocked (numpy) or SDPA (torch)
    plan(problem, Needs(view_rows=first_and_last))  # a view: every weight, or for a big problem the
                                                    # output plus the weights of the rows it shows

The CLI says what it needs; the library decides how, and the engine follows the plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from attncli.core import blocked
from attncli.core.backend import get_backend
from attncli.core.layer import Layer
from attncli.core.problem import Problem

Path = Literal["explicit", "blocked", "sdpa"]
VIEW_CELLS = 1 << 26  # weights (batch × m × n) beyond which a view computes only the rows it shows


@dataclass(frozen=True)
class Needs:
    """What the caller will use of the run."""

    weights: bool = True  # the steps up to the weights, for every query
    view_rows: Callable[[int], list[int]] | None = None  # a view that shows these of m rows: their weights suffice
    limit: int | None = None  # ...when the whole weight matrix would be larger than this (default VIEW_CELLS)


@dataclass(frozen=True)
class Plan:
    """How the engine computes: ``path``, and with an output-only path the queries ``rows`` whose
    steps up to the weights are computed as well (each row against every key: exact numbers); with the
    explicit path, ``rows`` are the only queries computed (every step has those rows alone)."""

    path: Path = "explicit"
    rows: tuple[int, ...] | None = None
    skipped: int = 0  # weights the view wanted but that are not computed (a note says so); 0: none

    @property
    def weights(self) -> bool:
        return self.path == "explicit" or self.rows is not None


def plan(problem: Problem | Layer, needs: Needs | None = None) -> Plan:
    """The path for ``problem`` given ``needs`` (default: the weights unless the problem's options say
    ``keep_weights=False``); for a Layer, the path of the problem of its heads."""
    if isinstance(problem, Layer):
        problem = problem.problem()
    needs = needs or Needs(weights=problem.options.keep_weights)
    limit = VIEW_CELLS if needs.limit is None else needs.limit
    cells = math.prod(problem.batch_shape) * problem.m * problem.n
    big = needs.weights and needs.view_rows is not None and cells > limit
    if (needs.weights and not big) or not blocked.supported(problem):
        return Plan("explicit")  # hard attention, dropout, ...: the explicit path computes them
    o = problem.options
    path: Path = "sdpa" if get_backend(o.backend, o.device).name == "torch" and blocked.sdpa_applies(problem) else "blocked"
    if not big:
        return Plan(path)
    assert needs.view_rows is not None
    rows = tuple(needs.view_rows(problem.m))
    if blocked.constant_scale(problem) and len(rows) * problem.n * math.prod(problem.batch_shape) <= limit:
        return Plan(path, rows)
    return Plan(path, skipped=cells)

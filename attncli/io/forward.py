"""The residual stream of a model on token ids, by transformers (an optional extra): what ``heads --induction``
feeds its layers. (The capture of issue 31, once merged, is the one way in; this is its smallest form.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from attncli.errors import InputError


def hidden_states(model: str, ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    """hidden_states (L + 1, B, T, E) of ``model`` (a folder transformers reads) on ``ids`` (B, T), float32."""
    try:
        import torch
        import transformers
    except ImportError:
        raise InputError("needs transformers and torch to run the model: pip install 'attncli[hf]'", "--induction") \
            from None
    transformers.logging.set_verbosity_error()  # its load report and progress bars would mix with our stderr
    transformers.logging.disable_progress_bar()
    try:
        m = transformers.AutoModel.from_pretrained(model, attn_implementation="eager")
    except (OSError, ValueError) as e:
        raise InputError(f"transformers cannot load it ({' '.join(str(e).split())[:150]})", model) from None
    m.eval()
    mask = np.ones_like(ids) if attention_mask is None else attention_mask
    with torch.no_grad():
        out: Any = m(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
                     output_hidden_states=True)
    return np.stack([h.float().numpy() for h in out.hidden_states])

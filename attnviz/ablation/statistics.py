"""The statistics attnviz already measures, beside the ranking's costs: a summary capture of each calibration
needle (``attnviz.capture(summary=True)`` under ``generate()``, its sinks the streaming heads' first ``sink`` keys
and its local window their last ``recent``), read by ``attnviz.inspection.summary``.

Per query head, averaged over the needles:

- ``sink_mass``: the weight on the first ``sink`` real keys (mean over real rows);
- ``local_mass``: the weight on the last ``recent`` keys (i - recent < j <= i);
- ``middle``: the share of the head's attention, over every row, that the middle half of the keys receives
  (positions L/4 to 3L/4; each row's weights sum to 1, so the shares of all keys sum to 1);
- ``retrieval``: Wu et al.'s retrieval score of the needle's code (the tokens the answer copies), the model's own
  greedy answer decoded (``inspection.summary.retrieval_scores``).

A key-value head (the ranking's unit in a grouped-query model) takes the mean of its query heads' values, and the
largest of their retrieval scores (it holds the cache its best retrieval head reads).
"""

from __future__ import annotations

import os
import tempfile
import warnings as python_warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from attnviz.ablation.runs import Loaded

NAMES = ("sink_mass", "local_mass", "middle", "retrieval")


def unit_statistics(loaded: Loaded, needles: Sequence[Any], units: list[tuple[int, int]], kv_heads: bool, *,
                    sink: int, recent: int, generate: int = 12,
                    progress: Callable[[int, int], None] | None = None,
                    ) -> tuple[dict[str, list[float]], np.ndarray, list[str]]:
    """Each unit's statistics (``NAMES``), the query heads' retrieval scores ``[layers, heads, needles]`` and the
    warnings of the retrieval scores (answers that do not repeat the needle)."""
    per_needle: dict[str, list[np.ndarray]] = {name: [] for name in NAMES}
    warnings: list[str] = []
    for n, needle in enumerate(needles):
        values, said = needle_statistics(loaded, needle, sink=sink, recent=recent, generate=generate)
        for name in NAMES:
            per_needle[name].append(values[name])
        warnings += [f"calibration needle {n + 1}: {w}" for w in said]
        if progress is not None:
            progress(n + 1, len(needles))
    with python_warnings.catch_warnings():  # a head no needle scored (NaN everywhere) stays NaN
        python_warnings.simplefilter("ignore", RuntimeWarning)
        means = {name: np.nanmean(np.stack(per_needle[name]), axis=0) for name in NAMES}  # [layers, heads]
    g = loaded.geometry
    out: dict[str, list[float]] = {name: [] for name in NAMES}
    for layer, head in units:
        qs = g.query_heads(head) if kv_heads else [head]
        for name in NAMES:
            values = means[name][layer, qs]
            pick = np.nanmax if name == "retrieval" else np.nanmean
            out[name].append(float(pick(values)) if np.isfinite(values).any() else float("nan"))
    return out, np.stack(per_needle["retrieval"], axis=-1), warnings


def needle_statistics(loaded: Loaded, needle: Any, *, sink: int, recent: int,
                      generate: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """One needle's per-query-head statistics ``[layers, heads]`` and its retrieval warnings."""
    import torch

    from attnviz.capturing.session import Capture
    from attnviz.inspection.summary import analyse_summary, open_summary, read_summary
    from attnviz.summarystats import SummarySettings
    from attnviz.tokentext import one_line

    tok = loaded.tokenizer
    ids = torch.tensor([tok(needle.text)["input_ids"]], device=loaded.device)
    fd, name = tempfile.mkstemp(prefix="attnviz-ablate-", suffix=".safetensors")
    os.close(fd)
    try:
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        with torch.no_grad(), Capture(loaded.model, tok, summary=SummarySettings(sink, recent, rows="last"),
                                      path=name):
            loaded.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=generate,
                                  do_sample=False, pad_token_id=pad)
        opened = open_summary(name)
        assert opened is not None
        raw, capture, kind = opened
        read = read_summary(raw, capture, kind)
        result = analyse_summary(read, needle=needle.code)  # the tokens the answer copies
        heads = result.heads
        received = result.received["sum"][:, 0].astype(np.float64)  # [layers, heads, keys]: over every row
        length = received.shape[-1]
        with np.errstate(invalid="ignore", divide="ignore"):
            middle = received[..., length // 4: 3 * length // 4].sum(-1) / received.sum(-1)
        assert result.retrieval is not None
        values = {"sink_mass": heads["sink_mass"], "local_mass": heads["local_mass"], "middle": middle,
                  "retrieval": result.retrieval.scores}
        recall = float(result.retrieval.recall[0])
        said = [] if recall > 0.5 else [
            f"the model's own answer \"{one_line((read.generated or [''])[0], 40)}\" repeats {recall:.0%} of the "
            "needle's tokens: its retrieval scores measure little (Wu et al. score answers that repeat more than "
            "half)"]
        return {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}, said
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass

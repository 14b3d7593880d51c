"""A model run on texts as it is and with heads restricted, side by side: the log-probability of a given answer
(teacher-forced), the greedy answer, and the KL divergence of the next-token distributions.

Every comparison runs the plain model and the restricted ones as entries of one batch of the same prompt (no
padding: the entries are the same tokens), so that a text costs one forward (or one ``generate()``) whatever
the number of runs compared; ``logits_to_keep`` keeps only the rows compared (a 49k-word vocabulary over 2,000
rows would be 400 MB a run).

What is measured (nats; ``log`` is the natural logarithm):

- ``logprob``: sum over the answer's tokens of log p(token | the text and the answer's tokens before it);
- ``kl``: the mean over the compared rows of KL(plain || restricted) of the next-token distributions: the rows
  that predict the answer's tokens when an answer is given, else the text's last ``KL_ROWS`` rows;
- ``generated``: the greedy continuation of ``generate`` new tokens (``do_sample=False``), as text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnviz.ablation.heads import Geometry, Plan
from attnviz.errors import InputError, UsageError

#: without an answer, the KL is taken over this many of the text's last rows
KL_ROWS = 16


@dataclass
class Loaded:
    """A causal language model, its tokenizer, where it runs and its heads."""

    model: Any
    tokenizer: Any
    device: str
    geometry: Geometry
    name: str
    limit: int | None = None  # the positions it was trained on (or its learned positions)


def load(folder: str, *, device: str = "auto", dtype: str = "auto") -> Loaded:
    """A local model folder with a language-model head, for ``attnviz ablate``."""
    from attnviz.ablation.restrict import geometry
    from attnviz.capturing import folder as folders

    path = folders.check_folder(folder)
    torch, transformers = folders.import_torch()
    device = folders.choose_device(torch, device)
    model, tokenizer = folders.load_model(path, torch, transformers, device, dtype)
    if getattr(model.config, "is_encoder_decoder", False) or model.get_output_embeddings() is None:
        raise UsageError(f"{folder}: {type(model).__name__} is not a decoder language model (...ForCausalLM); attnviz "
                         "ablate compares a causal model's answers.")
    learned, trained = folders.position_limits(model, tokenizer)
    return Loaded(model, tokenizer, device, geometry(model), folders.model_name(folder), learned or trained)


def encode_answer(tokenizer: Any, answer: str) -> list[int]:
    """The answer's token ids (no special tokens); one error if the tokenizer cannot spell it."""
    try:
        ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    except Exception as exc:  # noqa: BLE001 - a tokenizer's own failure on the text
        raise InputError(f"--answer {answer!r}: the tokenizer cannot encode it ({exc}).") from None
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids:
        raise InputError(f"--answer {answer!r}: the tokenizer encodes it as no tokens.")
    if unk is not None and unk in ids and (getattr(tokenizer, "unk_token", None) or "") not in answer:
        raise InputError(f"--answer {answer!r}: the tokenizer cannot spell it (it becomes the unknown token "
                         f"{tokenizer.unk_token!r}).")
    return [int(i) for i in ids]


def encode_text(loaded: Loaded, text: str, extra: int = 0, what: str = "--text") -> list[int]:
    """A text's token ids (with the tokenizer's special tokens), refused past the model's positions."""
    try:
        ids = [int(i) for i in loaded.tokenizer(text)["input_ids"]]
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{what}: the tokenizer cannot encode it ({exc}).") from None
    if not ids:
        raise InputError(f"{what}: the text is empty.")
    if loaded.limit is not None and len(ids) + extra > loaded.limit:
        raise InputError(f"{what}: {len(ids)} tokens (and {extra} more of the answer or generated) run past the "
                         f"model's {loaded.limit} positions; shorten the text.")
    return ids


@dataclass
class Outcome:
    """One run on one text: the answer's log-probability (nats) and per token, the greedy answer, the KL from
    the plain run."""

    logprob: float | None = None
    token_logprobs: list[float] = field(default_factory=list)
    generated: str | None = None
    kl: float | None = None


@dataclass
class TextRuns:
    """One text run plainly (``runs[0]``) and with each plan entry's heads restricted (``runs[1:]``)."""

    tokens: int
    runs: list[Outcome]


def teacher_forced(loaded: Loaded, ids: list[int], answer: list[int] | None, plan: Plan,
                   kl_rows: int = KL_ROWS, reference: Any = None) -> tuple[list[Outcome], Any]:
    """One forward of ``ids`` (and ``answer``) per plan entry, in one batch: each entry's answer log-probability
    and its KL over the compared rows from ``reference`` (the plain run's log-probabilities of those rows, as
    returned before), or else from entry 0 (which must then be the plain run, an empty entry). Returns the
    outcomes and entry 0's log-probabilities of the compared rows (``[rows, vocabulary]``)."""
    import torch

    from attnviz.ablation.restrict import restricted

    seq = ids + (answer or [])
    batch = len(plan.entries)
    if answer:
        keep_rows, rows = len(answer) + 1, slice(0, len(answer))  # rows P-1 .. P+A-2 predict the answer
    else:
        n = min(kl_rows, len(ids))
        keep_rows, rows = n, slice(0, n)
    tensor = torch.tensor([seq] * batch, device=loaded.device)
    with torch.no_grad(), restricted(loaded.model, plan, loaded.geometry):
        logits = _forward(loaded, tensor, keep_rows)
    logp = torch.log_softmax(logits[:, rows].float(), dim=-1)  # [batch, rows, vocab]
    out = []
    for b in range(batch):
        outcome = Outcome()
        if answer:
            target = torch.tensor(answer, device=logp.device)
            per = logp[b].gather(-1, target[:, None])[:, 0]
            outcome.token_logprobs = [float(v) for v in per.cpu()]
            outcome.logprob = float(per.double().sum())
        if b or reference is not None:
            ref = logp[0] if reference is None else reference
            outcome.kl = float((ref.exp() * (ref - logp[b])).sum(-1).double().mean())
        out.append(outcome)
    return out, logp[0]


def _forward(loaded: Loaded, tensor: Any, keep_rows: int) -> Any:
    from attnviz.capturing.blame import run_forward

    return run_forward(loaded.model, {"input_ids": tensor, "logits_to_keep": keep_rows, "use_cache": False},
                       where=loaded.name, smaller="shorter texts or a smaller --batch", failed_on="the text").logits


def greedy(loaded: Loaded, ids: list[int], new_tokens: int, plan: Plan) -> list[str]:
    """Each plan entry's greedy continuation of ``ids`` (``new_tokens`` tokens at most), in one ``generate()``."""
    import torch

    from attnviz.ablation.restrict import restricted

    batch = len(plan.entries)
    tensor = torch.tensor([ids] * batch, device=loaded.device)
    tok = loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    from attnviz.capturing.blame import run_forward

    with torch.no_grad(), restricted(loaded.model, plan, loaded.geometry):
        out = run_forward(loaded.model.generate, {"input_ids": tensor, "attention_mask": torch.ones_like(tensor),
                                                  "max_new_tokens": new_tokens, "do_sample": False,
                                                  "pad_token_id": pad},
                          where=loaded.name, smaller="shorter texts or a smaller --batch", failed_on="the text")
    texts = []
    for row in out[:, len(ids):].cpu().tolist():
        if tok.eos_token_id is not None and tok.eos_token_id in row:
            row = row[:row.index(tok.eos_token_id)]
        texts.append(tok.decode(row, skip_special_tokens=True))
    return texts


def compare(loaded: Loaded, texts: Sequence[str], plan_of: Callable[[int], Plan], *, answer: str | None,
            generate: int = 0, kl_rows: int = KL_ROWS, progress: Callable[[int], None] | None = None) -> list[TextRuns]:
    """Each text run plainly and as ``plan_of(text index)`` restricts it (a plan whose entry 0 is empty, the
    plain run): the answer's log-probabilities, the KL, and the greedy answers when ``generate``."""
    answer_ids = encode_answer(loaded.tokenizer, answer) if answer is not None else None
    results = []
    for n, text in enumerate(texts):
        ids = encode_text(loaded, text, len(answer_ids or []) + generate, f"--text {n + 1}")
        plan = plan_of(n)
        outcomes, _ = teacher_forced(loaded, ids, answer_ids, plan, kl_rows)
        if generate:
            for outcome, said in zip(outcomes, greedy(loaded, ids, generate, plan)):
                outcome.generated = said
        results.append(TextRuns(len(ids), outcomes))
        if progress is not None:
            progress(n + 1)
    return results


def holds(generated: str | None, code: str) -> bool:
    """Whether a generated answer holds ``code`` (the needle's answer)."""
    return generated is not None and code in generated


def mean(values: Sequence[float]) -> float:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


__all__ = ["KL_ROWS", "Loaded", "Outcome", "TextRuns", "compare", "encode_answer", "encode_text", "greedy", "holds",
           "load", "mean", "teacher_forced"]

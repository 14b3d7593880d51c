"""Corpus statistics where the model runs: each attention site's weights ``[B, H, L, L]`` reduced, as the
model computes them, to per-head sums and counts over a mini-batch of texts (torch, vectorised over texts,
heads and rows: no loop over texts), and the run of a local model folder over a text file in mini-batches
(``attnviz capture MODEL_DIR --text-file corpus.txt --corpus``).

The definitions (which rows count, which keys, the averaging over texts) are those of
``attnviz.corpusfile``, which writes the file and merges shards (``attnviz.inspection.corpus`` turns the
sums into means). Per text, each statistic is a mean over the text's real query rows (padding left out); the
sums over texts and the number of texts that had such rows are kept, so that batches and shards add up exactly (to float
rounding). The Jensen-Shannon divergences between heads (Clark et al. 2019, ``head_distances``) are summed
over every real query row. Of the divergence only ``sum t log t`` (``t`` the sum of two heads' smoothed rows)
needs the pairs, and summed over rows it is a sum over the batch's real (row, key) elements: those are
gathered once per batch into a flat ``[heads, elements]`` buffer (padding and masked keys take no room, so a
causal model's pairs cost half an encoder's), and each head is taken against a chunk of later heads a pass.

A text whose exact weights over every site would take more than ``corpuslong.BLOCKED_FROM`` bytes leaves its
mini-batch and runs alone: its sites hand q and k to ``add_blocked`` (``begin_blocked`` / ``end_blocked`` around
its forward), whose statistics ``attnviz.capturing.corpuslong`` computes a block of query rows at a time, the
same sums ``add`` keeps. The other texts of a mini-batch run exact, cut into batches whose weights over every
site stay within ``corpuslong.BATCH_BYTES`` (the distances hold them all until the forward ends).

torch and transformers are imported inside the functions, when a corpus is captured.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, cast

import numpy as np

from attnviz.capturing.blame import run_forward
from attnviz.capturing.divergence import divergence_sums, sum_dtype
from attnviz.capturing.options import CaptureSettings
from attnviz.corpusfile import CORPUS_STATS, PUNCTUATION, SMOOTHING, CorpusSums
from attnviz.errors import AttnvizError, InputError, UsageError
from attnviz.rowmath import entropy_torch, real_ends_torch, row_rule
from attnviz.statistics import BY_NAME, POSITIONAL


@dataclass
class _Batch:
    """The mini-batch running now: its real tokens and the key classes of each token."""

    real: Any  # [B, L] bool
    classes: Any  # [C, B, L] float (punctuation, then the user's classes)
    first: Any  # [B] the first real position
    last: Any  # [B] the last real position
    #: (site index, weights [B,H,L,L] (0 off the keys each row sees), keep [B,1|H,L,L], seen [B,1|H,L])
    smoothed: list[tuple[int, Any, Any, Any]] = field(default_factory=list)
    where: Any = None  # [B, L, L]: the real (row, key) elements some site sees (the union)
    uneven: bool = False  # whether some head sees fewer of them (its weights are 0 on the others)


class CorpusAccumulator:
    """Per-head sums and counts over the texts of every batch it is shown.

    ``begin(real, classes)`` before each forward pass, ``add(site, weights, mask)`` for each attention
    call (the capture's ``attend`` calls it), ``end()`` after the forward (the head distances of the batch);
    ``result()`` hands the sums over as NumPy (``attnviz.corpusfile.CorpusSums``).
    """

    def __init__(self, sink_threshold: float = 0.3, classes: Sequence[str] = (), distances: bool = True) -> None:
        self.sink_threshold = float(sink_threshold)
        self.class_names = list(classes)
        self.distances = distances
        self.sites: list[str] = []
        self.layers: list[int] = []
        self.heads: list[int] = []
        self.sums: list[Any] = []  # per site: [S, H] float64
        self.texts: list[Any] = []  # per site: [S, H] float64
        self.rows: list[Any] = []  # per site: [H]
        self.js: Any = None  # [G, G] float64, upper triangle filled
        self.js_rows: Any = None
        self.batch: _Batch | None = None
        self.skipped: set[str] = set()
        #: the long text running now (``begin_blocked``): its sites hand q and k, not weights
        self.long_text: Any = None
        self.blocked_texts = 0  # texts run a block of rows at a time
        self.distance_left_out = 0  # texts left out of the head distances (their q and k did not fit)

    @property
    def names(self) -> list[str]:
        return [*CORPUS_STATS, *(f"class:{n}" for n in self.class_names)]

    # -- one batch

    def begin(self, real: Any, classes: Any) -> None:
        """A new forward pass over texts whose real tokens are ``real`` [B, L] and whose key classes are
        ``classes`` [C, B, L] (C = 1 + the user's classes; punctuation first)."""
        import torch

        real = real.to(torch.bool)
        first, last = real_ends_torch(real)
        self.batch = _Batch(real, classes.to(torch.float32), first, last)

    def _site_index(self, site: Any, heads: int, device: Any) -> int:
        import torch

        if site.name in self.sites:
            return self.sites.index(site.name)
        if self.js is not None:
            raise AttnvizError(f"corpus: the attention site {site.name} first ran after the first batch; every "
                               "batch must run the same sites.")
        self.sites.append(site.name)
        self.layers.append(int(site.layer))
        self.heads.append(heads)
        dtype = sum_dtype(device)
        s = len(self.names)
        self.sums.append(torch.zeros((s, heads), dtype=dtype, device=device))
        self.texts.append(torch.zeros((s, heads), dtype=dtype, device=device))
        self.rows.append(torch.zeros(heads, dtype=dtype, device=device))
        return len(self.sites) - 1

    def add(self, site: Any, weights: Any, mask: Any) -> None:
        """One attention call: ``weights`` [B, H, L, L] (the model's own probabilities), ``mask`` as the
        attention function received it (additive float or boolean, [B, 1, L, L]; None: every key)."""
        import torch

        b = self.batch
        if b is None or site.kind == "cross":
            return
        nb, nh, lq, lk = (int(n) for n in weights.shape)
        n = int(b.real.shape[-1])
        if lq != n or lk != n or nb != int(b.real.shape[0]):
            self.skipped.add(site.name)  # not self-attention over the texts (a decoder's start tokens)
            return
        with torch.no_grad():
            self._add(site, weights, mask, b, nh, n)

    def _add(self, site: Any, weights: Any, mask: Any, b: _Batch, nh: int, n: int) -> None:
        import torch

        device = weights.device
        s = self._site_index(site, nh, device)
        dtype = self.sums[s].dtype
        if mask is None:
            keep = torch.ones((1, 1, n, n), dtype=torch.bool, device=device)
        else:
            keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
            keep = keep[..., :n, :n]
        keep = keep & b.real[:, None, None, :]  # real keys only: [B, 1|H, L, L]
        x = torch.where(keep, weights.to(torch.float32), 0.0)
        nb = x.shape[0]
        shape = (nb, nh, n)
        rows = (b.real[:, None, :] & keep.any(-1)).expand(shape)  # real rows that see some key: [B, H, L]
        pos = torch.arange(n, device=device)
        # the rows each statistic is a mean over (its rule in attnviz.statistics)
        where = {rule: row_rule(rule, rows, pos, b.first.view(-1, 1, 1), b.last.view(-1, 1, 1))
                 for rule in POSITIONAL}

        entropy = entropy_torch(x)  # [B, H, L], exact: 0 log 0 = 0
        top, arg = x.max(-1)
        first_w = x.gather(-1, b.first.view(-1, 1, 1, 1).expand(nb, nh, n, 1))[..., 0]
        last_w = x.gather(-1, b.last.view(-1, 1, 1, 1).expand(nb, nh, n, 1))[..., 0]
        diagonal = x.diagonal(0, -2, -1)
        previous = torch.nn.functional.pad(x.diagonal(-1, -2, -1), (1, 0))
        following = torch.nn.functional.pad(x.diagonal(1, -2, -1), (0, 1))
        seen = keep.sum(-1)  # the keys each row may see: [B, 1|H, L]
        uniform = torch.log(seen.clamp_min(1).to(torch.float32)).expand(shape)
        top_previous = (arg == pos - 1).to(torch.float32)
        top_next = (arg == pos + 1).to(torch.float32)
        masses = torch.einsum("bhij,cbj->cbhi", x, b.classes)  # [C, B, H, L]

        # each statistic but the sink rate: a mean over its rows of a text (CORPUS_STATS' order, then the classes)
        per_row = {"first": first_w, "last": last_w, "punctuation": masses[0], "diagonal": diagonal,
                   "previous": previous, "next": following, "entropy": entropy, "entropy_uniform": uniform,
                   "first_row_entropy": entropy, "max": top, "top_previous": top_previous, "top_next": top_next}
        pairs = [(per_row[name], where[BY_NAME[name].rows]) for name in CORPUS_STATS if name != "sink_rate"]
        pairs += [(masses[k + 1], rows) for k in range(len(self.class_names))]
        where = torch.stack([w for _, w in pairs])  # [S', B, H, L]
        count = where.sum(-1)  # [S', B, H]
        means = (torch.stack([v for v, _ in pairs]) * where).sum(-1) / count.clamp_min(1)
        have = count > 0
        # Gu et al.'s sink: the mean weight on the first token over the rows that see it, past the threshold
        sees_first = rows & keep.gather(-1, b.first.view(-1, 1, 1, 1).expand(*keep.shape[:-1], 1))[..., 0]
        seeing = sees_first.sum(-1)
        alpha = (first_w * sees_first).sum(-1) / seeing.clamp_min(1)
        sink = ((alpha > self.sink_threshold) & (seeing > 0)).to(torch.float32)
        at = CORPUS_STATS.index("sink_rate")
        means = torch.cat([means[:at], sink[None], means[at:]])
        have = torch.cat([have[:at], (seeing > 0)[None], have[at:]])
        self.sums[s] += means.sum(1, dtype=dtype)
        self.texts[s] += have.sum(1, dtype=dtype)
        self.rows[s] += rows.sum((0, 2)).to(dtype)
        if self.distances:
            self._smooth(s, x, keep, seen, rows, b)

    def _smooth(self, s: int, x: Any, keep: Any, seen: Any, rows: Any, b: _Batch) -> None:
        """Keep what the head distances need of one site: its weights ``x`` (0 off the keys each row may see),
        ``keep`` and ``seen`` (the keys each row may see), and the batch's real (row, key) elements it sees."""
        import torch

        where = (keep & b.real[:, None, :, None]).any(1)  # [B, L, L]: the elements some head of the site sees
        if b.where is None:
            b.where = where
        elif not (b.where.shape == where.shape and bool(torch.equal(b.where, where))):
            b.where = b.where | where  # supports differ between sites (windows on some layers)
            b.uneven = True
        if keep.shape[1] > 1:  # one support per head: some heads see less than the site's union
            b.uneven = True
        b.smoothed.append((s, x, keep, seen))

    def end(self) -> None:
        """The forward pass is over: the Jensen-Shannon divergences between every pair of heads of the
        batch, summed over its real query rows."""
        import torch

        b, self.batch = self.batch, None
        if b is None or not b.smoothed or not self.distances:
            return
        with torch.no_grad():
            order = sorted(b.smoothed, key=lambda t: t[0])
            if [t[0] for t in order] != list(range(len(self.sites))):
                missing = sorted(set(self.sites) - {self.sites[t[0]] for t in order})
                raise AttnvizError(f"corpus: the attention site {missing[0] if missing else '?'} did not run in "
                                   "every batch.")
            wide = sum_dtype(b.real.device)
            g = sum(self.heads)
            if self.js is None:
                self.js = torch.zeros((g, g), dtype=wide, device=b.real.device)
                self.js_rows = torch.zeros((), dtype=wide, device=b.real.device)
            where = b.where
            flat = _smoothed_flat(order, where, g)  # [G, E]
            b.smoothed.clear()
            rows = b.real.sum()
            pairs = divergence_sums(flat, int(rows), clamp=b.uneven)  # summed over the batch's real rows
            self.js += torch.triu(pairs, diagonal=1)
            self.js_rows += rows.to(wide)

    # -- a long text, alone, a block of query rows at a time (``attnviz.capturing.corpuslong``)

    def begin_blocked(self, real: Any, classes: Any, distance_budget: int | None = None) -> None:
        """A forward pass over one long text (``real`` [1, L], ``classes`` [C, 1, L]) whose sites hand their q
        and k (``add_blocked``) instead of weights; its q and k are kept for the head distances while they fit
        ``distance_budget`` bytes (``corpuslong.DISTANCE_BUDGET``)."""
        from attnviz.capturing.corpuslong import DISTANCE_BUDGET, LongText

        if int(real.shape[0]) != 1:
            raise AttnvizError("corpus: a long text runs alone (a batch of one).")
        self.begin(real, classes)
        self.long_text = LongText(DISTANCE_BUDGET if distance_budget is None else int(distance_budget))

    def add_blocked(self, site: Any, query: Any, key: Any, *, parts: Any, dense: Any = None, scale: float,
                    softcap: float | None = None, sinks: Any = None, bias: Any = None) -> None:
        """One attention call of the long text: ``query [1, H, L, d]``, ``key [1, Hkv, L, d]``, the mask as its
        ``parts`` (``attnviz.summarystats.MaskParts``) or ``dense`` (a boolean keep mask), and the family's
        ``scale``, ``softcap``, ``sinks`` and position ``bias``: the text's statistics, as ``add`` keeps them."""
        import torch

        from attnviz.capturing.corpuslong import Call, site_sums

        b, long = self.batch, self.long_text
        if b is None or long is None or site.kind == "cross":
            return
        nb, nh, lq = (int(n) for n in query.shape[:3])
        n = int(b.real.shape[-1])
        if lq != n or int(key.shape[-2]) != n or nb != 1:
            self.skipped.add(site.name)  # not self-attention over the text
            return
        with torch.no_grad():
            s = self._site_index(site, nh, query.device)
            means, had, rows = site_sums(query, key, scale=scale, parts=parts, dense=dense, softcap=softcap,
                                         sinks=sinks, bias=bias, real=b.real, classes=b.classes,
                                         sink_threshold=self.sink_threshold)
            dtype = self.sums[s].dtype
            self.sums[s] += means.to(dtype)
            self.texts[s] += had.to(dtype)
            self.rows[s] += rows.to(dtype)
            if self.distances:
                long.keep(Call(s, query, key, parts, dense, scale, softcap, sinks, bias))

    def end_blocked(self) -> None:
        """The long text's forward is over: its head distances from the q and k kept, block of rows by block of
        rows; a text whose q and k did not fit is counted in ``distance_left_out`` and adds no row to them."""
        import torch

        from attnviz.capturing.corpuslong import head_distances

        b, long = self.batch, self.long_text
        self.batch, self.long_text = None, None
        if b is None or long is None:
            return
        self.blocked_texts += 1
        if not self.distances:
            return
        if long.over:
            self.distance_left_out += 1
            return
        calls = sorted(long.calls, key=lambda c: c.site)
        if [c.site for c in calls] != list(range(len(self.sites))):
            missing = sorted(set(self.sites) - {self.sites[c.site] for c in calls})
            raise AttnvizError(f"corpus: the attention site {missing[0] if missing else '?'} did not run in "
                               "every batch.")
        with torch.no_grad():
            pairs = head_distances(calls, b.real)
            if self.js is None:
                g = pairs.shape[0]
                self.js = torch.zeros((g, g), dtype=sum_dtype(pairs.device), device=pairs.device)
                self.js_rows = torch.zeros((), dtype=self.js.dtype, device=pairs.device)
            self.js += torch.triu(pairs, diagonal=1).to(self.js.dtype)
            self.js_rows += b.real.sum().to(self.js.dtype)
        long.calls.clear()

    # -- the result

    def result(self, metadata: dict[str, Any]) -> CorpusSums:
        if not self.sites:
            raise AttnvizError("corpus: no self-attention site ran over the texts.")
        g = sum(self.heads)
        js = np.zeros((g, g)) if self.js is None else self.js.double().cpu().numpy()
        js = js + js.T
        js_rows = np.full((g, g), 0.0 if self.js_rows is None else float(self.js_rows))
        return CorpusSums(
            sites=list(self.sites), layers=list(self.layers), heads=list(self.heads), names=self.names,
            sums=np.concatenate([t.double().cpu().numpy() for t in self.sums], axis=1),
            texts=np.concatenate([t.double().cpu().numpy() for t in self.texts], axis=1),
            rows=np.concatenate([t.double().cpu().numpy() for t in self.rows]),
            js=js, js_rows=js_rows if self.distances else np.zeros((g, g)), meta=metadata)


def _smoothed_flat(order: Sequence[tuple[int, Any, Any, Any]], where: Any, g: int) -> Any:
    """Every head's smoothed rows (Clark et al.: ``0.001 / n_i + 0.999 A_ij`` over the ``n_i`` keys row i may
    see, 0 off them) on the elements ``where`` marks ``[B, L, L]``, gathered flat: ``[G, E]`` float32, the
    sites' heads in ``order`` (site, weights ``[B, H, L, L]``, keep ``[B, 1|H, L, L]``, seen ``[B, 1|H, L]``)."""
    import torch

    idx = where.reshape(-1).nonzero().squeeze(1)  # [E]: b L L + i L + j
    row = idx // where.shape[-1]  # b L + i
    flat = torch.empty((g, idx.numel()), dtype=torch.float32, device=where.device)
    g0 = 0
    for _, x, keep, seen in order:
        nh = x.shape[1]
        if keep.shape[1] == 1:
            sees = keep.reshape(-1).index_select(0, idx)  # [E]
            n = seen.reshape(-1).index_select(0, row)
        else:  # a mask per head
            sees = keep.transpose(0, 1).reshape(nh, -1).index_select(1, idx)  # [H, E]
            n = seen.transpose(0, 1).reshape(nh, -1).index_select(1, row)
        floor = torch.where(sees, SMOOTHING / n.clamp_min(1).to(torch.float32), 0.0)
        gathered = x.transpose(0, 1).reshape(nh, -1).index_select(1, idx)  # [H, E]
        torch.add(floor, gathered, alpha=1 - SMOOTHING, out=flat[g0:g0 + nh])
        g0 += nh
    return flat


# ---------------------------------------------------------------------------------------------------
# Tokens: which are punctuation, which match the user's classes


def compile_classes(specs: Sequence[str]) -> list[tuple[str, re.Pattern[str]]]:
    """``--token-class NAME=REGEX`` (repeatable) as (name, compiled pattern); a usage error names a bad one."""
    out: list[tuple[str, re.Pattern[str]]] = []
    for spec in specs:
        name, eq, pattern = spec.partition("=")
        name = name.strip()
        if not eq or not name or not pattern:
            raise UsageError(f"--token-class {spec!r}: expected NAME=REGEX, e.g. digits=[0-9]+.")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise UsageError(f"--token-class {spec!r}: a NAME of letters, digits, '_', '-' and '.'.")
        if name in (n for n, _ in out):
            raise UsageError(f"--token-class {name}: named twice.")
        try:
            out.append((name, re.compile(pattern)))
        except re.error as exc:
            raise UsageError(f"--token-class {name}: the regular expression {pattern!r} does not compile "
                             f"({exc}).") from None
    return out


class TokenClasses:
    """Each token id's text (the tokenizer's decoding of it alone, stripped) and the classes it is in:
    punctuation ("." or ","), then each user class (its regex matching the whole text)."""

    def __init__(self, tokenizer: Any, classes: Sequence[tuple[str, re.Pattern[str]]]) -> None:
        self.tokenizer = tokenizer
        self.classes = list(classes)
        self.known: dict[int, list[bool]] = {}

    def text(self, token_id: int) -> str:
        try:
            return str(self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)).strip()
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode one id
            return str(self.tokenizer.convert_ids_to_tokens(token_id))

    def flags(self, token_id: int) -> list[bool]:
        found = self.known.get(token_id)
        if found is None:
            text = self.text(token_id)
            found = [text in PUNCTUATION, *(bool(p.fullmatch(text)) for _, p in self.classes)]
            self.known[token_id] = found
        return found

    def masks(self, ids: Any) -> Any:
        """``[C, B, L]`` float: 1 where the token is in the class."""
        import torch

        unique, inverse = torch.unique(ids, return_inverse=True)
        table = torch.tensor([self.flags(int(i)) for i in unique.tolist()], dtype=torch.float32)  # [U, C]
        return table.to(ids.device)[inverse].permute(2, 0, 1)


# ---------------------------------------------------------------------------------------------------
# Identity: what must agree for files to merge


def model_identity(model: Any) -> dict[str, Any]:
    """The model's family, class, the SHA-256 of its configuration (what changes its computation) and of a
    sample of its parameters (each tensor's shape and first 4,096 values)."""
    import torch

    config = model.config.to_dict()
    for volatile in ("transformers_version", "_name_or_path", "_attn_implementation", "_attn_implementation_internal",
                     "_commit_hash", "dtype", "torch_dtype", "architectures", "use_cache", "output_attentions",
                     "return_dict", "output_hidden_states"):
        config.pop(volatile, None)
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.state_dict().items():
            flat = param.detach().reshape(-1)[:4096].to("cpu", torch.float32)
            digest.update(name.encode())
            digest.update(str(tuple(param.shape)).encode())
            digest.update(flat.numpy().tobytes())
    return {"model_type": getattr(model.config, "model_type", None), "architecture": type(model).__name__,
            "config_sha256": _sha(json.dumps(config, sort_keys=True, default=str)),
            "weights_sample_sha256": digest.hexdigest()}


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's class, vocabulary size and the SHA-256 of its vocabulary and special tokens."""
    vocab = sorted(tokenizer.get_vocab().items())
    specials = {k: str(v) for k, v in sorted((getattr(tokenizer, "special_tokens_map", {}) or {}).items())}
    return {"class": type(tokenizer).__name__, "vocabulary": len(vocab),
            "vocabulary_sha256": _sha(json.dumps(vocab, separators=(",", ":"))),
            "special_tokens": specials}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# The run over a text file


@dataclass
class CorpusText:
    """Texts in hand (``attnviz.corpus``), and what was left out of them; ``batches`` hands them over as a text
    file's are."""

    texts: list[str]
    lines: list[int]  # each text's line number (1-based)
    empty: int  # empty lines skipped
    source: dict[str, Any]  # where the texts come from, their SHA-256, the shard

    @property
    def count(self) -> int:
        return len(self.texts)

    def batches(self, size: int) -> Iterator[tuple[list[str], list[int]]]:
        """The texts, ``size`` at a time, with their line numbers."""
        for start in range(0, len(self.texts), size):
            yield self.texts[start:start + size], self.lines[start:start + size]


class CorpusFile:
    """The texts of one shard of a corpus's text file (``read_corpus_text``), never held whole: ``count`` texts,
    ``empty`` lines skipped, ``source``; ``batches`` reads the file again, line by line, and hands this shard's
    texts over a batch at a time. A named pipe, which can be read once only, is copied to an unnamed temporary
    file as it is first read (``spool``), and read again from there."""

    def __init__(self, path: str, shard: tuple[int, int], count: int, empty: int, source: dict[str, Any],
                 spool: IO[bytes] | None = None) -> None:
        self.path = path
        self.shard = shard
        self.count = count
        self.empty = empty
        self.source = source
        self.spool = spool
        self.piped = spool is not None

    def close(self) -> None:
        """Remove the named pipe's copy, if there is one."""
        if self.spool is not None:
            self.spool.close()
            self.spool = None

    def batches(self, size: int) -> Iterator[tuple[list[str], list[int]]]:
        """This shard's texts, ``size`` at a time with their line numbers (1-based), read line by line: no more
        of the file is held than a batch of texts and a block of bytes. A file whose SHA-256 is no longer the
        one it had when it was checked is an error."""
        if self.piped and self.spool is None:  # the pipe itself is read out: opening it again would wait for ever
            raise AttnvizError(f"--text-file {self.path}: the named pipe's copy is closed; it cannot be read again.")
        index, count = self.shard
        digest = hashlib.sha256()
        texts: list[str] = []
        numbers: list[int] = []
        for n, line in enumerate(_text_lines(self.path, digest, spool=self.spool)):
            if n % count == index and line.strip():
                texts.append(line)
                numbers.append(n + 1)
                if len(texts) == size:
                    yield texts, numbers
                    texts, numbers = [], []
        if digest.hexdigest() != self.source["sha256"]:
            raise InputError(f"--text-file {self.path}: changed while the corpus ran (its SHA-256 is not the one "
                             "it had when it was first read); run it again on a file that stays as it is.")
        if texts:
            yield texts, numbers


def read_corpus_text(path: str, shard: tuple[int, int] = (0, 1)) -> CorpusFile:
    """The non-empty lines of ``path`` (UTF-8; a local file, a named pipe or a URL) that shard ``index/count``
    takes: every ``count``-th line from ``index`` on, counting every line (empty ones too), so that the shards
    of one file are disjoint and together the whole file. The file is read here once, line by line, to check it
    (UTF-8, some text) and count its lines, this shard's texts and empty lines and take its SHA-256; the texts
    are read when the corpus runs (``CorpusFile.batches``). Nothing limits its size but the disk."""
    from pathlib import Path

    from attnviz import storage
    from attnviz.storage.local import is_pipe

    if not storage.is_url(path) and not Path(path).exists():
        raise UsageError(f"--text-file {path}: no such file.")
    index, count = shard
    spool = None
    if not storage.is_url(path) and is_pipe(path):
        import tempfile

        spool = tempfile.TemporaryFile(prefix="attnviz-corpus-")  # unnamed: gone when closed or the process ends
    digest = hashlib.sha256()
    lines = texts = empty = 0
    anything = False
    for n, line in enumerate(_text_lines(path, digest, copy=spool)):
        lines = n + 1
        text = bool(line.strip())
        anything = anything or text
        if n % count == index:
            texts += text
            empty += not text
    if not anything:
        raise InputError(f"--text-file {path}: holds no text (no non-empty line).")
    source = {"file": Path(path).name if not storage.is_url(path) else path,
              "sha256": digest.hexdigest(), "lines": lines, "shards": [[index, count]]}
    return CorpusFile(path, shard, texts, empty, source, spool)


def _text_lines(path: str, digest: Any, spool: IO[bytes] | None = None,
                copy: IO[bytes] | None = None) -> Iterator[str]:
    """The lines of a corpus's text file, read a block at a time (``storage.textfiles.text_lines``): from ``spool``
    (a named pipe's copy) when given, else from the file (``storage.open_input``'s stream: a local file or a URL;
    a named pipe opened as it is, its bytes written to ``copy``)."""
    from attnviz import storage
    from attnviz.storage.textfiles import text_lines

    try:
        if spool is not None:
            spool.seek(0)
            yield from text_lines(spool, path, "text", digest)
        elif copy is not None:
            with open(path, "rb") as pipe:
                yield from text_lines(cast(IO[bytes], _Copied(pipe, copy)), path, "text", digest)
        else:
            with storage.open_input(path, path).stream() as stream:
                yield from text_lines(stream, path, "text", digest)
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc}).") from None


class _Copied:
    """A stream whose bytes are written to ``copy`` as they are read."""

    def __init__(self, stream: IO[bytes], copy: IO[bytes]) -> None:
        self.stream, self.copy = stream, copy

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.copy.write(data)
        return data


@dataclass
class CorpusRun:
    """What ``capture_corpus`` did."""

    path: Any
    sums: CorpusSums
    model_type: str
    device: str
    texts: int
    seconds: float
    warnings: list[str] = field(default_factory=list)


def capture_corpus(options: CaptureSettings, corpus: CorpusText | CorpusFile, out: Any, *,
                   progress: Callable[[int, int], None] | None = None) -> CorpusRun:
    """Run the local model folder ``options.model`` over ``corpus`` in mini-batches of ``--batch-size`` texts
    and write the per-head sums to ``out`` (a corpus file: ``attnviz.corpusfile``). ``progress(done, total)`` is
    called after each batch. ``options.long``: ``truncate`` (texts past the model's positions keep their first
    tokens, and the dropped tokens are counted) or ``refuse``. See ``run_corpus``."""
    from attnviz.capturing.folder import check_folder, choose_device, import_torch, load_model
    from attnviz.corpusfile import write_corpus

    path = check_folder(options.model)
    torch, transformers = import_torch()
    device = choose_device(torch, options.run.device)
    started = time.perf_counter()
    model, tokenizer = load_model(path, torch, transformers, device, options.run.dtype)
    sums, warnings = run_corpus(model, tokenizer, corpus, options, device=device, progress=progress,
                                where=options.model)
    write_corpus(out, sums)
    return CorpusRun(out, sums, str(sums.meta.get("model_type")), device, corpus.count,
                     time.perf_counter() - started, warnings)


def run_corpus(model: Any, tokenizer: Any, corpus: CorpusText | CorpusFile, options: CaptureSettings, *,
               device: Any = "cpu", progress: Callable[[int, int], None] | None = None,
               where: str = "the model") -> tuple[CorpusSums, list[str]]:
    """``capture_corpus`` for a model and tokenizer in hand: the sums (metadata included) and the warnings.
    The caller's objects are left as they were (``_run_settings``): the tokenizer pads on the right with a pad
    token of its own, and the model runs in eval mode (no dropout), only while the corpus runs.

    A text whose exact weights over every site (sites x heads x L x L float32) would take more than
    ``options.corpus.blocked_from`` bytes (``corpuslong.BLOCKED_FROM``, 256 MiB) leaves its mini-batch and runs
    alone, its statistics computed from q and k a block of query rows at a time (``capturing.corpuslong``: the
    same sums); its head distances need every site's q and k kept until the forward ends, within
    ``options.corpus.distance_budget`` bytes (``corpuslong.DISTANCE_BUDGET``, 1 GiB), else the text is left out
    of the distances only (counted, and said in a warning)."""
    import torch

    from attnviz.capturing.session import Capture

    with _run_settings(model, tokenizer):
        run = _CorpusPass(model, tokenizer, options, device, where)
        if options.long == "refuse":
            run.refuse_long(corpus)
        done = 0
        with torch.no_grad(), Capture(model, tokenizer, corpus=run.acc) as cap:
            for chunk, lines in corpus.batches(options.corpus.texts_per_batch):  # a batch held at a time
                run.batch(chunk, lines)
                done += len(chunk)
                if progress is not None:
                    progress(done, corpus.count)
        return run.acc.result(run.metadata(corpus, cap.metadata)), run.warnings(corpus.count)


@contextlib.contextmanager
def _run_settings(model: Any, tokenizer: Any) -> Iterator[None]:
    """While the corpus runs: the tokenizer pads on the right (real tokens at their own positions, whatever the
    family's habit) with its pad token, or its end-of-text or unknown token where it has none; every module of
    the model in eval mode (a model handed over in training mode would drop weights out on the exact path).
    Afterwards the tokenizer's pad token and side and each module's mode are what the caller left."""
    pad, side = tokenizer.pad_token, tokenizer.padding_side
    modes = [(m, m.training) for m in model.modules()] if callable(getattr(model, "modules", None)) else []
    try:
        if pad is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        tokenizer.padding_side = "right"
        if modes:
            model.eval()
        yield
    finally:
        if pad is None:
            tokenizer.pad_token = None
        tokenizer.padding_side = side
        for module, training in modes:
            module.training = training


class _CorpusPass:
    """One corpus run over a model in hand: the accumulator its sites feed, the model's position limit (texts are
    cut to it as a capture's ``--long`` cuts them), and what is counted beside the sums (the tokens standing
    first and last, the texts truncated and their dropped tokens, the longest text run alone)."""

    def __init__(self, model: Any, tokenizer: Any, options: CaptureSettings, device: Any, where: str) -> None:
        from attnviz.capturing.corpuslong import BLOCKED_FROM, DISTANCE_BUDGET, site_count, site_heads
        from attnviz.capturing.folder import position_limits

        self.model, self.tokenizer, self.options, self.device, self.where = model, tokenizer, options, device, where
        self.runner = model
        if getattr(model.config, "is_encoder_decoder", False):
            get = getattr(model, "get_encoder", None)
            self.runner = get() if callable(get) else None
            if self.runner is None:
                raise InputError(f"{where}: an encoder-decoder without an encoder attnviz can run alone.")
        learned, trained = position_limits(model, tokenizer)
        self.limit = learned or trained
        given = options.corpus
        self.blocked_from = BLOCKED_FROM if given.blocked_from is None else int(given.blocked_from)
        self.distance_budget = DISTANCE_BUDGET if given.distance_budget is None else int(given.distance_budget)
        self.heads = site_heads(model) * site_count(model)  # every site's heads: what a text's exact weights hold
        self.classes = compile_classes(given.classes)
        self.token_classes = TokenClasses(tokenizer, self.classes)
        self.acc = CorpusAccumulator(given.threshold, [n for n, _ in self.classes])
        self.names = _forward_names(self.runner)
        self.first_tokens: Counter[str] = Counter()
        self.last_tokens: Counter[str] = Counter()
        self.truncated = self.dropped = self.longest_blocked = 0

    def refuse_long(self, corpus: CorpusText | CorpusFile) -> None:
        """``--long refuse``: every text measured before the model runs (a pass of its own), the first one past
        the model's positions refused."""
        if self.limit is None:
            return
        for texts, numbers in corpus.batches(256):
            _, lost, _ = _fit(self.tokenizer, texts, self.limit)
            if lost.any():
                at = int(np.flatnonzero(lost)[0])
                raise InputError(f"--text-file {corpus.source['file']}: line {numbers[at]} has "
                                 f"{self.limit + int(lost[at])} tokens, more than the model's {self.limit} positions "
                                 "(--long truncate keeps the first ones).")

    def batch(self, chunk: list[str], lines: list[int]) -> None:
        """A mini-batch of texts: those past the model's positions cut; a text whose exact weights would be too
        large run alone, a block of query rows at a time (the same sums); the others as padded batches whose
        weights stay within ``corpuslong.BATCH_BYTES``."""
        from attnviz.capturing.corpuslong import exact_batches, exact_bytes

        cut, lost, lengths = _fit(self.tokenizer, chunk, self.limit)
        if lost.any():
            self.truncated += int((lost > 0).sum())
            self.dropped += int(lost.sum())
        alone = [k for k, n in enumerate(lengths) if exact_bytes(self.heads, int(n)) > self.blocked_from]
        rest = [k for k in range(len(chunk)) if k not in alone]
        for part in exact_batches([int(lengths[k]) for k in rest], self.heads):
            chosen = [rest[k] for k in part]
            self.forward([chunk[k] for k in chosen], [lines[k] for k in chosen], cut, False)
        for k in alone:
            self.longest_blocked = max(self.longest_blocked, int(lengths[k]))
            self.forward([chunk[k]], [lines[k]], cut, True)

    def forward(self, texts: list[str], lines: list[int], cut: bool, blocked: bool) -> None:
        """One forward pass over ``texts`` (a padded batch; or one long text, a block of rows at a time)."""
        import torch

        tokenizer, device, acc = self.tokenizer, self.device, self.acc
        try:
            batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=cut,
                              max_length=self.limit if cut else None)
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"{self.where}: its tokenizer cannot encode the texts ({_reason(exc)}).") from None
        inputs = {k: v.to(device) for k, v in batch.items() if k in self.names or k == "input_ids"}
        ids = inputs["input_ids"]
        real = batch["attention_mask"].to(device).bool() if "attention_mask" in batch else \
            torch.ones_like(ids, dtype=torch.bool)
        _ends(tokenizer, ids, real, self.first_tokens, self.last_tokens)
        if blocked:
            acc.begin_blocked(real, self.token_classes.masks(ids), self.distance_budget)
        else:
            acc.begin(real, self.token_classes.masks(ids))
        span = f"line {lines[0]}" if len(lines) == 1 else f"the texts of lines {lines[0]}..{lines[-1]}"
        run_forward(self.runner, inputs, where=self.where, smaller="a smaller --batch-size", failed_on=span)
        if blocked:
            acc.end_blocked()
        else:
            acc.end()

    def metadata(self, corpus: CorpusText | CorpusFile, describe: dict[str, Any]) -> dict[str, Any]:
        """The corpus file's metadata: the model (``describe``: the capture's description of it), the settings
        the statistics depend on, and what was counted."""
        from attnviz.capturing.folder import recorded_name

        model, tokenizer = self.model, self.tokenizer
        return {
            # the model's name for titles (capturing.folder.model_name: a folder's name, a hub id); outside
            # corpus.model, which merges compare: shards of one model read from two paths still add up
            "model_name": recorded_name(model),
            "model_type": describe.get("model_type"), "transformers": describe.get("transformers"),
            "torch": describe.get("torch"), "dtype": describe.get("dtype"),
            "corpus": {
                "model": model_identity(model), "tokenizer": tokenizer_identity(tokenizer),
                "settings": settings(self.acc.sink_threshold, self.classes, self.limit, str(self.options.long)),
                "texts": corpus.count, "empty_lines": corpus.empty, "truncated_texts": self.truncated,
                "dropped_tokens": self.dropped, "blocked_texts": self.acc.blocked_texts,
                "distance_texts": corpus.count - self.acc.distance_left_out, "sources": [corpus.source],
                "first_tokens": dict(self.first_tokens.most_common()),
                "last_tokens": dict(self.last_tokens.most_common()),
            },
        }

    def warnings(self, total: int) -> list[str]:
        """Texts cut to the model's positions; long texts left out of the head distances."""
        warnings = []
        if self.truncated:
            warnings.append(f"{self.truncated} text(s) were longer than the model's {self.limit} positions: their "
                            f"first {self.limit} tokens were used ({self.dropped} tokens dropped)")
        left_out = self.acc.distance_left_out
        if left_out:
            from attnviz.sizes import size_str

            warnings.append(f"{left_out} long text(s) (up to {self.longest_blocked} tokens) were left out of the "
                            f"head distances: every layer's q and k would take more than "
                            f"{size_str(self.distance_budget)}; the distances are over {total - left_out} of "
                            f"{total} texts (the other statistics over all of them)")
        return warnings


def settings(sink_threshold: float, classes: Sequence[tuple[str, re.Pattern[str]]], limit: int | None,
             long: str) -> dict[str, Any]:
    """What decides the statistics besides the model and the texts (files merge only when these agree)."""
    return {"sink_threshold": float(sink_threshold), "smoothing": SMOOTHING, "punctuation": list(PUNCTUATION),
            "classes": {n: p.pattern for n, p in classes}, "max_length": limit, "long": long, "padding": "right"}


def _fit(tokenizer: Any, texts: list[str], limit: int | None) -> tuple[bool, np.ndarray, np.ndarray]:
    """Whether the batch must be cut to ``limit`` tokens, how many tokens each text loses, and each text's
    tokens as it will run (cut to the limit)."""
    lengths = np.array([len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]], dtype=np.int64)
    if limit is None:
        return False, np.zeros(len(texts), dtype=np.int64), lengths
    lost = np.maximum(lengths - limit, 0)
    return bool(lost.any()), lost, np.minimum(lengths, limit)


def _ends(tokenizer: Any, ids: Any, real: Any, first: Counter[str], last: Counter[str]) -> None:
    """Count the tokens standing first and last in each text (what ``first`` and ``last`` measure)."""
    import torch

    anything = real.any(-1)
    lo, hi = real_ends_torch(real)
    rows = torch.arange(ids.shape[0], device=ids.device)
    for name, where, counter in (("first", lo, first), ("last", hi, last)):
        del name
        chosen = ids[rows, where][anything].tolist()
        counter.update(str(t) for t in tokenizer.convert_ids_to_tokens(chosen))


def _forward_names(model: Any) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return {"input_ids", "attention_mask"}


def _reason(exc: BaseException) -> str:
    from attnviz.quoting import reason

    return reason(exc)


__all__ = ["CorpusAccumulator", "CorpusFile", "CorpusText", "TokenClasses", "capture_corpus", "compile_classes",
           "read_corpus_text"]

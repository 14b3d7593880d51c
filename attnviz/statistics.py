"""The one table of attention statistics: each statistic's name, the header the tables print, its formula, which
rows count and where it is reported. Every list of statistics (``inspection.heads.HEAD_STATS``,
``summarystats.PER_ROW``, ``inspection.summary.HEAD_FIELDS``, ``corpusfile.CORPUS_STATS``, the tables'
``COLUMNS``, what ``inspect --sort`` takes: ``sort_key``) is derived from it; ``attnviz.rowmath`` holds the
arithmetic they share (the masked softmax, the entropy of a row, the first and last real position, the row rules
below), NumPy and torch side by side. Standard library only: the command line reads it without loading NumPy.

Notation, for one head and one batch entry (one text): ``A[i, j]`` the weight of query row ``i`` on key ``j``
(a masked weight is 0; with gpt-oss's sinks a row sums to less than 1); ``pos(i)`` row i's position among the
keys (``i`` plus the cache's length before it; ``i`` in a corpus); ``f`` and ``l`` the first and last real
(not padding) position; ``n_i`` the keys row i may attend. A row *counts* when it is real (its own position is
a real key; every row of a cross attention) and may attend some key; the row rules (``ROWS``) narrow that.

Where each is reported (``FACES``): ``weights``, ``inspect``'s head statistics of exact weights (means over the
counted rows of every batch entry, ``attnviz.inspection.heads``); ``summary``, the head table of a summary
capture (the same means, from the per-row arrays ``attnviz.summarystats`` defines, ``attnviz.inspection.summary``);
``corpus``, a corpus file (per text the mean over the rule's rows, then the mean over texts,
``attnviz.inspection.corpus``). A statistic of several faces means the same in each: ``tests/test_statistics.py``
runs every path on the same q and k and checks each statistic they share by the rule below.

===================  ============  =========================================================  ============
name                 rows          per row                                                    where
===================  ============  =========================================================  ============
entropy              counted       -sum_j A_ij log A_ij (nats; 0 log 0 = 0); Zhai et al. 2023  all three
entropy_norm         several       entropy / log n_i (1: uniform)                              weights, summary
distance             counted       sum_j A_ij |pos(i) - j|                                     weights, summary
diagonal             counted       A[i, pos(i)] (Clark et al.'s "self")                        all three
previous             later         A[i, pos(i) - 1]                                            all three
first                later         A[i, f] (the attention sink)                                all three
last                 counted       A[i, l]                                                     all three
max                  counted       max_j A_ij (Voita et al. 2019's confidence)                 all three
induction, duplicate repeated      weight after / on the earlier occurrences of i's token      weights
sink_mass            counted       sum of A_ij over the first S real keys (``--sinks``)        summary
local_mass           counted       sum of A_ij over pos(i) - W < j <= pos(i) (``--local``)     summary
total                counted       sum_j A_ij (1, or less with sinks)                          summary
retrieval            decode        Wu et al. 2024's retrieval score                            summary
punctuation          counted       the weight on tokens "." and ","                            corpus
next                 earlier       A[i, i + 1]                                                 corpus
entropy_uniform      counted       log n_i                                                     corpus
first_row_entropy    first row     the entropy of row f                                        corpus
top_previous (next)  later         1 where row i's largest weight is on i - 1 (i + 1)          corpus
sink_rate            sees first    1 where alpha, the mean A[i, f], passes epsilon: per text   corpus
===================  ============  =========================================================  ============

``inspect``'s head means keep a value where no row is ``later`` (a one-token input): ``first`` the mean over the
counted rows, ``previous`` 0; a corpus leaves such a text out of those statistics' means (``texts`` counts it).

**Tags.** Every head table has a ``tag`` column: the words of the rules in ``TAGS`` a head passes, in that
order, joined by commas (the JSON's ``tag``; ``tags`` holds the rules and how many heads earn each, per layer).
A rule reads one value per head and compares it with its threshold:

===============  ===================================================  =========  ================================
tag              reads                                                passes     where
===============  ===================================================  =========  ================================
sink             sink_rate: the share of texts in which the head's    >= 0.5     all three
                 alpha (Gu et al.'s mean weight on the first token
                 over every row that sees it) exceeds epsilon = 0.3;
                 not a previous-token, diagonal or broad head
previous-token   previous                                             >= 0.5     all three
diagonal         diagonal                                             >= 0.5     all three
last-token       last                                                 >= 0.5     all three
local            local_mass, with W at most a quarter of the keys;    >= 0.5     summary
                 not a previous-token, diagonal or broad head
punctuation      punctuation                                          >= 0.5     corpus
NAME             class:NAME (``--token-class NAME=REGEX``)            >= 0.5     corpus
retrieval        retrieval (with ``--needle``)                        > 0.1      summary
induction        induction (the larger of the two, over >= 5 rows)    >= 0.5     weights (with the tokens)
duplicate-token  duplicate                                            >= 0.5     weights (with the tokens)
broad            entropy_norm (a corpus: H over uniform), no other    >= 0.9     all three
                 pattern tag
===============  ===================================================  =========  ================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WEIGHTS, SUMMARY, CORPUS = "weights", "summary", "corpus"
#: where a statistic is reported
FACES = {WEIGHTS: "inspect's head statistics of exact weights (attnviz.inspection.heads)",
         SUMMARY: "a summary capture's head table (attnviz.inspection.summary)",
         CORPUS: "a corpus file's per-text means (attnviz.corpusfile)"}

#: which query rows a statistic is a mean over (each a subset of the counted rows: real, attending some key)
ROWS = {
    "counted": "every real row that may attend some key",
    "later": "the counted rows after the first real position (i > f)",
    "earlier": "the counted rows before the last real position (i < l)",
    "first row": "the first real row alone (i = f)",
    "several": "the counted rows that may attend more than one key",
    "sees first": "the counted rows that may see the first real key, its own row included",
    "repeated": "the counted rows whose token occurred earlier in the sequence",
    "decode": "every decode step of generate(), the prompt's last row included",
}
#: the rules ``attnviz.rowmath.row_rule`` draws from positions alone
POSITIONAL = ("counted", "later", "earlier", "first row")


@dataclass(frozen=True)
class Statistic:
    """One statistic: its ``name`` (the JSON's key, ``--sort``'s word, the file's), the ``header`` of its table
    column, its ``formula`` per row, the ``rows`` it is a mean over (a key of ``ROWS``), the ``faces`` that report
    it, whether a summary records it per query row (``recorded``: ``summarystats.PER_ROW``) and where it
    comes from."""

    name: str
    header: str
    formula: str
    rows: str
    faces: tuple[str, ...]
    recorded: bool = False
    source: str = ""


_ALL = (WEIGHTS, SUMMARY, CORPUS)
_HEADS = (WEIGHTS, SUMMARY)

#: the table, in the order the head tables show their columns (``inspect`` first, then a summary's, then a
#: corpus's own)
STATISTICS = (
    Statistic("entropy", "H", "-sum_j A_ij log A_ij (nats; 0 log 0 = 0)", "counted", _ALL, True,
              "Zhai et al. 2023; Clark et al. 2019, Figure 4"),
    Statistic("entropy_norm", "H/ln n", "entropy / log n_i, n_i the keys row i may attend (1: uniform)", "several",
              _HEADS),
    Statistic("distance", "dist", "sum_j A_ij |pos(i) - j|", "counted", _HEADS, True),
    Statistic("diagonal", "diag", "A[i, pos(i)]: the token itself", "counted", _ALL, True, "Clark et al. 2019"),
    Statistic("previous", "prev", "A[i, pos(i) - 1] (0 where there is no such key)", "later", _ALL, True,
              "Clark et al. 2019"),
    Statistic("first", "first", "A[i, f]: the first real key (the attention sink)", "later", _ALL, True,
              "Clark et al. 2019 ([CLS]); Xiao et al. 2023"),
    Statistic("last", "last", "A[i, l]: the last real key", "counted", _ALL, True, "Clark et al. 2019 ([SEP])"),
    Statistic("max", "max", "max_j A_ij (the head's confidence)", "counted", _ALL, True, "Voita et al. 2019"),
    Statistic("induction", "ind", "the weight on the tokens after the earlier occurrences of row i's token",
              "repeated", (WEIGHTS,), source="Olsson et al. 2022"),
    Statistic("duplicate", "dup", "the weight on the earlier occurrences of row i's token", "repeated", (WEIGHTS,),
              source="Elhage et al. 2021"),
    Statistic("sink_mass", "sink", "sum of A_ij over the first S real keys (--sinks S)", "counted", (SUMMARY,), True,
              "StreamingLLM (Xiao et al. 2023)"),
    Statistic("local_mass", "local", "sum of A_ij over pos(i) - W < j <= pos(i) (--local W)", "counted", (SUMMARY,),
              True, "MInference's A-shape"),
    Statistic("total", "total", "sum_j A_ij (1, or less with sinks)", "counted", (SUMMARY,), True),
    Statistic("retrieval", "retrieval", "distinct needle positions copied over the needle's length", "decode",
              (SUMMARY,), source="Wu et al. 2024"),
    Statistic("punctuation", "punct", 'the weight on the tokens "." and ","', "counted", (CORPUS,),
              source="Clark et al. 2019"),
    Statistic("next", "next", "A[i, i + 1]", "earlier", (CORPUS,), source="Clark et al. 2019"),
    Statistic("entropy_uniform", "uniform", "log n_i: the entropy of uniform attention over the same keys", "counted",
              (CORPUS,), source="Clark et al. 2019, Figure 4"),
    Statistic("first_row_entropy", "H(first row)", "the entropy of row f", "first row", (CORPUS,),
              source="Clark et al. 2019, Figure 4 ([CLS])"),
    Statistic("top_previous", "top prev", "1 where row i's largest weight is on i - 1 (ties: the lower key)", "later",
              (CORPUS,), source="Voita et al. 2019"),
    Statistic("top_next", "top next", "1 where row i's largest weight is on i + 1 (ties: the lower key)", "earlier",
              (CORPUS,), source="Voita et al. 2019"),
    Statistic("sink_rate", "sink rate", "1 where alpha, the mean A[i, f] over its rows, passes epsilon (per text, "
              "not per row)", "sees first", (CORPUS,), source="Gu et al. 2024"),
)
BY_NAME = {s.name: s for s in STATISTICS}
#: names a statistic had before, as files written then hold them (a corpus file's ``statistics``)
RENAMED = {"sink": "sink_rate"}


def names(face: str) -> tuple[str, ...]:
    """The statistics ``face`` reports, in the table's order."""
    return tuple(s.name for s in STATISTICS if face in s.faces)


def columns(face: str) -> dict[str, str]:
    """``{name: header}`` of the statistics ``face`` reports, in the table's order."""
    return {s.name: s.header for s in STATISTICS if face in s.faces}


def recorded() -> tuple[str, ...]:
    """The statistics a summary records per query row (``attnviz.summarystats.PER_ROW``)."""
    return tuple(s.name for s in STATISTICS if s.recorded)


def current_name(name: str) -> str:
    """A statistic's name today, given the name a file written before may hold."""
    return RENAMED.get(name, name)


#: other words ``--sort`` takes for a statistic: Clark et al.'s name of the diagonal
ALIASES = {"self": "diagonal"}
#: each face's head table and what a file of it holds, for ``--sort``'s messages
TABLES = {WEIGHTS: ("the head statistics of exact weights (a capture without --summary, or weights a model saved)",
                    "holds weights"),
          SUMMARY: ("a summary capture's head table (attnviz capture --summary)", "holds summaries"),
          CORPUS: ("a corpus file's head table (attnviz capture --corpus)", "is a corpus file")}


def _word(text: str) -> str:
    """A word of ``--sort`` as it is looked up: any case, ``_`` or ``-`` for a space (``top prev``, ``top-prev``)."""
    return "_".join(text.strip().lower().replace("-", " ").replace("_", " ").split())


def sort_words(face: str) -> dict[str, str]:
    """Every word ``--sort`` takes for a statistic ``face`` reports (as ``_word`` spells it), with the statistic's
    name: the name itself, the header of its table column (``sink``, ``punct``, ``diag``, ``H``) and an alias
    (``self``). No word stands for two statistics in any two faces (a corpus's old ``sink``, ``RENAMED``, is not
    one: ``sink`` is a summary's ``sink_mass``)."""
    have = names(face)
    out = {_word(s.header): s.name for s in STATISTICS if s.name in have}
    out.update({_word(word): name for word, name in ALIASES.items() if name in have and _word(word) not in out})
    out.update({_word(name): name for name in have})
    return out


def sort_key(word: str, face: str, source: str, classes: tuple[str, ...] | list[str] = (),
             absent: tuple[str, ...] = ()) -> str:
    """What ``--sort WORD`` orders ``face``'s head table of ``source`` by: ``layer``, ``head``, a statistic's name
    (``sort_words``) or, on a corpus file, ``class:NAME`` for one of its token ``classes`` (``articles`` or
    ``class:articles``; a statistic's word wins over a class of the same name). A word that names none of them is
    a usage error (exit 2) naming the table it does belong to, if any, and the columns this one has (less those
    ``absent`` from it: a summary's retrieval without --needle)."""
    from attnviz.errors import UsageError

    key = _word(word)
    if key in ("layer", "head"):
        return key
    found = sort_words(face).get(key)
    if found is not None:
        return found
    if face == CORPUS:
        wanted = word.strip().removeprefix("class:")
        if wanted in classes:
            return f"class:{wanted}"
    columns = ", ".join(["layer", "head", *(s.name if _word(s.header) == s.name else f"{s.name} ({s.header})"
                                            for s in STATISTICS if face in s.faces and s.name not in absent),
                         *classes])
    elsewhere = [f for f in (WEIGHTS, SUMMARY, CORPUS) if f != face and key in sort_words(f)]
    if elsewhere:
        other = elsewhere[0]
        raise UsageError(f"--sort {word}: {sort_words(other)[key]}, a column of {TABLES[other][0]}; {source} "
                         f"{TABLES[face][1]}, whose table has {columns}.")
    import difflib

    close = difflib.get_close_matches(key, [*sort_words(face), *classes], n=1)
    guess = f" (did you mean {close[0]}?)" if close else ""
    raise UsageError(f"--sort {word}: not a column of {source}{guess}; its table has {columns}.")



def check_stat(columns: Any, stat: str, what: str, hints: dict[str, str] | None = None) -> None:
    """``--stat STAT`` must name a column of the file's head table (``columns``): a usage error (exit 2) naming
    those it has otherwise; ``hints``, what would give a column the file could have (retrieval: --needle)."""
    if stat in columns:
        return
    from attnviz.errors import UsageError

    hint = (hints or {}).get(stat)
    raise UsageError(f"--stat {stat}: {hint + '; ' if hint else ''}{what}'s head table has {', '.join(columns)}.")

#: Gu et al. 2024's epsilon: a head whose mean weight on the first token (alpha) passes it is a sink in that text
SINK_EPSILON = 0.3
#: a pattern "dominates" a head when it takes at least half its weight on average
DOMINATES = 0.5


@dataclass(frozen=True)
class TagRule:
    """A tag a head earns in the head tables: the word ``tag``, the per-head value it ``reads`` (a statistic's name,
    or ``class:`` for every token class of a corpus), the ``threshold`` that value must reach (``strict``: pass),
    the ``faces`` that tag it, the tags that take precedence over it (``unless``; ``alone``: every other tag) and the
    ``rule`` in words (the tables' notes, the JSON and the docs say it)."""

    tag: str
    reads: str
    threshold: float
    rule: str
    faces: tuple[str, ...]
    strict: bool = False
    unless: tuple[str, ...] = ()
    alone: bool = False
    source: str = ""
    #: what the short form (``brief``) adds to its comparison
    note: str = ""

    def passes(self, value: float) -> bool:
        return value > self.threshold if self.strict else value >= self.threshold

    def brief(self, face: str) -> str:
        """The rule in a few words, in the table's headers: ``prev >= 0.5``."""
        if self.reads in BY_NAME:
            header = BY_NAME[self.reads].header
        else:
            header = self.reads.removeprefix("class:")
        if self.reads == "entropy_norm" and face == CORPUS:
            header = "H/uniform"
        return (f"{self.tag} = {header} {'>' if self.strict else '>='} {self.threshold:g}"
                + (f" {self.note}" if self.note else ""))


#: the tags, in the order a head's tags are written (the module docstring's table)
TAGS = (
    TagRule("sink", "sink_rate", DOMINATES, f"a sink in at least half its texts: alpha, its mean weight on the first "
            f"token over every real row that sees it, above {SINK_EPSILON:g}; not a previous-token, diagonal or broad "
            "head (in a short text the first token is the previous one of the second, and a causal row of i tokens "
            "gives it 1/i even when uniform)", _ALL, unless=("previous-token", "diagonal", "broad"),
            source="Gu et al. 2024 (alpha > epsilon)",
            note=f"(the share of texts whose alpha, the mean weight on the first token, passes {SINK_EPSILON:g}; "
                 "not previous-token, diagonal or broad)"),
    TagRule("previous-token", "previous", DOMINATES, "at least half its weight on the previous token", _ALL,
            source="Clark et al. 2019; Voita et al. 2019"),
    TagRule("diagonal", "diagonal", DOMINATES, "at least half its weight on the token itself", _ALL,
            source="Clark et al. 2019"),
    TagRule("last-token", "last", DOMINATES, "at least half its weight on the last real token", _ALL,
            source="Clark et al. 2019 ([SEP])"),
    TagRule("local", "local_mass", DOMINATES, "at least half its weight on the W keys up to the query (--local W; "
            "only where W is at most a quarter of the keys; not a previous-token, diagonal or broad head: a uniform "
            "causal row of i <= W tokens is all local)", (SUMMARY,), unless=("previous-token", "diagonal", "broad"),
            source="MInference's A-shape",
            note="(W at most a quarter of the keys; not previous-token, diagonal or broad)"),
    TagRule("punctuation", "punctuation", DOMINATES, 'at least half its weight on "." and ","', (CORPUS,),
            source="Clark et al. 2019"),
    TagRule("NAME", "class:", DOMINATES, "at least half its weight on the tokens of the class NAME (--token-class)",
            (CORPUS,), note="(its weight on the class's tokens)"),
    TagRule("retrieval", "retrieval", 0.1, "a retrieval score above 0.1 (--needle)", (SUMMARY,), strict=True,
            source="Wu et al. 2024", note="(Wu et al. 2024)"),
    TagRule("induction", "induction", DOMINATES, "at least half its weight on the token after an earlier occurrence "
            "of the query's token, over at least 5 such rows (the larger of induction and duplicate-token)",
            (WEIGHTS,), source="Olsson et al. 2022", note="over 5 rows or more, the larger of ind and dup"),
    TagRule("duplicate-token", "duplicate", DOMINATES, "at least half its weight on the earlier occurrences of the "
            "query's token, over at least 5 such rows", (WEIGHTS,), source="Elhage et al. 2021",
            note="over 5 rows or more"),
    TagRule("broad", "entropy_norm", 0.9, "entropy at least 0.9 of uniform attention's (H/ln n; a corpus: H over "
            "uniform), and no other tag", _ALL, alone=True, note="and no other tag"),
)
TAG_BY_NAME = {t.tag: t for t in TAGS}


def tag_rules(face: str, classes: tuple[str, ...] | list[str] = (), epsilon: float | None = None) -> list[TagRule]:
    """The tags of ``face``, in order, a corpus's token class rule once per class (its word the class's name);
    ``epsilon``: the sink's, where it is not ``SINK_EPSILON`` (a corpus captured with ``--sink-threshold``)."""
    from dataclasses import replace

    out: list[TagRule] = []
    for rule in TAGS:
        if face not in rule.faces:
            continue
        if rule.tag == "sink" and epsilon is not None and float(epsilon) != SINK_EPSILON:
            said = f"{SINK_EPSILON:g}"
            out.append(replace(rule, rule=rule.rule.replace(said, f"{float(epsilon):g}"),
                               note=rule.note.replace(said, f"{float(epsilon):g}")))
        elif rule.reads == "class:":
            out.extend(replace(rule, tag=name, reads=f"class:{name}", rule=rule.rule.replace("NAME", name))
                       for name in classes)
        else:
            out.append(rule)
    return out

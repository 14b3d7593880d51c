"""``attnviz capture``'s options, declared once (``attnviz.fields.option``): what to run (``CaptureRun``), the
summary's settings (``SummaryOptions``), the corpus's (``CorpusOptions``) and the file and lines it writes
(``CaptureOutput``), together ``CaptureSettings``, whose ``check`` is the one place their conflicts are refused.
The command line builds them from its parameters (``attnviz.cli.options.parameters`` and ``build``), the Python
API (``attnviz.capture``, ``attnviz.corpus``) from its keywords; ``capturing.folder.capture_folder`` and
``capturing.corpus.run_corpus`` take them whole. The standard library only: ``attnviz capture --help`` and its
usage errors load no NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnviz.choices import LONG_TEXTS, MODEL_DEVICES, MODEL_DTYPES, WEIGHT_DTYPES
from attnviz.errors import UsageError
from attnviz.fields import option

SUMMARY = "Summary (long inputs)"
CORPUS = "Corpus (--corpus)"
MODEL = "Model (capture)"
LONG_HELP = ("texts past the model's positions: refuse (stop before the model runs, naming the text; the default "
             "of a plain capture, where a rotary model past its max_position_embeddings only warns unless --long "
             "refuse is given) or truncate (keep their first tokens and say how many were dropped; the default of "
             "--corpus)")
#: a corpus run's defaults (``--batch-size``, ``--sink-threshold``): None on the command line says "not given",
#: which an exact capture refuses
BATCH_SIZE = 8
SINK_THRESHOLD = 0.3


@dataclass(frozen=True)
class CaptureRun:
    """What to run: the texts, where and how the model runs, which sites and what each keeps."""

    text: list[str] | None = option(None, "a text to run the model on; repeat for a padded batch; @FILE: a whole "
                                    "file as one text (a long document, newlines kept)", metavar="TEXT")
    text_file: str | None = option(None, "more texts, one a line", metavar="FILE")
    device: str = option("auto", "where the model runs: cuda when a GPU is visible (auto)", choices=MODEL_DEVICES)
    dtype: str = option("auto", "the model's dtype (auto: as saved)", choices=MODEL_DTYPES)
    layers: str | None = option(None, "keep only these sites (0-based; negative from the end)", metavar="N,N,...")
    generate: int = option(0, "generate N tokens (greedy); each site's steps are stitched into one map", min=0,
                           metavar="N")
    no_weights: bool = option(False, "keep q, k, v and masks only (long inputs: no [L, L] maps)")
    no_qkv: bool = option(False, "keep the weights and masks only, not q, k and v (a smaller file; --check and "
                          "inspect --weigh-by value-norms read them)")
    weights_dtype: str = option("float32", "store the weights as this (reduced where the model runs)",
                                choices=WEIGHT_DTYPES)
    target: str | None = option(None, "also save d(logit of TARGET at the last position)/d(weights) of every site "
                                "as SITE.grad (next: the top prediction)", metavar="next|TOKEN|ID")
    decoder_text: str | None = option(None, "an encoder-decoder's decoder input (default: its start token)",
                                      metavar="TEXT")
    check: bool = option(False, "recompute every site from its q, k, mask and settings and report the largest "
                         "difference (exit 3 past --atol)")
    atol: float | None = option(None, "tolerance of --check (default by the model's dtype: 1e-5 float32, 1e-3 "
                                "float16, 8e-3 bfloat16)", min=0.0)
    max_file: str | None = option(None, "refuse, before the model runs, an exact capture whose weights would take "
                                  "more than SIZE (default 4G; 0: no limit)", metavar="SIZE")
    truncate: bool = option(False, "the same as --long truncate", hidden=True)
    long: str | None = option(None, LONG_HELP, metavar="truncate|refuse", choices=LONG_TEXTS)

    @property
    def texts(self) -> list[str]:
        """``--text`` as given (none: an empty list)."""
        return list(self.text or [])

    @property
    def sites(self) -> list[int] | None:
        """``--layers`` as site numbers; None: every site."""
        return parse_layers(self.layers)

    @property
    def max_file_bytes(self) -> int | None:
        """``--max-file`` in bytes (0: no limit); None: the default."""
        return parse_max_file(self.max_file)


@dataclass(frozen=True)
class SummaryOptions:
    """``--summary`` and its settings (``attnviz.summarystats.SummarySettings`` once resolved)."""

    summary: bool = option(False, "long inputs: record each site's summary instead of its weights, computed where "
                           "the model runs a block of query rows at a time (per row: entropy, largest weight and its "
                           "key, sink, local and total mass; per key: received attention; a pooled map; the rows of "
                           "--rows)", panel=SUMMARY)
    sinks: int | None = option(None, "with --summary: the sink mass is the weight on the first S real keys "
                               "(default 4)", panel=SUMMARY, min=1, metavar="S")
    local: int | None = option(None, "with --summary: the local mass is the weight on the keys i - W < j <= i "
                               "(default 64)", panel=SUMMARY, min=1, metavar="W")
    pool: int | None = option(None, "with --summary: pooled maps of at most P x P blocks (means and maxima; default "
                              "256)", panel=SUMMARY, min=1, metavar="P")
    rows: str | None = option(None, "with --summary: query rows kept whole: last (the default), 0,512,-1, ranges "
                              "100:200, none", panel=SUMMARY, metavar="ROWS")

    def settings(self) -> Any:
        """The summary's settings (``attnviz.summarystats.SummarySettings``, each default filled in; ``--rows
        none``: no row kept), or None without ``--summary``. Loads NumPy: called once the options are checked."""
        if not self.summary:
            return None
        from attnviz.summarystats import DEFAULT_LOCAL, DEFAULT_POOL, DEFAULT_SINKS, SummarySettings

        rows = "last" if self.rows is None else self.rows
        return SummarySettings(DEFAULT_SINKS if self.sinks is None else self.sinks,
                               DEFAULT_LOCAL if self.local is None else self.local,
                               DEFAULT_POOL if self.pool is None else self.pool,
                               None if rows.strip().lower() == "none" else rows)


@dataclass(frozen=True)
class CorpusOptions:
    """``--corpus`` (per-head statistics over every line of a text file) and its settings; None where the
    command line was not given one (``texts_per_batch`` and ``threshold`` fill in the defaults)."""

    corpus: bool = option(False, "per-head statistics over every line of --text-file instead of the weights (a "
                          "corpus file: attnviz inspect reads it, attnviz merge adds shards)", panel=CORPUS)
    batch_size: int | None = option(None, "texts per forward pass (8)", panel=CORPUS, min=1, metavar="N")
    shard: str | None = option(None, "every COUNT-th line from INDEX on (auto: from a Slurm array or a Kubernetes "
                               "Indexed Job)", panel=CORPUS, metavar="INDEX/COUNT|auto")
    token_class: list[str] | None = option(None, "each head's weight on the tokens whose text the regex matches "
                                           "whole; repeatable", panel=CORPUS, metavar="NAME=REGEX")
    sink_threshold: float | None = option(None, "a head is a sink in a text when its mean weight on the first "
                                          "token passes this (0.3)", panel=CORPUS, min=0.0, max=1.0)
    #: the Python API's (``attnviz.corpus``): see ``capturing.corpus.run_corpus``
    blocked_from: int | None = option(None, "a text whose exact weights would take more bytes runs alone, a block "
                                      "of query rows at a time", cli=False)
    distance_budget: int | None = option(None, "the bytes a long text's q and k may take for the head distances",
                                         cli=False)

    @property
    def texts_per_batch(self) -> int:
        return BATCH_SIZE if self.batch_size is None else self.batch_size

    @property
    def threshold(self) -> float:
        return SINK_THRESHOLD if self.sink_threshold is None else self.sink_threshold

    @property
    def classes(self) -> tuple[str, ...]:
        """``--token-class`` as given, ``NAME=REGEX`` each."""
        return tuple(self.token_class or ())

    def check(self) -> None:
        """The Python API's byte budgets: whole numbers, 0 or more (exit 2)."""
        for name, value in (("blocked_from", self.blocked_from), ("distance_budget", self.distance_budget)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UsageError(f"{name}={value!r}; a number of bytes, 0 or more.")


@dataclass(frozen=True)
class CaptureOutput:
    """The file a capture writes and what it prints."""

    output: str | None = option(None, "the capture file: .safetensors (or .npz)", flag="--output", short="-o",
                                metavar="FILE")
    json: bool = option(False, "print a JSON object instead of the table")
    quiet: bool = option(False, "print no progress bar and no informational lines; warnings and errors still go to "
                         "stderr", short="-q")


@dataclass(frozen=True)
class CaptureSettings:
    """Every option of ``attnviz capture MODEL_DIR``: ``check()`` refuses their conflicts before anything is read
    (exit 2), in the command line's words (the Python API says them in its own: ``attnviz.api.wording``)."""

    model: str = option("", "the model folder (MODEL_DIR)", cli=False)
    run: CaptureRun = field(default_factory=CaptureRun)
    summary: SummaryOptions = field(default_factory=SummaryOptions)
    corpus: CorpusOptions = field(default_factory=CorpusOptions)
    output: CaptureOutput = field(default_factory=CaptureOutput)

    @property
    def long(self) -> str | None:
        """What becomes of texts past the model's positions: ``--long``, ``--truncate`` (its older name), else
        each kind's default: ``truncate`` for a corpus, None for a capture (``capturing.folder.fit_positions``)."""
        chosen = long_choice(self.run.long, self.run.truncate)
        if chosen is None and self.corpus.corpus:
            return "truncate"
        return chosen

    def model_files(self) -> list[Path]:
        """The model folder's own files (its weights, its config), which ``-o`` may not replace."""
        folder = Path(self.model)
        return list(folder.iterdir()) if folder.is_dir() else []

    def check(self) -> None:
        """Every conflict among the options, before the model or a text is read (exit 2)."""
        long_choice(self.run.long, self.run.truncate)
        if self.corpus.corpus:
            self._check_corpus()
            return
        for flag, value in (("--batch-size", self.corpus.batch_size), ("--shard", self.corpus.shard),
                            ("--token-class", self.corpus.token_class),
                            ("--sink-threshold", self.corpus.sink_threshold)):
            if value not in (None, (), []):
                raise UsageError(f"{flag} goes with --corpus (per-head statistics over a text file).")
        self.check_summary()
        parse_max_file(self.run.max_file)
        output = self.output.output
        if output is None:
            raise UsageError("capture: name the file to write with -o FILE.safetensors (or .npz).")
        if not output.lower().endswith((".safetensors", ".npz")):
            raise UsageError(f"-o {output}: a capture is written as .safetensors or .npz.")
        self.check_weights()
        parse_layers(self.run.layers)

    def check_summary(self) -> None:
        """``--summary``'s settings go with it, and a summary records no weights (no ``--no-weights``,
        ``--target`` or ``--check``)."""
        s, run = self.summary, self.run
        if not s.summary:
            for flag, value in (("--sinks", s.sinks), ("--local", s.local), ("--pool", s.pool), ("--rows", s.rows)):
                if value is not None:
                    raise UsageError(f"{flag} goes with --summary (a summary capture's settings).")
            return
        for flag, given in (("--no-weights", run.no_weights), ("--target", run.target is not None),
                            ("--check", run.check)):
            if given:
                raise UsageError(f"--summary records no weights: drop {flag}.")
        if run.no_qkv:
            raise UsageError("--summary keeps no q, k and v anyway: drop --no-qkv.")
        s.settings()  # the spelling of --rows

    def check_weights(self) -> None:
        """``--target`` and ``--check`` read the weights ``--no-weights`` leaves out; ``--check`` the q and k
        ``--no-qkv`` leaves out, and the two together would keep nothing but the masks."""
        run = self.run
        if run.no_weights and (run.target is not None or run.check):
            raise UsageError(f"{'--target' if run.target else '--check'} needs the weights; drop --no-weights.")
        if run.no_qkv and run.no_weights:
            raise UsageError("--no-qkv and --no-weights would keep the masks alone; drop one.")
        if run.no_qkv and run.check:
            raise UsageError("--check recomputes each site from its q and k; drop --no-qkv.")

    def _check_corpus(self) -> None:
        """What a corpus run does not take, and the texts and file it needs."""
        run, s = self.run, self.summary
        for flag, given in (("--layers", run.layers), ("--generate", run.generate), ("--no-weights", run.no_weights),
                            ("--no-qkv", run.no_qkv),
                            ("--weights-dtype", run.weights_dtype != "float32"), ("--target", run.target),
                            ("--decoder-text", run.decoder_text), ("--check", run.check),
                            ("--summary", s.summary), ("--max-file", run.max_file),
                            ("--sinks", s.sinks is not None), ("--local", s.local is not None),
                            ("--pool", s.pool is not None), ("--rows", s.rows is not None)):
            if given:
                raise UsageError(f"{flag}: a corpus run (--corpus) keeps per-head statistics, not the weights of one "
                                 "batch; drop it.")
        if run.text or run.text_file is None:
            raise UsageError("--corpus reads its texts from --text-file FILE (one text a line), not --text.")
        output = self.output.output
        if output is None:
            raise UsageError("capture --corpus: name the file to write with -o FILE.safetensors.")
        if not output.lower().endswith(".safetensors"):
            raise UsageError(f"-o {output}: a corpus file is written as .safetensors.")
        self.corpus.check()


@dataclass(frozen=True)
class ModelInput:
    """``--model`` on the commands that read weights (``inspect``, ``rollout``, ``view``): a local model folder
    captured on ``--text`` first (``capturing.folder.capture_folder``, a summary where the weights would not fit),
    then read."""

    model: str | None = option(None, "capture a local model folder on --text first (attnviz capture), then read "
                               "that", panel=MODEL, metavar="MODEL_DIR")
    text: list[str] | None = option(None, "with --model: a text; repeat for a batch", panel=MODEL, metavar="TEXT")
    text_file: str | None = option(None, "with --model: texts, one a line", panel=MODEL, metavar="FILE")
    model_device: str = option("auto", "with --model: where it runs", panel=MODEL, choices=MODEL_DEVICES)
    model_long: str | None = option(None, "with --model: texts past the model's positions: refuse (the default: "
                                    "stop before the model runs; a rotary model past its max_position_embeddings "
                                    "only warns unless --long refuse is given) or truncate (keep their first tokens "
                                    "and say how many were dropped)", panel=MODEL, flag="--long",
                                    metavar="truncate|refuse", choices=LONG_TEXTS)
    truncate: bool = option(False, "with --model: the same as --long truncate", panel=MODEL, hidden=True)


def long_choice(long: str | None, truncate: bool) -> str | None:
    """``--long`` with ``--truncate`` (its older name: ``--long truncate``); None when neither was given (each
    kind's default). Both, disagreeing: exit 2."""
    if not truncate:
        return long
    if long == "refuse":
        raise UsageError("--truncate is --long truncate; give one of --truncate and --long refuse.")
    return "truncate"


def parse_layers(text: str | None) -> list[int] | None:
    """``--layers 0,3,-1`` as site numbers; None: every site."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise UsageError(f"--layers {text!r}: give site numbers separated by commas (0,3,-1).") from None
    if not values:
        raise UsageError("--layers: give at least one site number.")
    return values


def parse_max_file(text: str | None) -> int | None:
    """``--max-file`` as bytes (0: no limit), or None for the default."""
    if text is None:
        return None
    if text.strip() == "0":
        return 0
    from attnviz.sizes import SIZE_UNITS

    t = text.strip().lower()
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    try:
        return int(float(number) * SIZE_UNITS[t[len(number):]])
    except (ValueError, KeyError):
        raise UsageError(f"--max-file {text!r}: expected a size such as 4G, 500M or 0 (no limit).") from None


__all__ = ["CORPUS", "MODEL", "SUMMARY", "CaptureOutput", "CaptureRun", "CaptureSettings", "CorpusOptions",
           "ModelInput", "SummaryOptions", "long_choice", "parse_layers", "parse_max_file"]

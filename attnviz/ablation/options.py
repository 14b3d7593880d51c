"""``attnviz ablate``'s options, declared once (``fields.option``); the standard library only, so that
``attnviz ablate --help`` and its usage errors load no NumPy or torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnviz.choices import MODEL_DEVICES, MODEL_DTYPES
from attnviz.errors import UsageError
from attnviz.fields import RUN, option

HEADS = "Heads restricted"
RANK = "Ranking and policies (--rank)"
KINDS = ("stream", "window", "zero", "mean")


@dataclass
class AblateOptions:
    """What ``attnviz ablate`` runs: a model folder, texts, the heads restricted and how, or ``--rank``."""

    model: str = option("", "a local model folder (a decoder language model)", cli=False)
    text: list[str] = field(default_factory=list, metadata={"cli": False})
    stream: str | None = option(None, "stream these heads: they see the first --sink and the last --recent keys "
                                "(DuoAttention's streaming heads), e.g. 18:2,7:* (LAYER:HEAD, * every head)",
                                panel=HEADS, metavar="L:H,...")
    window: str | None = option(None, "these heads see the last --recent keys only (a sliding window)", panel=HEADS,
                                metavar="L:H,...")
    zero: str | None = option(None, "these heads' outputs are zeroed (the heads removed)", panel=HEADS,
                              metavar="L:H,...")
    mean: str | None = option(None, "these heads' outputs are replaced by their mean over the prompt's rows",
                              panel=HEADS, metavar="L:H,...")
    kv_heads: bool = option(False, "the heads named are key-value heads: each restricts every query head that "
                            "shares it (a grouped-query model's KV cache is per key-value head)", panel=HEADS)
    sink: int = option(16, "a streaming head's first keys kept (DuoAttention's sink_size)", panel=HEADS, min=0)
    recent: int = option(128, "a streaming head's last keys kept (recent_size), or a window's width", panel=HEADS,
                         min=1)
    answer: str | None = option(None, "the answer whose log-probability is compared (teacher-forced after the text; "
                                "start it as the text's last line invites, e.g. ' The code is 5831.')",
                                metavar="TEXT")
    generate: int = option(0, "also generate N tokens greedily in both runs and print the answers", min=0,
                           metavar="N")
    kl_rows: int = option(16, "without --answer: the KL is the mean over the text's last N rows", min=1, metavar="N")
    rank: bool = option(False, "rank every head by what restricting it alone costs on a calibration needle suite, "
                        "then check the policy that ranking gives against random policies on held-out needles",
                        panel=RANK)
    restrict: str = option("stream", "--rank: what is done to each head (stream, window, zero, mean)", panel=RANK,
                           metavar="KIND")
    calibration: int = option(3, "--rank: calibration needles (the ranking's texts)", panel=RANK, min=1, metavar="N")
    needles: int = option(5, "--rank: held-out needles the policies are checked on", panel=RANK, min=1,
                          metavar="N")
    tokens: int = option(2000, "--rank: the needles' length in tokens", panel=RANK, min=64, metavar="N")
    share: float = option(0.25, "--rank: the share of heads the policies restrict, in (0, 1)", panel=RANK,
                          metavar="F")
    random: int = option(3, "--rank: random policies of the same share to compare with", panel=RANK, min=0,
                         metavar="N")
    seed: int = option(0, "--rank: the needle suite's seed (the held-out needles use seed + 1; random policies "
                       "seed + 100 ...)", panel=RANK, min=0)
    statistics: bool = option(True, "--rank: also capture a summary of each calibration needle for the heads' "
                              "sink, local and middle mass and retrieval scores beside the ranking "
                              "(--no-statistics: the ranking alone)", panel=RANK, flag="--statistics/--no-statistics")
    batch: int = option(4, "heads restricted per forward (entries of one batch of the same text)", panel=RUN, min=1,
                        metavar="N")
    device: str = option("auto", "where the model runs (auto: cuda when a GPU is visible)", panel=RUN,
                         metavar="auto|cpu|cuda")
    dtype: str = option("auto", "the model's dtype (auto: as saved)", panel=RUN, metavar="auto|float32|...")

    def check(self) -> None:
        """The options' conflicts, before anything is read (exit 2)."""
        named = {flag: value for flag, value in (("--stream", self.stream), ("--window", self.window),
                                                 ("--zero", self.zero), ("--mean", self.mean)) if value is not None}
        if self.device not in MODEL_DEVICES:
            raise UsageError(f"--device {self.device!r}: choose one of {', '.join(MODEL_DEVICES)}.")
        if self.dtype not in MODEL_DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: choose one of {', '.join(MODEL_DTYPES)}.")
        if self.rank:
            if named:
                raise UsageError(f"--rank restricts every head in turn; drop {', '.join(named)}.")
            if self.text or self.answer is not None:
                raise UsageError("--rank runs its own needle suite; drop --text and --answer.")
            if not 0 < self.share < 1:
                raise UsageError(f"--share {self.share:g}: a share of heads in (0, 1), e.g. 0.25.")
            if self.restrict not in KINDS:
                raise UsageError(f"--restrict {self.restrict!r}: choose one of {', '.join(KINDS)}.")
            return
        if not named:
            raise UsageError("name the heads to restrict (--stream, --window, --zero or --mean L:H,...), or rank "
                             "them all with --rank.")
        if not self.text:
            raise UsageError("--text: give the text to run the model on (TEXT, or @FILE).")

    def restricted_heads(self) -> list[tuple[str, str]]:
        """The (option, heads) given, in the order of KINDS."""
        return [(kind, value) for kind, value in (("stream", self.stream), ("window", self.window),
                                                  ("zero", self.zero), ("mean", self.mean)) if value is not None]

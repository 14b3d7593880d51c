"""``attnviz.capture(model, ...)``: the context manager around a model's run, for transformers models
(``attnviz.capturing.hf``) and Keras models (``attnviz.capturing.keras``); the file it writes is described
in ``attnviz.capturefile``."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Any

from attnviz.capturing.recorder import Recorder
from attnviz.errors import AttnvizError, OutputError, UsageError


class Capture:
    """Records every attention site of ``model`` while the block runs; the recording is a capture file.

    >>> with attnviz.capture(model, tokenizer) as rec:
    ...     model(**batch)
    >>> rec.save("run.safetensors"); attnviz.inspect(rec)

    Arguments: ``tokenizer`` (the tokens of each row go into the file), ``layers`` (site numbers to keep,
    negative from the end; None: all), ``path`` (write the file there as the capture ends, instead of a
    temporary file), ``weights=False`` (keep q, k, v and masks only: long inputs), ``weights_dtype``
    (``float32``, ``float16``, ``bfloat16``: reduced where the model runs, before the copy), ``target``
    ("next", or a token id: the gradient of that logit at the last position with respect to every
    site's weights, saved as ``SITE.grad``; the model must run with gradients enabled), ``summary`` (an
    ``attnviz.summarystats.SummarySettings``: long inputs, each site's summary instead of its weights, computed
    where the model runs a block of query rows at a time: per-row entropy, largest weight, sink, local and total
    mass; per-key received attention; a pooled map; chosen rows); ``qkv`` (keep q, k and v: by default with
    weights, not with a summary); ``corpus`` (an ``attnviz.capturing.corpus.CorpusAccumulator``: each site's
    weights go to it instead of the file, and the block may run the model many times; nothing is written);
    ``progress(done, total)`` (a transformers model: told, as its first forward runs, how many of its ``total``
    attention modules are done, a share of one while a summary sums a module's rows a block at a time). On exit
    the model is as before: its attention implementation, its configs, its hooks. The values are checked where
    they are given (``attnviz.capture``: ``capturing.options.CaptureSettings``).
    """

    def __init__(self, model: Any, tokenizer: Any = None, layers: Any = None, *,
                 path: str | os.PathLike[str] | None = None, weights: bool = True, qkv: bool | None = None,
                 weights_dtype: str = "float32", target: Any = None, summary: Any = None, corpus: Any = None,
                 progress: Any = None) -> None:
        self.summary = summary
        if summary is not None:
            weights = False
        qkv = (summary is None) if qkv is None else qkv
        self.model = model
        self.tokenizer = tokenizer
        self.layers = _layers(layers)
        self.target_path = None if path is None else Path(path)
        self.weights, self.qkv, self.weights_dtype, self.target = weights, qkv, weights_dtype, target
        self.corpus = corpus
        self.progress = progress
        if corpus is not None and (not weights or target is not None):  # capturing.corpus's own use
            raise UsageError("attnviz.capture: a corpus needs the weights and takes no target.")
        self.path: Path | None = None  # the finished file
        self.warnings: list[str] = []
        self._adapter: Any = None
        self._opened: Any = None
        self._rec: Recorder | None = None
        self._temp: Path | None = None
        self._finalizer: Any = None
        self.metadata: dict[str, Any] = {}

    # -- the block

    def __enter__(self) -> Capture:
        if self._rec is not None:
            raise UsageError("attnviz.capture: a capture records one block; open another for the next run.")
        stream = self._stream_path()
        self._rec = Recorder(stream, self.layers, _counts(self.model))
        try:
            if _is_keras(self.model):
                if self.corpus is not None:
                    raise UsageError("attnviz.capture: corpus statistics are computed for transformers models.")
                if self.summary is not None:
                    raise UsageError("attnviz.capture: summary=True captures transformers models; capture a Keras "
                                     "model's q, k and v (weights=False): inspect summarises them.")
                from attnviz.capturing.keras import KerasCapture

                self._adapter = KerasCapture(self.model, self._rec, self.weights_dtype, self.weights)
            else:
                from attnviz.capturing.hf import HFCapture, check_model

                check_model(self.model)
                self._adapter = HFCapture(self.model, self._rec, self.weights_dtype, self.weights, self.qkv,
                                          self.target, self.summary, corpus=self.corpus)
                self._adapter.progress = self.progress
            self._opened = self._adapter.opened()
            self._opened.__enter__()
        except BaseException:
            self._rec.writer.close()
            self._rec.discard_stream()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._rec is not None
        rec = self._rec
        try:
            self._opened.__exit__(exc_type, exc, tb)  # the model as before, whatever happened
            if exc_type is None:
                self._finish()
        except BaseException:
            rec.writer.close() if rec.writer.thread.is_alive() else None
            rec.discard_stream()
            self._release()
            raise
        self._release()
        if exc_type is not None:
            try:
                rec.writer.close()
            except BaseException:  # noqa: BLE001 - the block's own exception is the one to see
                pass
            rec.discard_stream()

    def _release(self) -> None:
        """What the capture held for the run: pinned buffers, the logits and graph of a target."""
        adapter = self._adapter
        if adapter is not None:
            for name in ("pool", "logits", "graph"):
                if hasattr(adapter, name):
                    setattr(adapter, name, None)
        self._adapter = None

    def _stream_path(self) -> Path:
        if self.target_path is not None:
            from attnviz.staging import hidden_file

            folder = self.target_path.parent if str(self.target_path.parent) else Path(".")
            if self.target_path.exists() and not self.target_path.is_file():
                raise OutputError(f"{self.target_path}: exists and is not a regular file; refusing to replace it.")
            try:
                fd, name = hidden_file(folder, f".{self.target_path.name[:60]}.", ".staged.safetensors")
            except OSError as exc:
                raise OutputError(f"{self.target_path}: cannot write into {folder} ({exc.strerror or exc}).") from None
            os.close(fd)
            return Path(name)
        fd, name = tempfile.mkstemp(prefix="attnviz-capture-", suffix=".safetensors")
        os.close(fd)
        return Path(name)

    def _finish(self) -> None:
        rec = self._rec
        assert rec is not None
        adapter = self._adapter
        if self.target is not None:
            logits = getattr(adapter, "logits", None)
            if logits is None:
                raise UsageError("attnviz.capture: a target needs the model's logits; run a forward pass of a model "
                                 "with a language-model head inside the block.")
            if not getattr(logits, "requires_grad", False):
                raise UsageError("attnviz.capture: a target needs gradients: run the model outside torch.no_grad().")
            adapter.gradients(logits, self.target)
        if self.corpus is not None:  # the statistics went to the accumulator: no file, the model described
            rec.writer.close()
            rec.discard_stream()
            self.metadata = dict(getattr(adapter, "describe", lambda: {})())
            return
        if not rec.run:
            if not getattr(adapter, "forwards", 1):
                raise UsageError("attnviz.capture: the model did not run inside the block; call it (or generate()) "
                                 "within the with statement.")
            raise AttnvizError("attnviz.capture: no attention site ran (the layers asked for are not in the model?).")
        self.metadata = self._metadata()
        done = rec.finish(rec.stream.path, self.metadata)
        self.metadata = rec.metadata  # as the file has it (the target's ids and positions included)
        if self.target_path is not None and self.target_path.suffix.lower() == ".npz":
            from attnviz.capturefile import convert

            try:  # written whole next to the target, then renamed into place
                convert(done, self.target_path)
            finally:
                rec.discard_stream()
            done = self.target_path
        if self.target_path is not None and done != self.target_path:
            from attnviz.staging import umask

            os.chmod(done, 0o666 & ~umask())  # as any file the user writes (the staged file was private)
            try:
                os.replace(done, self.target_path)
            except OSError as exc:
                rec.discard_stream()
                raise OutputError(f"{self.target_path}: cannot write ({exc.strerror or exc}).") from None
            done = self.target_path
        self.path = done
        if self.target_path is None:
            self._temp = done
            self._finalizer = weakref.finalize(self, _remove, str(done))
        if rec.runs:
            self.warnings.append(f"the model ran {rec.runs + 1} times inside the capture; the file holds the last run")
        note = getattr(adapter, "note", None)
        if note:
            self.warnings.append(note)
        for text in self.warnings:
            warnings.warn(text, UserWarning, stacklevel=3)

    def _metadata(self) -> dict[str, Any]:
        rec = self._rec
        assert rec is not None
        meta: dict[str, Any] = dict(getattr(self._adapter, "describe", lambda: {})())
        sites = {}
        for site in rec.sites.values():
            if site is not None and site.name in rec.run:
                sites[site.name] = {"module": site.module, "kind": site.kind, "layer": site.layer, **site.info}
        meta["sites"] = sites
        meta["kinds"] = sorted({s["kind"] for s in sites.values()})
        meta["weights_dtype"] = self.weights_dtype if self.weights else None
        if self.summary is not None:
            meta["summary"] = self.summary.as_metadata()
        dense = int(getattr(self._adapter, "dense_bytes", 0))
        if dense:
            meta["dense_mask_bytes"] = dense
        meta["steps"] = rec.steps
        for name, key in (("input_ids", "tokens"), ("decoder_input_ids", "decoder_tokens"),
                          ("generated_ids", "generated")):
            if name in rec.inputs and self.tokenizer is not None:
                import numpy as np

                ids = np.concatenate(rec.inputs[name], axis=-1)
                meta[key] = [_token_strings(self.tokenizer, [int(i) for i in row])
                             for row in ids.reshape(-1, ids.shape[-1])]
        if self.tokenizer is not None and any(k in meta for k in ("tokens", "decoder_tokens", "generated")):
            meta["token_style"] = token_style(self.tokenizer, meta)
        return meta

    # -- the recording

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the capture to ``path`` (``.safetensors``, or ``.npz`` by its extension), atomically."""
        from attnviz.io import write_atomic

        if self.path is None:
            raise UsageError("attnviz.capture: nothing to save yet; save after the with block.")
        target = Path(path)
        if target.suffix.lower() not in (".safetensors", ".npz"):
            raise UsageError(f"{target}: a capture is saved as .safetensors or .npz.")
        if target.resolve() == self.path.resolve():
            return target
        if target.suffix.lower() != self.path.suffix.lower():
            from attnviz.capturefile import convert

            convert(self.path, target)
            return target
        if self._temp is not None and self.path == self._temp and self._moved(target):
            return target

        def copy(fh: Any) -> None:
            with open(self.path, "rb") as src:  # type: ignore[arg-type]
                shutil.copyfileobj(src, fh, 16 * 2**20)

        write_atomic(target, copy)
        return target

    def _moved(self, target: Path) -> bool:
        """The temporary file moved to ``target`` (a rename: the same file system), the recording reading it
        there from now on; False when it cannot be renamed there (another file system: it is copied)."""
        from attnviz.staging import umask

        assert self._temp is not None
        if target.exists() and not target.is_file():
            raise OutputError(f"{target}: exists and is not a regular file; refusing to replace it.")
        try:
            os.replace(self._temp, target)
        except OSError:
            return False
        try:
            os.chmod(target, 0o666 & ~umask())  # as any file the user writes (the temporary one was private)
        except OSError:
            pass  # a file system without modes
        if self._finalizer is not None:
            self._finalizer.detach()  # the file is the user's now
        self.path, self._temp, self._finalizer = target, None, None
        return True

    def __fspath__(self) -> str:
        if self.path is None:
            raise UsageError("attnviz.capture: the recording is ready after the with block.")
        return str(self.path)

    @property
    def sites(self) -> list[str]:
        """The sites recorded, in order (``layers.0``, ... ``cross.layers.5``)."""
        return [] if self._rec is None else self._rec.site_names

    def close(self) -> None:
        """Remove the temporary file of a capture that was not given a path."""
        if self._finalizer is not None:
            self._finalizer()

    def __repr__(self) -> str:
        state = f"{len(self.sites)} sites in {self.path}" if self.path else "not finished"
        return f"<attnviz capture: {state}>"


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _layers(value: Any) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        value = [part for part in value.replace(" ", "").split(",") if part]
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise UsageError(f"attnviz.capture: layers {value!r}; give site numbers (0, 3, -1).") from None


def _token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """A row's tokens: a transformers tokenizer's ``convert_ids_to_tokens``, or a KerasHub tokenizer's (or
    preprocessor's) ``id_to_token``."""
    if hasattr(tokenizer, "convert_ids_to_tokens"):
        return [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    return [str(tokenizer.id_to_token(i)) for i in ids]


def token_style(tokenizer: Any, meta: dict[str, Any]) -> str | None:
    """How the tokens a capture keeps stand for text (``attnviz.tokentext``): asked of a transformers tokenizer by
    what it makes of a probe (``a``, ``Ġb``, ``Ċ`` is ``a b`` and a newline for byte-level BPE; ``a``, ``▁b`` is
    ``a b`` for SentencePiece); read from the tokens themselves for a tokenizer that cannot be asked (KerasHub's)."""
    from attnviz import tokentext

    convert = getattr(tokenizer, "convert_tokens_to_string", None)
    if callable(convert):
        for style, probe, text in ((tokentext.BYTE_LEVEL, ["a", "Ġb", "Ċ"], "a b\n"),
                                   (tokentext.SENTENCEPIECE, ["a", "▁b"], "a b")):
            try:
                if convert(probe) == text:
                    return style
            except Exception:  # noqa: BLE001 - a tokenizer that cannot read the probe's characters is not of it
                continue
        return None
    rows = [row for key in ("tokens", "decoder_tokens", "generated") for row in meta.get(key) or []]
    return tokentext.detect(rows)


def _counts(model: Any) -> dict[str, int]:
    """How many sites of each kind the model has, from its config (negative layers count from there)."""
    if _is_keras(model):
        from attnviz.capturing.keras import site_counts

        return site_counts(model)
    config = getattr(model, "config", None)
    if config is None or isinstance(config, dict):
        layers = getattr(model, "layers", None)
        count = sum(1 for layer in layers or [] if type(layer).__name__ == "MultiHeadAttention")
        return {"layers": count} if count else {}
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    n = getattr(text, "num_hidden_layers", None) or getattr(text, "num_layers", None)
    dec = getattr(text, "num_decoder_layers", None) or getattr(text, "decoder_layers", None) or n
    enc = getattr(text, "encoder_layers", None) or n
    out = {}
    if n:
        out["layers"] = int(n)
    if enc:
        out["encoder"] = int(enc)
    if dec:
        out["decoder"] = out["cross"] = int(dec)
    return out


def _is_keras(model: Any) -> bool:
    return any(c.__module__.startswith(("keras", "tf_keras", "tensorflow")) for c in type(model).__mro__)

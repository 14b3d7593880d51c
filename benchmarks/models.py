"""Model folders for the long-context benchmarks and tests: a Llama-architecture model (random weights, saved
with save_pretrained) and a word-level tokenizer, built from constructor arguments (nothing downloaded).

    python benchmarks/models.py DIR [--layers 4 --heads 4 --kv-heads 2 --hidden 256 --positions 131072]
"""

from __future__ import annotations

import argparse
from pathlib import Path

WORDS = ("the of and to a in is that it was for on are as with his they at be this from have or by one had not "
         "but what all were when we there can an your which their said if do will each about how up out them then "
         "she many some so these would other into has more her two like him see time could no make than first been "
         "its who now people my made over did down only way find use may water long little very after words called "
         "just where most know get through back much go good new write our me man too any day same right look "
         "think also around another came come work three word must because does part even place well such here "
         "take why things help put years different away again off went old number great tell men say small every "
         "found still between name should home big give air line set own under read last never us left end along "
         "while might next sound below saw something thought both few those always looked show large often "
         "together asked house world going want school important until form food keep children feet land side "
         "without boy once animals life enough took sometimes four head above kind began almost live page got earth "
         "need far hand high year mother light parts country father let night following picture being study second "
         "eyes soon times story boys since white days ever paper hard near sentence better best across during today "
         "others however sure means knew try told young miles sun ways thing whole hear example heard several change "
         "answer room sea against top turned learn point city play toward five using himself usually . , ? ! ; : "
         "needle secret code is magic number blue").split()


def tokenizer(folder: Path) -> object:
    """A word-level tokenizer over ``WORDS`` (lower case, punctuation split off), with <s>, </s>, <unk>, <pad>."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *dict.fromkeys(WORDS)])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    fast.save_pretrained(str(folder))
    return fast


def llama_folder(folder: Path, *, layers: int = 4, heads: int = 4, kv_heads: int = 2, hidden: int = 256,
                 positions: int = 131072, seed: int = 0, **extra: object) -> Path:
    """A Llama-architecture model folder (head_dim = hidden / heads) with the word-level tokenizer."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    fast = tokenizer(folder)
    cfg = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 2,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=positions, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                                   **extra)
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(folder))
    return folder


def long_text(tokens: int, needle: str | None = None, depth: float = 0.5, seed: int = 0) -> str:
    """About ``tokens`` word-level tokens of filler text (sentences of WORDS), with ``needle`` at ``depth``."""
    import random

    rng = random.Random(seed)
    filler = [w for w in WORDS if w.isalpha() and w not in ("needle", "secret", "code", "magic", "blue")]
    words: list[str] = []
    while len(words) < tokens - 1:
        words += [*rng.sample(filler, 9), "."]
    words = words[:tokens - 1]
    if needle:
        at = int(len(words) * depth)
        words[at:at] = needle.split()
        words = words[:tokens - 1]
    return " ".join(words)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--positions", type=int, default=131072)
    args = ap.parse_args()
    llama_folder(Path(args.folder), layers=args.layers, heads=args.heads, kv_heads=args.kv_heads, hidden=args.hidden,
                 positions=args.positions)
    print(args.folder)


if __name__ == "__main__":
    main()

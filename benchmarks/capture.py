"""Capture's cost against what a user writes today, in one run on one machine.

Baseline: the model loaded eager, ``model(ids, output_attentions=True)``, every layer's weights copied to
host memory as float32 and saved with ``numpy.savez``. attnviz: the same model as transformers builds it
(SDPA), ``attnviz.capture(model, path=...)`` around one forward pass, the capture file written. Prints both
times, their ratio (target: at most 1.5) and the host memory each added at its peak (target for capture:
about two layers of weights above the model's own forward).

    python benchmarks/capture.py                       # CPU: 12 layers x 4 heads x 1536 tokens, a small Llama
    python benchmarks/capture.py --device cuda --size 1b --tokens 2048 --dir /dev/shm
"""

from __future__ import annotations

import argparse
import copy
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import reset_peak, rss_now, rss_peak  # noqa: E402 - the benchmarks' folder first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", choices=("small", "1b"), default="small")
    ap.add_argument("--tokens", type=int, default=1536)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--weights-dtype", default="float32")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    import torch
    import transformers

    import attnviz

    if args.size == "1b":  # a 1B-class Llama: 16 layers x 32 heads (8 kv), bf16
        cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
        dtype = torch.bfloat16
    else:
        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=12,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
        dtype = torch.float32
    device = torch.device(args.device)
    torch.manual_seed(0)
    with device:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
        eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), dtype=dtype,
                                                              attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), device=device)
    folder = Path(tempfile.mkdtemp(dir=args.dir, prefix="attnviz-bench-"))
    layer_bytes = cfg.num_attention_heads * args.tokens ** 2 * 4
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{args.size} Llama, {cfg.num_hidden_layers} layers x {cfg.num_attention_heads} heads x {args.tokens} tokens "
          f"on {args.device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}); one layer's weights "
          f"{layer_bytes / 2**20:.0f} MiB as float32; files in {folder}", flush=True)
    with torch.no_grad():  # warm up both (kernels, allocator)
        model(ids[:, :64])
        eager(ids[:, :64], output_attentions=True)
        sync()
        gc.collect()
        start = rss_now()
        reset_peak()
        t0 = time.perf_counter()
        with attnviz.capture(model, path=folder / "run.safetensors", weights_dtype=args.weights_dtype):
            model(ids)
        sync()
        ours = time.perf_counter() - t0
        added = max(rss_peak() - start, 0)
        gc.collect()
        base = rss_now()
        reset_peak()
        if not args.skip_baseline:
            t0 = time.perf_counter()
            out = eager(ids, output_attentions=True)
            host = [a.float().cpu().numpy() for a in out.attentions]
            sync()
            t1 = time.perf_counter()
            np.savez(folder / "baseline.npz", *host)
            t2 = time.perf_counter()
            base_peak = rss_peak() - base
            del out, host
            gc.collect()
            print(f"baseline: eager output_attentions + copy to host {t1 - t0:.2f} s, + numpy.savez {t2 - t0:.2f} s; "
                  f"host memory added {base_peak / 2**20:.0f} MiB or more", flush=True)
            (folder / "baseline.npz").unlink()
    size = (folder / "run.safetensors").stat().st_size
    print(f"attnviz capture ({args.weights_dtype}): {ours:.2f} s for a {size / 2**30:.2f} GiB file "
          f"({size / ours / 2**30:.2f} GiB/s); host memory added at peak "
          f"{added / 2**20:.0f} MiB = {added / layer_bytes:.1f} layers of float32 weights", flush=True)
    if not args.skip_baseline:
        print(f"ratio capture / (output_attentions + savez): {ours / (t2 - t0):.2f} (target <= 1.5)")
    shutil.rmtree(folder, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

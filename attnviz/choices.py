"""The allowed values of the enumerated options, and bounds of numeric ones, in a module that
imports nothing, so that the command line can offer and check them without loading NumPy or
TensorFlow."""

DEVICES = ("auto", "cpu", "gpu")
DTYPES = ("float32", "float64", "float16", "bfloat16")
MASK_CONVENTIONS = ("keep", "block")  # keep: 1 = may attend; block: 1 = masked
MASK_KINDS = ("bool", "additive")
CAUSAL_ALIGNS = ("top-left", "bottom-right")
ROPE_STYLES = ("half", "interleaved")  # half: HF Llama rotate_half; interleaved: GPT-J / RoFormer
ROPE_PARTS = ("first", "last")  # which end of each head --rope-dim rotates (last: DeepSeek's latent attention)
MODEL_ATTENTION = ("encoder", "decoder", "cross")  # which attention of an encoder-decoder model (--model-attention)
SUBWORD_STYLES = ("auto", "wordpiece", "sentencepiece", "bpe")  # --subword-style (attnviz.subwords)
HEAD_COMBINE = ("mean", "max", "min")  # how attention rollout combines a layer's heads
#: the methods of attnviz rollout (attnviz.inspection.rollout.METHODS has their functions)
ROLLOUT_METHODS = ("rollout", "flow", "grad")
WEIGH_BY = ("weights", "value-norms")  # what inspect and rollout analyse (--weigh-by)
UPSAMPLING = ("nearest", "bilinear")  # how a patch grid is brought to the image's pixels (--upsample)
#: a live model's run (attnviz capture, --model): where it runs, its dtype, the dtype its weights are stored in,
#: and what becomes of texts past its positions (--long)
MODEL_DEVICES = ("auto", "cpu", "cuda")
MODEL_DTYPES = ("auto", "float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
LONG_TEXTS = ("truncate", "refuse")

#: every file an array argument reads, as help texts and the documentation list them (``attnviz.formats`` reads
#: them; a test keeps the two the same); KEYED: those that hold several named arrays (FILE:KEY picks one)
INPUT_FORMATS = ".npy, .npz, .safetensors, .h5/.hdf5, .pt/.pth/.bin (torch.save), .json, or - (JSON on stdin)"
KEYED_FORMATS = ".npz, .safetensors, .h5/.hdf5, .pt/.pth/.bin, .json"

#: the largest width of a learned layer (--units, --key-dim, ...) and number of heads an option may
#: ask for: drawn parameters stay within a few hundred megabytes
MAX_WIDTH = 8192
MAX_HEADS = 1024

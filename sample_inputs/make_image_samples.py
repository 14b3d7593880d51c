"""Regenerate the image samples in sample_inputs/ (python sample_inputs/make_image_samples.py [OUT_DIR];
needs torch, transformers and Pillow: ``pip install -e '.[test]'``).

* ``cat.png``: a 224 x 224 drawing of a cat's face on a lawn under a sky (Pillow shapes, a 16-colour
  palette: a few KB).
* ``vit_attn.npz``: the attentions of a tiny ViT (transformers ``ViTModel`` from a ``ViTConfig``:
  224 x 224 pixels, patches of 16, so a 14 x 14 grid after the CLS token, 197 tokens; 3 layers of 3
  heads) run on ``cat.png`` with ``output_attentions=True``: ``attentions [3, 1, 3, 197, 197]``
  (float16, as a model in half precision saves them). Its weights are drawn with NumPy from a fixed
  seed (not torch's initialisers, which may change between versions), with query and key projections
  large enough that attention follows the picture's content: the model is untrained.
* ``vit_registers.npz``: the same for a tiny DINOv2 with 4 registers (``Dinov2WithRegistersModel``) on
  ``cat.png`` resized to 112 x 112: a 7 x 7 grid after CLS and 4 registers (5 prefix tokens), 54
  tokens, 2 layers of 2 heads.
* ``vlm_attn.npz`` and ``vlm_tokens.txt``: a vision-language model as LLaVA builds it: the tiny ViT's
  patch features, projected, stand in the text sequence where ``<image>`` was, and a tiny Llama
  (``LlamaModel``, eager attention, causal) runs over ``USER: <image> x 196 what is in the picture ?
  ASSISTANT: a cat``; ``attentions [2, 1, 2, L, L]`` with the image at ``--image-tokens 2:198``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIZE = 224
TEXT_BEFORE = ["<s>", "USER:"]
TEXT_AFTER = ["what", "is", "in", "the", "picture", "?", "ASSISTANT:", "a", "cat"]


def cat_picture() -> object:
    """The drawing, a Pillow image (palette mode)."""
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (SIZE, SIZE), (135, 190, 235))  # sky
    draw = ImageDraw.Draw(im)
    draw.rectangle((0, 160, SIZE, SIZE), fill=(90, 160, 70))  # lawn
    draw.ellipse((150, 18, 200, 68), fill=(250, 220, 90))  # sun
    orange, dark = (235, 140, 40), (60, 40, 30)
    draw.polygon([(62, 92), (74, 30), (108, 72)], fill=orange)  # ears
    draw.polygon([(162, 92), (150, 30), (116, 72)], fill=orange)
    draw.polygon([(72, 80), (78, 46), (98, 70)], fill=(245, 180, 170))
    draw.polygon([(152, 80), (146, 46), (126, 70)], fill=(245, 180, 170))
    draw.ellipse((52, 58, 172, 178), fill=orange)  # head
    draw.ellipse((82, 96, 104, 122), fill=(250, 250, 240))  # eyes
    draw.ellipse((120, 96, 142, 122), fill=(250, 250, 240))
    draw.ellipse((89, 102, 99, 120), fill=dark)
    draw.ellipse((127, 102, 137, 120), fill=dark)
    draw.polygon([(104, 130), (120, 130), (112, 140)], fill=(230, 90, 110))  # nose
    for y in (134, 142):  # whiskers
        draw.line((60, y - 6, 98, y), fill=dark, width=2)
        draw.line((164, y - 6, 126, y), fill=dark, width=2)
    draw.arc((98, 136, 114, 152), 0, 180, fill=dark, width=2)  # mouth
    draw.arc((110, 136, 126, 152), 0, 180, fill=dark, width=2)
    return im.quantize(16, dither=Image.Dither.NONE)


def _pixels(picture: object, size: int) -> np.ndarray:
    """The picture as a model's ``pixel_values [1, 3, size, size]``: resized (bilinear), scaled to 0..1,
    normalised with mean 0.5 and std 0.5 (ViTImageProcessor's defaults)."""
    from PIL import Image

    rgb = picture.convert("RGB")  # type: ignore[attr-defined]
    if rgb.size != (size, size):
        rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
    x = np.asarray(rgb, np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)[None]


def _fill(model: object, seed: int, strong: tuple[str, ...] = ("query", "key", "q_proj", "k_proj")) -> None:
    """Every parameter drawn with NumPy from ``seed``: N(0, 0.02) as initialisers do, the attention's
    query and key projections N(0, 0.25) so that its weights are not all alike; layer norms 1 and 0."""
    import torch

    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # type: ignore[attr-defined]
            if "norm" in name.lower() and name.endswith("weight"):
                values = np.ones(param.shape)
            elif name.endswith("bias") or "norm" in name.lower():
                values = np.zeros(param.shape)
            else:
                std = 0.25 if any(f".{s}." in name for s in strong) else 0.02
                values = rng.normal(scale=std, size=param.shape)
            param.copy_(torch.from_numpy(values.astype(np.float32)))


def tiny_vit(seed: int = 0, image_size: int = SIZE, patch_size: int = 16, layers: int = 3, heads: int = 3,
             hidden: int = 48) -> object:
    """The tiny ViT of ``vit_attn.npz`` (tests build smaller ones with the same function)."""
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(image_size=image_size, patch_size=patch_size, hidden_size=hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, intermediate_size=2 * hidden, attn_implementation="eager")
    model = ViTModel(config, add_pooling_layer=False).eval()
    _fill(model, seed)
    return model


def vit_attentions(model: object, pixel_values: np.ndarray) -> np.ndarray:
    """``out.attentions`` stacked, ``[layers, batch, heads, L, L]`` (float32)."""
    import torch

    with torch.no_grad():
        out = model(torch.from_numpy(pixel_values), output_attentions=True)  # type: ignore[operator]
    return np.stack([a.numpy() for a in out.attentions])


def registers(picture: object) -> np.ndarray:
    from transformers import Dinov2WithRegistersConfig, Dinov2WithRegistersModel

    config = Dinov2WithRegistersConfig(image_size=112, patch_size=16, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, mlp_ratio=2, num_register_tokens=4,
                                       attn_implementation="eager")
    model = Dinov2WithRegistersModel(config).eval()
    _fill(model, 1)
    return vit_attentions(model, _pixels(picture, 112))


def vlm(picture: object) -> tuple[np.ndarray, list[str]]:
    """LLaVA's layout with tiny parts: projected ViT patch features among text embeddings, a Llama over them."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    vit = tiny_vit(seed=0)
    with torch.no_grad():
        features = vit(torch.from_numpy(_pixels(picture, SIZE))).last_hidden_state[0, 1:]  # type: ignore[operator]
    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         attn_implementation="eager")
    llama = LlamaModel(config).eval()
    _fill(llama, 2)
    rng = np.random.default_rng(3)
    projector = torch.from_numpy(rng.normal(scale=0.3, size=(features.shape[-1], 32)).astype(np.float32))
    words = TEXT_BEFORE + TEXT_AFTER
    table = torch.from_numpy(rng.normal(size=(len(words), 32)).astype(np.float32))
    embeds = torch.cat([table[:len(TEXT_BEFORE)], features @ projector, table[len(TEXT_BEFORE):]])[None]
    with torch.no_grad():
        out = llama(inputs_embeds=embeds, output_attentions=True)
    tokens = TEXT_BEFORE + ["<image>"] * features.shape[0] + TEXT_AFTER
    return np.stack([a.numpy() for a in out.attentions]), tokens


def main(out: Path = HERE) -> None:
    picture = cat_picture()
    picture.save(out / "cat.png", optimize=True)  # type: ignore[attr-defined]
    attentions = vit_attentions(tiny_vit(), _pixels(picture, SIZE))
    np.savez_compressed(out / "vit_attn.npz", attentions=attentions.astype(np.float16))
    np.savez_compressed(out / "vit_registers.npz", attentions=registers(picture).astype(np.float16))
    maps, tokens = vlm(picture)
    np.savez_compressed(out / "vlm_attn.npz", attentions=maps.astype(np.float16))
    (out / "vlm_tokens.txt").write_text("\n".join(tokens) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)

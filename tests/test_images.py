"""Attention over images (``--image``, ``--overlay-png``, rollout's ``--discard-ratio``), against
references written here:

* attention made with NumPy whose query row is hot on known patches must come out on those patches of
  the JSON grid and on those pixels of the upsampled map and the blended picture: a square grid, a
  non-square one, DINOv2's 4 registers (5 prefix tokens) and a vision-language span queried by a token;
* rollout with each head fusion and discard ratio equals a NumPy transcription of jacobgil/vit-explain's
  ``rollout`` (vit_rollout.py) with its rows renormalised (its issue #16: ``a.sum(dim=-1)`` lacks
  ``keepdim``, which divides columns; the two agree when rows sum to 1, checked with the code as written
  in torch), to 1e-6;
* DINO's thresholding and torch's ``interpolate`` (nearest, bilinear) transcribed or called;
* a tiny ViT (transformers ``ViTConfig``) on a real PNG file, end to end through the command line, and
  the committed samples are what ``sample_inputs/make_image_samples.py`` makes;
* bad grids, prefixes, spans and pictures: one line on stderr naming the numbers, exit 1 or 2, no file.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.inspection.images import keep_mass, upsample
from tests.conftest import SAMPLES

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def hot_weights(length, query, hot, heads=2, layers=2, seed=0):
    """Attention ``[layers, 1, heads, L, L]``: random rows, the query's row in the last layer hot on the
    positions ``hot[h]`` of head h (most of the mass there)."""
    rng = np.random.default_rng(seed)
    w = softmax(rng.normal(size=(layers, 1, heads, length, length)))
    for h in range(heads):
        row = np.full(length, 0.02 / length)
        row[hot[h]] = (1 - 0.02) / len(hot[h])
        w[-1, 0, h, query] = row / row.sum()
    return w.astype(np.float32)


def picture(tmp_path, height, width, seed=0):
    from PIL import Image

    rgb = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    path = tmp_path / "picture.png"
    Image.fromarray(rgb).save(path)
    return path, rgb


CASES = {  # grid, prefix or span, query (a position or a token), the hot patches per head (row, col)
    "square": dict(grid=(4, 4), prefix=1, span=None, query="cls", hot=[[(1, 2)], [(3, 0), (0, 3)]]),
    "non-square": dict(grid=(3, 5), prefix=1, span=None, query="cls", hot=[[(2, 4)], [(0, 1)]]),
    "registers": dict(grid=(4, 4), prefix=5, span=None, query="0", hot=[[(0, 0)], [(2, 3)]]),
    "vlm-span": dict(grid=(3, 4), prefix=None, span=(3, 15), query="cat", hot=[[(1, 1)], [(2, 3), (0, 0)]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hot_patches_land_on_their_pixels(name, tmp_path):
    case = CASES[name]
    (gh, gw), patch = case["grid"], 8
    n = gh * gw
    if case["span"] is None:
        start, length, labels, query = case["prefix"], case["prefix"] + n, None, 0
        where = ["--prefix-tokens", case["prefix"]] if case["prefix"] != 1 else []
    else:
        start, stop = case["span"]
        labels = ["<s>", "USER:", "look"] + ["<image>"] * n + ["the", "cat"]
        length, query = len(labels), labels.index("cat")
        where = ["--image-tokens", f"{start}:{stop}", "--labels", ",".join(labels)]
    hot = [[start + r * gw + c for r, c in cells] for cells in case["hot"]]
    w = hot_weights(length, query, hot)
    np.save(tmp_path / "w.npy", w)
    path, rgb = picture(tmp_path, gh * patch, gw * patch)
    out = tmp_path / "heads.png"
    r = invoke("inspect", tmp_path / "w.npy", "--image", path, "--patch-grid", f"{gh}x{gw}", *where,
               "--query", case["query"], "--overlay-png", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["overlay"]
    assert doc["grid"] == [gh, gw] and doc["query"] == query and doc["layer"] == 1  # the last layer
    maps = np.array(doc["maps"])
    oracle = w[-1, 0, :, query, start:start + n].astype(np.float64).reshape(2, gh, gw)
    np.testing.assert_allclose(maps, oracle, rtol=1e-6)
    np.testing.assert_allclose(np.array(doc["mean"]), oracle.mean(0), rtol=1e-6)
    for h, cells in enumerate(case["hot"]):
        pixels = upsample(maps[h], (gh * patch, gw * patch), "nearest")
        hot_pixels = np.zeros(pixels.shape, bool)
        for row, col in cells:
            hot_pixels[row * patch:(row + 1) * patch, col * patch:(col + 1) * patch] = True
        assert pixels[hot_pixels].min() > 0.4 and pixels[~hot_pixels].max() < 0.01, (name, h)
    # the blended picture: the hot pixels take the scale's top colour half and half with the picture
    from attnviz.render.overlay import ALPHA, blend, colour_values

    top = maps.max()
    blended = blend(rgb, maps[0], top, None).astype(np.float64)
    (row, col), = case["hot"][0]
    block = (slice(row * patch, (row + 1) * patch), slice(col * patch, (col + 1) * patch))
    expected = (1 - ALPHA) * rgb[block] + ALPHA * 255 * colour_values(np.array(maps[0, row, col]), top, None)
    assert np.abs(blended[block] - expected).max() <= 0.51
    from PIL import Image

    with Image.open(out) as saved:
        assert saved.format == "PNG" and saved.width > 300 and saved.height > 200


def upsample_torch(grid, size, mode):
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(np.asarray(grid, np.float64))[None]
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    return torch.nn.functional.interpolate(t, size=size, mode=mode, **kwargs)[0].numpy()


def test_upsampling_is_torch_interpolate_and_dino_keeps_its_mass():
    rng = np.random.default_rng(1)
    grid = rng.random((2, 3, 5))
    for mode, size in (("nearest", (24, 40)), ("nearest", (25, 37)), ("bilinear", (24, 40)), ("bilinear", (17, 9))):
        np.testing.assert_allclose(upsample(grid, size, mode), upsample_torch(grid, size, mode), atol=1e-12)
    # DINO's --threshold, transcribed: sort, normalise, cumulative sum, keep above 1 - F, unsort
    values = rng.random((3, 20)) ** 3
    for share in (0.6, 0.9):
        idx = np.argsort(values, axis=1)
        val = np.take_along_axis(values, idx, axis=1)
        val = val / val.sum(axis=1, keepdims=True)
        th = np.cumsum(val, axis=1) > (1 - share)
        idx2 = np.argsort(idx, axis=1)
        expected = np.stack([th[h][idx2[h]] for h in range(3)])
        kept = keep_mass(values, share)
        np.testing.assert_array_equal(kept, expected)
        shares = (values * kept).sum(1) / values.sum(1)
        assert (shares >= share).all()  # and it is the fewest: dropping its smallest goes below F
        smallest = np.where(kept, values, np.inf).min(1)
        assert ((values * kept).sum(1) - smallest < share * values.sum(1)).all()


def vit_explain(attentions, discard_ratio, head_fusion):
    """jacobgil/vit-explain vit_rollout.py ``rollout``, transcribed to NumPy (rows renormalised:
    ``keepdims=True``, see the module's docstring). ``attentions``: a list of [1, heads, L, L]."""
    result = np.eye(attentions[0].shape[-1])
    for attention in attentions:
        fused = {"mean": attention.mean(axis=1), "max": attention.max(axis=1),
                 "min": attention.min(axis=1)}[head_fusion].astype(np.float64)
        flat = fused.reshape(fused.shape[0], -1)  # a view: zeroing it zeroes the fused map
        indices = np.argsort(flat, axis=-1, kind="stable")[:, :int(flat.shape[-1] * discard_ratio)]
        indices = indices[indices != 0]
        flat[0, indices] = 0
        eye = np.eye(fused.shape[-1])
        a = (fused + 1.0 * eye) / 2
        a = a / a.sum(axis=-1, keepdims=True)
        result = a @ result
    mask = result[0, 0, 1:]
    width = int(mask.shape[-1] ** 0.5)
    mask = mask.reshape(width, width)
    return mask / np.max(mask)


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_rollout_is_vit_explain(fusion, tmp_path):
    rng = np.random.default_rng({"mean": 0, "max": 1, "min": 2}[fusion])
    w = softmax(rng.normal(size=(3, 1, 4, 17, 17)) * 1.5).astype(np.float32)  # 4 x 4 patches after CLS
    np.save(tmp_path / "w.npy", w)
    layers = [w[i].astype(np.float64) for i in range(3)]
    for ratio in (0.0, 0.5, 0.9):
        r = invoke("rollout", tmp_path / "w.npy", "--patch-grid", "4x4", "--heads", fusion, "--discard-ratio", ratio,
                   "--json")
        assert r.exit_code == 0, r.output
        got = np.array(json.loads(r.stdout)["overlay"]["rollout"])
        np.testing.assert_allclose(got, vit_explain(layers, ratio, fusion), atol=1e-6, err_msg=f"{fusion} {ratio}")
    if fusion == "mean":  # rows already sum to 1: the code as written (torch, no keepdim) agrees
        torch = pytest.importorskip("torch")

        def rollout_as_written(attentions, discard_ratio, head_fusion):
            result = torch.eye(attentions[0].size(-1), dtype=torch.float64)
            for attention in attentions:
                attention_heads_fused = attention.mean(axis=1)
                flat = attention_heads_fused.view(attention_heads_fused.size(0), -1)
                _, indices = flat.topk(int(flat.size(-1) * discard_ratio), -1, False)
                indices = indices[indices != 0]
                flat[0, indices] = 0
                identity = torch.eye(attention_heads_fused.size(-1), dtype=torch.float64)
                a = (attention_heads_fused + 1.0 * identity) / 2
                a = a / a.sum(dim=-1)
                result = torch.matmul(a, result)
            mask = result[0, 0, 1:]
            width = int(mask.size(-1) ** 0.5)
            mask = mask.reshape(width, width).numpy()
            return mask / np.max(mask)

        r = invoke("rollout", tmp_path / "w.npy", "--patch-grid", "4x4", "--json")
        got = np.array(json.loads(r.stdout)["overlay"]["rollout"])
        np.testing.assert_allclose(got, rollout_as_written([torch.from_numpy(x) for x in layers], 0.0, "mean"),
                                   atol=1e-6)


@pytest.fixture(scope="module")
def samples_script():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(SAMPLES))
    try:
        import make_image_samples
    finally:
        sys.path.remove(str(SAMPLES))
    return make_image_samples


def test_a_tiny_vit_end_to_end(samples_script, tmp_path):
    """A ViT from transformers' ViTConfig (32 x 32 pixels, patches of 8) on a PNG file: inspect's grid maps
    are the model's own CLS rows, rollout is vit-explain's on them, through the command line."""
    from PIL import Image

    with Image.open(SAMPLES / "cat.png") as im:
        small = im.convert("RGB").resize((32, 32))
    small.save(tmp_path / "cat32.png")
    model = samples_script.tiny_vit(seed=5, image_size=32, patch_size=8, layers=2, heads=2, hidden=32)
    with Image.open(tmp_path / "cat32.png") as im:
        attentions = samples_script.vit_attentions(model, samples_script._pixels(im, 32))
    assert attentions.shape == (2, 1, 2, 17, 17)
    np.savez(tmp_path / "vit.npz", *attentions)  # one array per layer, as a hook would save them
    r = invoke("inspect", tmp_path / "vit.npz", "--image", tmp_path / "cat32.png", "--patch-size", 8, "--json",
               "--overlay-png", tmp_path / "heads.png")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["overlay"]
    assert doc["grid"] == [4, 4] and doc["image_size"] == [32, 32]
    np.testing.assert_allclose(doc["maps"], attentions[-1, 0, :, 0, 1:].reshape(2, 4, 4), atol=1e-7)
    r = invoke("rollout", tmp_path / "vit.npz", "--image", tmp_path / "cat32.png", "--patch-size", 8, "--heads", "max",
               "--discard-ratio", 0.9, "--json", "--overlay-png", tmp_path / "rollout.png")
    assert r.exit_code == 0, r.output
    expected = vit_explain([a.astype(np.float64) for a in attentions], 0.9, "max")
    np.testing.assert_allclose(json.loads(r.stdout)["overlay"]["rollout"], expected, atol=1e-6)
    assert (tmp_path / "heads.png").stat().st_size > 5000 and (tmp_path / "rollout.png").stat().st_size > 5000


def test_the_image_samples_are_what_the_script_makes(samples_script, tmp_path):
    samples_script.main(tmp_path)
    assert (tmp_path / "cat.png").read_bytes() == (SAMPLES / "cat.png").read_bytes()
    assert (tmp_path / "vlm_tokens.txt").read_text() == (SAMPLES / "vlm_tokens.txt").read_text()
    for name in ("vit_attn.npz", "vit_registers.npz", "vlm_attn.npz"):
        made, committed = np.load(tmp_path / name), np.load(SAMPLES / name)
        # float16 storage: one unit in the last place where float32 arithmetic rounds across a boundary
        np.testing.assert_allclose(made["attentions"], committed["attentions"], atol=1e-3, err_msg=name)
    assert np.load(SAMPLES / "vit_registers.npz")["attentions"].shape[-1] == 5 + 7 * 7


BAD = [  # argv after the weights (w.npy: [2, 1, 2, 17, 17]), exit code, words of the message
    (["--patch-grid", "4x5"], 1, ["w.npy", "--patch-grid 4x5 makes 20 patches", "17 positions", "1 prefix", "16"]),
    (["--patch-grid", "4x4", "--prefix-tokens", "5"], 1, ["w.npy", "16 patches", "5 prefix token(s) leave 12"]),
    (["--image-tokens", "2:14", "--patch-grid", "4x4"], 1, ["w.npy", "16 patches", "--image-tokens 2:14 hold 12"]),
    (["--image-tokens", "2:30"], 1, ["w.npy", "--image-tokens 2:30", "17 key positions"]),
    (["--prefix-tokens", "3"], 1, ["w.npy", "leave 14", "not a square grid", "--patch-grid"]),
    (["--image", "broken.png"], 1, ["--image broken.png", "cannot read it as a PNG or JPEG"]),
    (["--image", "flat.npy"], 1, ["--image flat.npy", "[5, 5]", "[H, W, 3]"]),
    (["--image", "missing.png"], 2, ["--image missing.png", "no such file"]),
    (["--image", "picture.gif"], 2, ["--image picture.gif", "unknown file type"]),
    (["--patch-grid", "4x4", "--patch-size", "8"], 2, ["--patch-grid 4x4 and --patch-size 8", "give one"]),
    (["--image-tokens", "1:17", "--prefix-tokens", "1"], 2, ["--prefix-tokens 1 and --image-tokens 1:17"]),
    (["--patch-grid", "4by4"], 2, ["--patch-grid", "rows x columns"]),
    (["--image-tokens", "9:3"], 2, ["--image-tokens", "END must be after START"]),
    (["--patch-grid", "4x4", "--query", "17"], 2, ["--query 17", "17 query positions"]),
    (["--patch-grid", "4x4", "--query", "dog"], 2, ["--query 'dog'", "--labels"]),
    (["--patch-size", "8"], 2, ["--patch-size 8", "--image"]),
    ([], 2, ["--overlay-png", "--image"]),
]


@pytest.mark.parametrize("command", ["inspect", "rollout"])
def test_bad_images_grids_and_spans_are_one_line(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save("w.npy", hot_weights(17, 0, [[1], [2]]))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    np.save("flat.npy", np.zeros((5, 5)))
    (tmp_path / "picture.gif").write_bytes(b"GIF89a")
    for args, code, words in BAD:
        r = invoke(command, "w.npy", *args, "--overlay-png", "out.png", "--json-file", "out.json")
        message = r.stderr.strip()
        assert r.exit_code == code, (args, r.output)
        assert "Traceback" not in r.output and len(message.splitlines()) == 1, (args, message)
        assert all(word in message for word in words), (args, message)
        assert not (tmp_path / "out.png").exists() and not (tmp_path / "out.json").exists()


def test_the_python_api_takes_the_image_options_and_arrays():
    import attnviz

    w = hot_weights(17, 0, [[4], [9]])
    pixels = np.random.default_rng(2).normal(size=(1, 3, 32, 32))  # a processor's pixel_values
    doc = attnviz.inspect(w, image=pixels, patch_grid="4x4", keep_mass=0.5).document()["overlay"]
    np.testing.assert_allclose(doc["maps"], w[-1, 0, :, 0, 1:].astype(np.float64).reshape(2, 4, 4), rtol=1e-6)
    assert doc["image_size"] == [32, 32] and np.array(doc["kept"])[0].sum() == 1  # the hot patch holds the half
    rolled = attnviz.rollout(w, image=pixels, patch_grid="4x4", heads="min").document()["overlay"]["rollout"]
    np.testing.assert_allclose(rolled, vit_explain([w[i].astype(np.float64) for i in range(2)], 0.0, "min"), atol=1e-6)

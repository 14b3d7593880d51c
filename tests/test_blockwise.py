"""Long inputs in bounded memory: a small --max-memory forces many blocks of query rows, and the
results (weights streamed to --save-weights, output, statistics, further maps) equal the dense path:
exactly for most variants, within float32 rounding where a matmul over fewer rows may sum in another
order (oneDNN picks its blocking by shape)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from attnviz.blockwise import needs_blocks, parse_size, rows_per_block
from attnviz.cli import app
from attnviz.errors import UsageError

runner = CliRunner()
N = 200


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("long")
    rng = np.random.default_rng(0)
    np.save(tmp / "x.npy", rng.normal(size=(2, N, 8)).astype(np.float32))
    np.save(tmp / "v.npy", rng.normal(size=(2, N, 3)).astype(np.float32))
    pad = np.ones((2, N), np.int8)
    pad[1, 150:] = 0
    np.save(tmp / "pad.npy", pad)
    return tmp


CASES = {
    "scaled-causal": ["scaled", "x", "x", "v", "--causal"],
    "dot-padding": ["dot", "x", "x", "v", "--key-padding-mask", "pad"],
    "general": ["general", "x", "x", "v", "--seed", "1"],
    "additive": ["additive", "x", "x", "v", "--units", "4", "--seed", "1"],
    "multihead-self": ["multihead", "x", "--heads", "2", "--seed", "2", "--causal"],
    "local-window": ["local", "x", "x", "v", "--window", "5"],
    "local-p": ["local", "x", "x", "v", "--mode", "local-p", "--window", "4", "--units", "3"],
    "sparsemax": ["sparse", "x", "x", "v"],
    "topk": ["sparse", "x", "x", "v", "--method", "topk", "--k", "7"],
    "strided": ["sparse", "x", "x", "v", "--method", "strided", "--stride", "9"],
}


def run(folder, args, name, extra=()):
    argv = [str(folder / f"{a}.npy") if a in ("x", "v", "pad") else a for a in args]
    r = runner.invoke(app, [*argv, "--save-weights", str(folder / f"{name}.npy"), "--json-file",
                            str(folder / f"{name}.json"), "--quiet", *extra])
    assert r.exit_code == 0, r.stderr
    return np.load(folder / f"{name}.npy"), json.loads((folder / f"{name}.json").read_text())


@pytest.mark.parametrize("case", list(CASES))
def test_blocks_equal_the_dense_path(folder, case):
    dense_w, dense = run(folder, CASES[case], f"{case}-dense")
    block_w, blocked = run(folder, CASES[case], f"{case}-block", ["--max-memory", "1M"])
    assert dense["weights"] is not None and blocked["weights"] is None
    assert any("--save-weights" in w for w in blocked["warnings"])
    np.testing.assert_allclose(block_w, dense_w, atol=1e-5, rtol=0)
    np.testing.assert_allclose(blocked["output"], dense["output"], atol=1e-5)
    for name, value in dense["stats"].items():
        if name == "top_k":
            np.testing.assert_allclose(blocked["stats"][name]["weight"], value["weight"], atol=1e-5)
        elif name != "argmax":  # argmax may flip between near-equal weights
            np.testing.assert_allclose(np.array(blocked["stats"][name], float), np.array(value, float), atol=1e-5)
    for name, value in dense["maps"].items():
        np.testing.assert_allclose(blocked["maps"][name]["data"], value["data"], atol=1e-5)
    assert blocked["weights_shape"] == dense["weights_shape"]


def test_blocked_tables_and_png(folder):
    png = folder / "blocked.png"
    r = runner.invoke(app, ["scaled", str(folder / "x.npy"), str(folder / "x.npy"), str(folder / "v.npy"),
                            "--max-memory", "1M", "--png", str(png), "--max-rows", "6"])
    assert r.exit_code == 0, r.stderr
    assert "blocks of" in r.stderr and "not shown: rows 3-196 of 200" in " ".join(r.stdout.split())
    assert png.stat().st_size > 5000


def test_sizes_and_planning():
    assert parse_size("512M") == 512 * 2**20 and parse_size("1.5G") == int(1.5 * 2**30)
    assert parse_size("300000000") == 300000000
    for bad in ("lots", "12X", "10"):
        with pytest.raises(UsageError):
            parse_size(bad)
    assert needs_blocks((32768, 32768), 512 * 2**20) and not needs_blocks((64, 64), 512 * 2**20)
    rows = rows_per_block((32768, 32768), 512 * 2**20, align=64)
    assert rows % 64 == 0 and rows * 32768 * 40 <= 512 * 2**20


@pytest.mark.parametrize("extra", [[], ["--max-memory", "1M"]])
@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_deferred_causal_mask_equals_the_built_one(folder, monkeypatch, extra, align):
    """Long inputs build --causal a block of rows at a time; forced here on a small input."""
    import attnviz.masks

    np.save(folder / "kshort.npy", np.load(folder / "x.npy")[:, :150])
    np.save(folder / "vshort.npy", np.load(folder / "v.npy")[:, :150])
    args = ["scaled", "x", "kshort", "vshort", "--causal", "--causal-align", align]

    def go(name):
        argv = [str(folder / f"{a}.npy") if a in ("x", "kshort", "vshort") else a for a in args]
        r = runner.invoke(app, [*argv, *extra, "--save-weights", str(folder / f"{name}.npy"), "--json-file",
                                str(folder / f"{name}.json"), "--quiet"])
        assert r.exit_code == 0, r.stderr
        return np.load(folder / f"{name}.npy"), json.loads((folder / f"{name}.json").read_text()), r.stderr

    built_w, built, built_err = go("built")
    monkeypatch.setattr(attnviz.masks, "DEFER_CAUSAL", 100)
    lazy_w, lazy, lazy_err = go("deferred")
    np.testing.assert_allclose(lazy_w, built_w, atol=1e-6)
    assert lazy["stats"]["unmasked_keys"] == built["stats"]["unmasked_keys"]
    assert lazy["warnings"][:1] == built["warnings"][:1] and lazy_err.count("warning") == built_err.count("warning")
    if align == "bottom-right":  # Lq 200 > Lk 150: the first 50 rows of each batch entry see no key
        assert "100 query row(s) have every key masked" in lazy_err

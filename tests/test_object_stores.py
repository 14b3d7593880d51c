"""Object stores (issue 36): every command's files through ``s3://`` against a real S3 HTTP API on the loopback
(moto's server, ``tests/s3server.py``; the client is the real s3fs and botocore, reaching it through
``AWS_ENDPOINT_URL``):

- each command's inputs and outputs through a bucket equal those of the same run on local files;
- a key of a large file costs its own bytes: the bytes the server sent, for safetensors, ``.npz`` and HDF5;
- batch over a bucket (``--each`` listing it, a jobs file in it), its manifest there, ``--resume``;
- every error (no bucket, no object, access denied, an unreachable endpoint, an unknown scheme, a store
  package not installed, a malformed URL): one line naming the URL, exit 1 (2 for a malformed URL), soon;
- no object after a run that failed, whose upload failed, or that was stopped by SIGTERM while uploading;
- a local run never imports fsspec.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests import s3server
from tests.conftest import ROOT, SAMPLES

runner = CliRunner()
TIMING = ("seconds", "finished", "bytes")  # a JSON document's size: it names its files, paths or URLs


@pytest.fixture(scope="module")
def server():
    """The server, and this process's environment pointing at it for the module's tests."""
    srv = s3server.start()
    saved = {k: os.environ.get(k) for k in (*srv.env(), "SOURCE_DATE_EPOCH", "AWS_PROFILE")}
    os.environ.update(srv.env())
    os.environ["SOURCE_DATE_EPOCH"] = "0"  # SVG and PDF without the time of day
    os.environ.pop("AWS_PROFILE", None)
    yield srv
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def no_options_left():
    """``--storage-options`` holds for the process (a batch's jobs take it); in-process runs here each start without."""
    yield
    from attnviz.storage import options

    options._given = None


def attnviz(*args: str):
    from attnviz.cli import app

    return runner.invoke(app, list(args))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


class Data:
    def __init__(self, local: Path, bucket: str) -> None:
        self.local = local
        self.bucket = bucket
        self.url = f"s3://{bucket}/data"


@pytest.fixture(scope="module")
def data(server, tmp_path_factory) -> Data:
    """Every input of the cases below, in a local folder and the same under s3://BUCKET/data/."""
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("stores") / "data"
    folder.mkdir()
    rng = np.random.default_rng(0)
    layers = [softmax(rng.normal(size=(2, 3, 6, 6)) * 2) for _ in range(3)]
    np.savez(folder / "attn.npz", *layers)
    np.savez(folder / "grads.npz", *[rng.normal(size=(2, 3, 6, 6)).astype(np.float32) for _ in range(3)])
    (folder / "tokens.txt").write_text("the\ncat\nsat\non\nthe\nmat\n")
    np.save(folder / "mask.npy", np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=np.int64))
    np.save(folder / "a.npy", layers[0][0])
    np.save(folder / "b.npy", softmax(np.log(layers[0][0]) + rng.normal(size=(3, 6, 6)) * 0.01))
    for name in ("q", "k", "v"):
        np.save(folder / f"{name}.npy", np.load(SAMPLES / f"{name}.npy"))
    np.save(folder / "keep.npy", np.tril(np.ones((3, 4), dtype=bool), 1))
    save_file({f"layer.{i}.attention": w for i, w in enumerate(layers)}, str(folder / "run.safetensors"))
    for name in ("vit_attn.npz", "cat.png"):
        (folder / name).write_bytes((SAMPLES / name).read_bytes())
    torch = pytest.importorskip("torch")
    torch.save({"blocks": [{"attn": torch.from_numpy(w)} for w in layers]}, folder / "cache.pt")
    np.save(folder / "graph.npy", (rng.random((5, 5)) > 0.5) | np.eye(5, dtype=bool))
    np.save(folder / "nodes.npy", rng.normal(size=(5, 4)).astype(np.float32))
    (folder / "acts").mkdir()
    for i in range(4):
        np.savez(folder / "acts" / f"run_{i}.npz", *[softmax(rng.normal(size=(3, 5, 5))) for _ in range(2)])
    (folder / "jobs-out").mkdir()
    jobs = [{"command": "inspect", "args": [f"acts/run_{i}.npz"], "options": {"json_file": f"jobs-out/{i}.json"}}
            for i in range(2)]
    (folder / "jobs.jsonl").write_text("".join(json.dumps(job) + "\n" for job in jobs))
    made = attnviz("additive", str(folder / "q.npy"), str(folder / "k.npy"), str(folder / "v.npy"), "--units", "4",
                   "--seed", "1", "--save-params", str(folder / "additive.npz"), "--quiet")
    assert made.exit_code == 0, made.stderr
    bucket = server.bucket("data")
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            server.put(bucket, f"data/{path.relative_to(folder)}", path.read_bytes())
    return Data(folder, bucket)


# ------------------------------------------------------------------ every command: a bucket gives what a folder gives

#: name -> (arguments with {D} for the inputs' folder and {O} for the outputs', the outputs to compare)
CASES = {
    "inspect": (["inspect", "{D}/attn.npz", "--labels", "{D}/tokens.txt", "--mask", "{D}/mask.npy", "--png",
                 "{O}/grid.png", "--map-png", "{O}/map.png", "--stats-png", "{O}/stats.svg", "--received-png",
                 "{O}/received.pdf", "--json-file", "{O}/inspect.json", "--html", "{O}/inspect.html", "--save-maps",
                 "{O}/maps.safetensors", "--title", "T", "--quiet"],
                ["grid.png", "map.png", "stats.svg", "received.pdf", "inspect.json", "inspect.html",
                 "maps.safetensors"]),  # --title: a picture's default title names the file
    "inspect-json": (["inspect", "{D}/run.safetensors:layer.*.attention", "--json", "--save-maps", "{O}/maps.npz"],
                     ["maps.npz"]),
    "inspect-image": (["inspect", "{D}/vit_attn.npz", "--image", "{D}/cat.png", "--patch-grid", "14x14",
                       "--overlay-png", "{O}/overlay.png", "--title", "T", "--quiet"], ["overlay.png"]),
    "inspect-torch": (["inspect", "{D}/cache.pt:blocks.*.attn", "--json"], []),
    "compare": (["compare", "{D}/a.npy", "{D}/b.npy", "--png", "{O}/diff.png", "--json-file", "{O}/compare.json",
                 "--html", "{O}/compare.html", "--title", "T", "--quiet"],
                ["diff.png", "compare.json", "compare.html"]),
    "rollout": (["rollout", "{D}/attn.npz", "--labels", "{D}/tokens.txt", "--method", "grad", "--grads",
                 "{D}/grads.npz", "--png", "{O}/rollout.png", "--json-file", "{O}/rollout.json", "--html",
                 "{O}/rollout.html", "--title", "T", "--quiet"], ["rollout.png", "rollout.json", "rollout.html"]),
    "scaled": (["scaled", "{D}/q.npy", "{D}/k.npy", "{D}/v.npy", "--mask", "{D}/keep.npy", "--png", "{O}/scaled.png",
                "--save-weights", "{O}/w.npy", "--save-output", "{O}/o.npy", "--json-file", "{O}/scaled.json",
                "--html", "{O}/scaled.html", "--title", "T", "--quiet"], ["scaled.png", "w.npy", "o.npy", "scaled.json",
                                                          "scaled.html"]),
    "additive": (["additive", "{D}/q.npy", "{D}/k.npy", "{D}/v.npy", "--params", "{D}/additive.npz", "--json"], []),
    "additive-save": (["additive", "{D}/q.npy", "{D}/k.npy", "{D}/v.npy", "--units", "4", "--seed", "2",
                       "--save-params", "{O}/params.npz", "--quiet"], ["params.npz"]),
    "structured": (["structured", "{D}/nodes.npy", "--adjacency", "{D}/graph.npy", "--score", "gat", "--seed", "0",
                    "--json"], []),
    "repeat-test": (["repeat-test", "12", "--vocab-size", "100", "--seed", "0", "--save-ids", "{O}/ids.npy",
                     "--save-labels", "{O}/ids.txt"],
                    ["ids.npy", "ids.txt"]),
    "batch-each": (["batch", "--quiet", "--results", "{O}/results.jsonl", "--each", "{D}/acts/*.npz", "--",
                    "inspect", "{}", "--json-file", "{O}/each/{stem}.json"],
                   ["results.jsonl", *[f"each/run_{i}.json" for i in range(4)]]),
    "batch-jobs": (["batch", "{D}/jobs.jsonl", "--quiet", "--results", "{O}/jobs.jsonl"], ["jobs.jsonl"]),
}


def fill(args: list[str], d: str, o: str) -> list[str]:
    return [a.replace("{D}", d).replace("{O}", o) for a in args]


def same_text(text: str, roots: list[tuple[str, str]]) -> str:
    for remote, local in roots:
        text = text.replace(remote, local)
    return text


def without_timing(value):
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def assert_same_file(name: str, remote: bytes, local: bytes, roots: list[tuple[str, str]]) -> None:
    suffix = Path(name).suffix
    if suffix in (".json", ".jsonl"):
        mine = [without_timing(json.loads(same_text(line, roots))) for line in remote.decode().splitlines()]
        theirs = [without_timing(json.loads(line)) for line in local.decode().splitlines()]
        assert sorted(map(json.dumps, mine)) == sorted(map(json.dumps, theirs)), name
    elif suffix in (".html", ".txt"):
        assert same_text(remote.decode(), roots) == local.decode(), name
    elif suffix == ".npz":
        with np.load(io.BytesIO(remote)) as a, np.load(io.BytesIO(local)) as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key])
    elif suffix in (".svg", ".pdf"):  # drawn from the same data: the same size, give or take an id or a date
        assert remote[:4] == local[:4] and abs(len(remote) - len(local)) <= 0.01 * len(local), name
    else:
        assert remote == local, name


@pytest.mark.parametrize("case", list(CASES))
def test_a_bucket_gives_what_a_folder_gives(case, server, data, tmp_path):
    args, outputs = CASES[case]
    local_out = tmp_path / "out"
    (local_out / "each").mkdir(parents=True)
    remote_out = f"s3://{data.bucket}/out-{case}"
    here = attnviz(*fill(args, str(data.local), str(local_out)))
    there = attnviz(*fill(args, data.url, remote_out))
    assert here.exit_code == 0, here.stderr + here.stdout
    assert there.exit_code == 0, there.stderr + there.stdout
    roots = [(remote_out, str(local_out)), (data.url, str(data.local))]
    if "--json" in args:
        assert without_timing(json.loads(same_text(there.stdout, roots))) == without_timing(json.loads(here.stdout))
    for name in outputs:
        assert_same_file(name, server.get(data.bucket, f"out-{case}/{name}"), (local_out / name).read_bytes(), roots)
    if case == "batch-jobs":  # the jobs' own outputs, beside the jobs file (its folder is the bucket's)
        for i in range(2):
            assert_same_file("x.json", server.get(data.bucket, f"data/jobs-out/{i}.json"),
                             (data.local / "jobs-out" / f"{i}.json").read_bytes(), roots)
    assert server.uploads(data.bucket) == []


def test_the_api_reads_and_writes_urls(server, data, tmp_path):
    import attnviz as api

    report = api.inspect(f"{data.url}/attn.npz", labels=f"{data.url}/tokens.txt")
    local = api.inspect(str(data.local / "attn.npz"), labels=str(data.local / "tokens.txt"))
    np.testing.assert_array_equal(report.weights, local.weights)
    report.save(f"s3://{data.bucket}/api/grid.png", json=f"s3://{data.bucket}/api/doc.json", title="T")
    local.save(tmp_path / "grid.png", title="T")
    assert server.get(data.bucket, "api/grid.png") == (tmp_path / "grid.png").read_bytes()
    assert json.loads(server.get(data.bucket, "api/doc.json"))["command"] == "inspect"
    loaded = api.load(f"{data.url}/run.safetensors:layer.1.attention",
                      storage_options={"config_kwargs": {"connect_timeout": 3}})
    np.testing.assert_array_equal(loaded.data[0], np.load(data.local / "attn.npz")["arr_1"])


def test_hf_config_and_rope_scaling_from_a_bucket(server, data):
    from attnviz.captured import rope_scaling
    from attnviz.hfconfig import read_json_config

    bucket = data.bucket
    server.put(bucket, "model/config.json", json.dumps({"model_type": "llama", "num_attention_heads": 4}).encode())
    server.put(bucket, "rope.json", json.dumps({"rope_type": "linear", "factor": 2.0}).encode())
    paths: list = []
    for spec in (f"s3://{bucket}/model", f"s3://{bucket}/model/config.json"):
        value, source = read_json_config(spec, paths)
        assert value["model_type"] == "llama" and source == f"s3://{bucket}/model/config.json"
    assert rope_scaling(f"s3://{bucket}/rope.json", paths)["factor"] == 2.0
    assert [str(p) for p in paths] == [f"s3://{bucket}/model/config.json"] * 2 + [f"s3://{bucket}/rope.json"]


# ------------------------------------------------------------------ reading only what is needed

LAYER = (4, 8, 64, 64)  # one layer: 512 KiB of float32
LAYERS = 12


@pytest.fixture(scope="module")
def large(server, tmp_path_factory) -> tuple[str, int, int]:
    """A 6 MiB file of 12 layers in each format, in a bucket: (bucket, one layer's bytes, the file's bytes)."""
    import h5py
    from safetensors.numpy import save

    rng = np.random.default_rng(1)
    layers = {f"layer.{i}.attention": softmax(rng.normal(size=LAYER)) for i in range(LAYERS)}
    bucket = server.bucket("large")
    body = save(layers)
    server.put(bucket, "run.safetensors", body)
    buf = io.BytesIO()
    np.savez(buf, **{k.replace(".", "_"): v for k, v in layers.items()})
    server.put(bucket, "run.npz", buf.getvalue())
    path = tmp_path_factory.mktemp("large") / "run.h5"
    with h5py.File(path, "w") as f:
        for k, v in layers.items():
            f.create_dataset(k.replace(".", "/"), data=v)
    server.put(bucket, "run.h5", path.read_bytes())
    return bucket, layers["layer.0.attention"].nbytes, len(body)


@pytest.mark.parametrize(("name", "key", "count"), [
    ("run.safetensors", "layer.7.attention", 1),
    ("run.safetensors", "layer.1[01].attention", 2),
    ("run.npz", "layer_7_attention", 1),
    ("run.h5", "layer/7/attention", 1),
])
def test_a_key_of_a_large_file_costs_its_own_bytes(server, large, name, key, count):
    bucket, layer, whole = large
    with server.measure() as seen:
        result = attnviz("inspect", f"s3://{bucket}/{name}:{key}", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["weights_shape"] == [count, *LAYER]
    sent = seen.bytes(f"{bucket}/{name}")
    print(f"{name}:{key}: {sent} bytes sent for {count * layer} bytes of {count} layer(s) of a {whole}-byte file "
          f"({sent / (count * layer):.3f}x)")
    assert count * layer <= sent <= 1.5 * count * layer


# ------------------------------------------------------------------ batch on a bucket, --resume there


def test_batch_over_a_bucket_records_and_resumes_there(server, tmp_path):
    bucket = server.bucket("batch")
    rng = np.random.default_rng(2)
    for i in range(5):
        buf = io.BytesIO()
        np.savez(buf, *[softmax(rng.normal(size=(2, 4, 4))) for _ in range(2)])
        server.put(bucket, f"dumps/{'deep/' if i % 2 else ''}run_{i}.npz", buf.getvalue())
    results = f"s3://{bucket}/results/shard-0.jsonl"
    argv = ["batch", "--quiet", "--results", results, "--each", f"s3://{bucket}/dumps/**/*.npz", "--", "inspect",
            "{}", "--json-file", f"s3://{bucket}/out/{{stem}}.json"]
    first = attnviz(*argv)
    assert first.exit_code == 0, first.stderr
    manifest = server.get(bucket, "results/shard-0.jsonl")
    assert manifest.endswith(b"\n") and len(manifest.splitlines()) == 5
    records = [json.loads(line) for line in manifest.splitlines()]
    assert sorted(r["path"] for r in records) == sorted(f"s3://{bucket}/dumps/{'deep/' if i % 2 else ''}run_{i}.npz"
                                                        for i in range(5))
    assert all(r["exit_code"] == 0 and r["outputs"][0]["bytes"] > 0 for r in records)
    assert [k for k in server.keys(bucket) if k.startswith("out/")] == [f"out/run_{i}.json" for i in range(5)]
    assert "testing-secret" not in manifest.decode()
    # one output lost, and a manifest whose last line was cut short: --resume runs those two jobs again
    server.client().delete_object(Bucket=bucket, Key="out/run_3.json")
    torn = manifest + manifest.splitlines()[0][:20]
    server.put(bucket, "results/shard-0.jsonl", torn)
    with server.measure() as seen:
        again = attnviz(*argv[:1], "--resume", *argv[1:])
    assert again.exit_code == 0, again.stderr
    assert "cut short" in again.stderr
    ran = {r.path.rsplit("/", 1)[1] for r in seen.requests if r.method == "GET" and r.path.endswith(".npz")
           and not r.query}
    assert ran == {"run_3.npz"}
    after = server.get(bucket, "results/shard-0.jsonl")
    assert after.endswith(b"\n") and all(json.loads(line) for line in after.splitlines())
    assert len(after.splitlines()) == 6
    assert "out/run_3.json" in server.keys(bucket)


# ------------------------------------------------------------------ errors: one line, the URL, the cause, soon


def one_line_error(result, code: int, *words: str) -> str:
    assert result.exit_code == code, (result.exit_code, result.stderr)
    err = result.stderr
    assert err.startswith("attnviz: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


def test_no_bucket_no_object_no_scheme_no_package(server, data):
    nobucket = "s3://no-such-bucket-here/w.npy"
    one_line_error(attnviz("inspect", nobucket), 1, nobucket, "no such bucket")
    one_line_error(attnviz("inspect", f"{data.url}/missing.npy"), 1, f"{data.url}/missing.npy", "no such object")
    one_line_error(attnviz("inspect", f"{data.url}/a.npy", "--labels", f"{data.url}/none.txt"), 1, "none.txt",
                   "no such object")
    one_line_error(attnviz("inspect", "nope://bucket/w.npy"), 1, "nope://bucket/w.npy", "unknown scheme")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        one_line_error(attnviz("inspect", "gs://bucket/w.npy"), 1, "gs://bucket/w.npy", "gcsfs", "attnviz[gcs]")
    one_line_error(attnviz("inspect", f"{data.url}/a.npy", "--png", "s3://no-such-bucket-here/x.png"), 1,
                   "--png s3://no-such-bucket-here/x.png", "no such bucket")
    one_line_error(attnviz("batch", "--each", "s3://no-such-bucket-here/*.npz", "--", "inspect", "{}"), 1,
                   "no such bucket")
    one_line_error(attnviz("batch", "--results", "s3://no-such-bucket-here/r.jsonl", "--each", f"{data.url}/a.npy",
                           "--", "inspect", "{}"), 1, "--results", "no such bucket")
    one_line_error(attnviz("batch", f"{data.url}/no-jobs.jsonl"), 1, "no-jobs.jsonl", "no such object")


@pytest.mark.parametrize(("url", "words"), [
    ("s3://", "nothing after"), ("s3:///w.npy", "no bucket"), ("s3://bucket", "names a bucket"),
    ("s3://bucket/w .npy", "white space"),
])
def test_a_malformed_url_is_a_usage_error(server, url, words):
    one_line_error(attnviz("inspect", url), 2, words)


def test_a_malformed_output_url_is_a_usage_error(server, data):
    one_line_error(attnviz("inspect", f"{data.url}/a.npy", "--json-file", f"s3://{data.bucket}/folder/"), 2,
                   "names a folder")


def test_denied_access_names_the_url_and_never_the_secret(server, data, monkeypatch):
    import boto3
    from moto import settings

    iam = boto3.client("iam", endpoint_url=server.endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                       region_name="us-east-1")
    iam.create_user(UserName="reader")
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    iam.put_user_policy(UserName="reader", PolicyName="read-open", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                                                "Resource": [f"arn:aws:s3:::{data.bucket}/data/a.npy",
                                                             f"arn:aws:s3:::{data.bucket}"]}]}))
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # from now on, every request is checked
    options = json.dumps({"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]})
    allowed = attnviz("--storage-options", options, "inspect", f"{data.url}/a.npy", "--quiet")
    assert allowed.exit_code == 0, allowed.stderr
    err = one_line_error(attnviz("--storage-options", options, "inspect", f"{data.url}/b.npy"), 1,
                         f"{data.url}/b.npy", "access denied")
    written = one_line_error(attnviz("--storage-options", options, "inspect", f"{data.url}/a.npy", "--png",
                                     f"s3://{data.bucket}/denied/x.png"), 1, "denied/x.png")
    for text in (err, written, allowed.stderr, allowed.stdout):
        assert key["SecretAccessKey"] not in text and key["AccessKeyId"] not in text


def test_an_unreachable_endpoint_fails_soon(server, data):
    import socket

    start = time.perf_counter()
    refused = attnviz("--storage-options", '{"endpoint_url": "http://127.0.0.1:9"}', "inspect", "s3://bkt/w.npy")
    one_line_error(refused, 1, "s3://bkt/w.npy", "cannot reach the store")
    # bounded (attnviz's 5 s connect timeout, 3 tries) where botocore's defaults (60 s a try) would take minutes;
    # the bound leaves room for a loaded machine, where the process's start alone can take tens of seconds
    assert time.perf_counter() - start < 60
    with socket.socket() as silent:  # a server that takes the connection and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        start = time.perf_counter()
        options = {"endpoint_url": f"http://127.0.0.1:{port}",
                   "config_kwargs": {"read_timeout": 1, "retries": {"max_attempts": 1}}}
        hung = attnviz("--storage-options", json.dumps(options), "inspect", "s3://bkt/w.npy")
        one_line_error(hung, 1, "s3://bkt/w.npy", "cannot reach the store")
        assert time.perf_counter() - start < 45  # a 1 s read timeout, one try: never botocore's 60 s


def test_bad_storage_options_are_usage_errors_that_never_repeat_them(server):
    err = one_line_error(attnviz("--storage-options", '{"secret": "hunter2"', "inspect", "s3://bkt/w.npy"), 2,
                         "--storage-options", "not valid JSON")
    assert "hunter2" not in err
    one_line_error(attnviz("--storage-options", "[1]", "inspect", "s3://bkt/w.npy"), 2, "a JSON object")


def test_storage_options_from_a_file_and_the_environment(server, data, tmp_path, monkeypatch):
    """--storage-options FILE (a secret kept out of the process list) and ATTNVIZ_STORAGE_OPTIONS, flat or by
    scheme: here each points s3:// at an endpoint that refuses, so the run says it cannot reach the store."""
    from attnviz.storage import options_for

    refuse = {"s3": {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"max_attempts": 1}}}}
    (tmp_path / "options.json").write_text(json.dumps(refuse))
    one_line_error(attnviz("--storage-options", str(tmp_path / "options.json"), "inspect", f"{data.url}/a.npy"), 1,
                   "cannot reach the store")
    monkeypatch.setenv("ATTNVIZ_STORAGE_OPTIONS", json.dumps(refuse))
    one_line_error(attnviz("inspect", f"{data.url}/a.npy"), 1, "cannot reach the store")
    monkeypatch.setenv("ATTNVIZ_STORAGE_OPTIONS", json.dumps({"anon": False, "gs": {"token": "anon"}, **refuse}))
    assert options_for("s3") == {"anon": False, **refuse["s3"]}
    assert options_for("gs") == {"anon": False, "token": "anon"}


# ------------------------------------------------------------------ nothing half-written


def test_a_failed_run_leaves_no_object(server, data):
    bucket = server.bucket("failed")
    weights = np.full((2, 4, 4), 0.25, dtype=np.float32)
    weights[1, 2, 3] = np.nan
    buf = io.BytesIO()
    np.save(buf, weights)
    server.put(bucket, "nan.npy", buf.getvalue())
    result = attnviz("inspect", f"s3://{bucket}/nan.npy", "--png", f"s3://{bucket}/out/x.png", "--json-file",
                     f"s3://{bucket}/out/x.json", "--quiet")
    one_line_error(result, 1, "non-finite")  # found while the statistics are summed: after the outputs are reserved
    assert server.keys(bucket) == ["nan.npy"] and server.uploads(bucket) == []


def test_an_upload_that_fails_takes_the_others_with_it(server, data):
    bucket = server.bucket("partial")
    server.hook = lambda method, path, query: "fail" if "second" in path and "partNumber" in query else None
    try:
        once = '{"config_kwargs": {"retries": {"max_attempts": 1}}}'  # the injected error is not tried again
        result = attnviz("--storage-options", once, "inspect", f"{data.url}/attn.npz", "--png",
                         f"s3://{bucket}/first.png", "--json-file", f"s3://{bucket}/second.json", "--quiet")
    finally:
        server.hook = None
    one_line_error(result, 1, "second.json")
    assert server.keys(bucket) == [] and server.uploads(bucket) == []


def test_sigterm_while_uploading_leaves_no_object(server, data, tmp_path):
    bucket = server.bucket("stopped")
    server.holding.clear()
    server.release.clear()
    server.hook = lambda method, path, query: "hold" if method == "PUT" and "partNumber" in query else None
    env = {**os.environ, **server.env(), "ATTNVIZ_NO_SERVER": "1", "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "attnviz", "inspect", str(data.local / "attn.npz"), "--png",
                                 f"s3://{bucket}/out/grid.png", "--json-file", f"s3://{bucket}/out/doc.json",
                                 "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert server.holding.wait(60), "no upload began"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        server.release.set()
        out, err = proc.communicate(timeout=60)
    finally:
        server.hook = None
        server.release.set()
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "terminated" in err
    assert server.keys(bucket) == [] and server.uploads(bucket) == []
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(".attnviz.grid.png.*.staged.png"))


# ------------------------------------------------------------------ a local run stays local


def test_a_local_run_never_imports_fsspec(tmp_path):
    np.save(tmp_path / "w.npy", softmax(np.random.default_rng(3).normal(size=(2, 5, 5))))
    script = ("import atexit, runpy, sys\n"
              "atexit.register(lambda: open('modules.txt', 'w').write(' '.join(sorted(m for m in sys.modules if "
              "m.split('.')[0] in ('fsspec', 's3fs', 'botocore', 'aiobotocore', 'gcsfs', 'adlfs')))))\n"
              "sys.argv = ['attnviz', *sys.argv[1:]]\n"
              "runpy.run_module('attnviz', run_name='__main__', alter_sys=True)\n")
    for argv in (["inspect", "w.npy", "--png", "w.png", "--json-file", "w.json", "--quiet"],
                 ["batch", "--quiet", "--results", "r.jsonl", "--each", "*.npy", "--", "inspect", "{}", "--json-file",
                  "{stem}.doc.json"]):
        r = subprocess.run([sys.executable, "-c", script, *argv], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "ATTNVIZ_NO_SERVER": "1", "PYTHONPATH": str(ROOT)}, timeout=120)
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "modules.txt").read_text() == ""


def test_urls_are_told_from_paths():
    from attnviz.storage import Url, check_url, is_url, join

    assert is_url("s3://b/k.npy") and is_url("memory://x/y") and not is_url("C:/data/w.npy")
    assert not is_url("run.h5:attn/layer0") and not is_url("/data/s3:/w.npy")
    url = check_url("s3://bucket/dumps/run_2.npz")
    assert (url.name, url.suffix, url.stem, str(url.parent)) == ("run_2.npz", ".npz", "run_2", "s3://bucket/dumps")
    assert isinstance(url.parent, Url)
    assert join("s3://bucket/jobs", "acts/a.npz") == "s3://bucket/jobs/acts/a.npz"
    assert join("s3://bucket/jobs", "gs://other/a.npz") == "gs://other/a.npz"
    assert re.fullmatch(r".*/acts/a\.npz", join("/data", "acts/a.npz"))


def test_placeholders_and_keys_of_urls():
    from attnviz.batch.filemaps import expand
    from attnviz.io import split_spec

    url = "s3://bucket/acts/run_2.npz"
    assert expand("{dir}/out/{stem}.json|{name}|{}", url, 0) == f"s3://bucket/acts/out/run_2.json|run_2.npz|{url}"
    assert split_spec("s3://bucket/run.safetensors:layer.*.attention") == ("s3://bucket/run.safetensors",
                                                                          "layer.*.attention")
    assert split_spec("s3://bucket/w.npy") == ("s3://bucket/w.npy", None)


def test_a_url_runs_in_its_own_process_not_on_a_warm_worker():
    """The credentials and endpoint of a store are those of the shell the command was typed in."""
    from attnviz.worker.client import bypass_reason

    assert bypass_reason(["inspect", "s3://bucket/w.npy"], environ={}) == "a URL among the arguments"
    assert bypass_reason(["inspect", "w.npy", "--png=gs://b/x.png"], environ={}) == "a URL among the arguments"


def test_memory_urls_through_the_api(tmp_path):
    """memory:// (fsspec's own store, in this process) through the same code: reading and writing."""
    pytest.importorskip("fsspec")
    import fsspec

    import attnviz as api

    fs = fsspec.filesystem("memory")
    buf = io.BytesIO()
    w = softmax(np.random.default_rng(4).normal(size=(2, 5, 5)))
    np.save(buf, w)
    fs.pipe_file("/stores-test/w.npy", buf.getvalue())
    report = api.inspect("memory://stores-test/w.npy")
    np.testing.assert_array_equal(report.weights[0, 0], w)
    report.save("memory://stores-test/out/w.png")
    assert fs.cat_file("/stores-test/out/w.png").startswith(b"\x89PNG")

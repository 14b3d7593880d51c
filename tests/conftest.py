from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from attnviz.device import Device
from attnviz.io import Loaded
from attnviz.masks import build_mask
from attnviz.params import check as check_params
from attnviz.params import draw
from attnviz.variants import REGISTRY
from attnviz.variants.base import Context

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_inputs"
CPU = Device("CPU:0", "/CPU:0")

os.environ.setdefault("COLUMNS", "120")

# One compute thread per test process. The suite runs a worker per core and one more (pytest-xdist), and each
# worker's torch (OpenMP) and TensorFlow would size its thread pools for the whole machine: 3 x 2 threads on 2
# cores, whose OpenMP threads spin while they wait for each other. One thread each cut the suite's CPU time by
# a sixth (and its wall time from 4m08s to 3m28s on 2 cores). Set before torch or TensorFlow is imported (they
# read these once; nothing above imports them), and inherited by every subprocess the tests start; a value the
# caller set is kept.
for _name, _value in (("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"), ("TF_NUM_INTRAOP_THREADS", "1"),
                      ("TF_NUM_INTEROP_THREADS", "1")):
    os.environ.setdefault(_name, _value)


class LazyModule:
    """A module imported on first use of one of its attributes (a test that uses it is skipped where it is not
    installed, as with pytest.importorskip): torch and transformers cost every xdist worker ~4 s to import
    while it collects, though one worker runs the tests that need them (SHARED_UNITS)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):
        if attr.startswith("_") or attr.startswith("pytest"):  # what collection asks every module-level name
            raise AttributeError(attr)
        if self._module is None:
            self._module = pytest.importorskip(self._name)
        return getattr(self._module, attr)


def compute(name, q_array=None, k_array=None, v_array=None, /, *, inputs=None, keep=None, bias=None,
            dtype="float32", causal=False, causal_align="top-left", learned=None, seed=None, **params):
    """Run a registered variant on arrays, with masks built the way the command line builds them.

    ``keep`` and ``bias`` are given in the weights' shape (after any head axis). ``learned`` is a
    parameter dict (checked against the variant's specs like a --params file); ``seed`` draws them."""
    variant = REGISTRY[name]
    p = variant.params(**params)
    if inputs is None:
        inputs = {"q": q_array, "k": k_array, "v": v_array}
    loaded = {n: Loaded(np.asarray(a), n, None) for n, a in inputs.items() if a is not None}
    problem = variant.check(loaded, p, learned)
    if learned is not None:
        learned = check_params(learned, problem.specs, "test")
    elif problem.specs:
        learned = draw(problem.specs, seed or 0)
    mask = build_mask(problem.weights_shape, causal=causal, causal_align=causal_align, mask_shape=problem.mask_shape)
    for extra in (keep, problem.keep):
        if extra is not None:
            mask.keep = extra if mask.keep is None else np.logical_and(mask.keep, extra)
    mask.bias = bias
    arrays = {n: lo.data for n, lo in loaded.items()}
    return variant.compute(Context(CPU, dtype, seed=seed or 0), arrays, mask, p, learned or {})


@pytest.fixture
def samples() -> Path:
    return SAMPLES


@pytest.fixture
def socket_dir(tmp_path_factory) -> Path:
    """A fresh folder in pytest's temporary folder with a short path, for a worker's Unix socket: a socket's
    path holds at most 107 bytes, and ``tmp_path`` (``.../pytest-N/popen-gwN/<test name>/`` under xdist)
    leaves too few of them."""
    return tmp_path_factory.mktemp("rt")


def _build_cli_commands_once() -> None:
    """``CliRunner.invoke`` builds the whole Click command from the Typer app on every call
    (``typer.main.get_command``: 0.3-0.5 s for attnviz's commands, nearly all of an in-process test's
    time). Build it once per app and reuse it, as the console script (``attnviz.cli.runner``), the warm
    worker and ``batch`` reuse theirs. It is the command Typer builds, unchanged; one that gains or loses
    a command, group or callback is built anew."""
    import typer.testing

    build = getattr(typer.testing, "_get_command", None)
    if build is None:  # another Typer: leave it as it is
        return
    built: dict[tuple, tuple] = {}

    def get_command(app):
        key = (id(app), tuple(map(id, app.registered_commands)), tuple(map(id, app.registered_groups)),
               id(app.registered_callback), id(app.info), app._add_completion, app.rich_markup_mode)
        hit = built.get(key)
        if hit is None or hit[0] is not app:
            hit = built[key] = (app, build(app))
        return hit[1]

    typer.testing._get_command = get_command


_build_cli_commands_once()


def _cache_rewritten_test_modules() -> None:
    """pytest keeps the test modules it rewrites for its assertions in ``__pycache__`` (checked against
    each source's hash), except where no bytecode is written (PYTHONDONTWRITEBYTECODE): then every xdist
    worker rewrites and compiles every test module again, about half of collection's 11 s of CPU. Let it
    keep them; the processes the tests start keep the environment's setting."""
    import sys

    sys.dont_write_bytecode = False


_cache_rewritten_test_modules()


# Modules whose tests share what is built once for the module: under pytest-xdist each of them runs on one
# worker, and every other test wherever a worker is free (see pytest_xdist_make_scheduler).
ONE_WORKER = {
    "test_hostile_corpus": "its module fixture runs every case of the corpus that was collected, in one pool",
    "test_serve": "one warm worker serves the module's tests, and counts the requests",
    "test_browser": "one Chromium for the module",
    "test_kerashub": "KerasHub's import (~6 s) paid once, and its backbones built once for the module",
    "test_keras_monitor": "TensorFlow's import and the trained model with its event files made once for the module",
    "test_tensorboard": "one TensorBoard served and one Chromium for the module",
    "test_docs": "the site built once for the module (mkdocs build, ~5 s)",
    "test_architecture": "the package's sources parsed once for the module (~2 s)",
    "test_real_models": "SmolLM2 converted from its GGUF file once (~35 s the first time) and loaded by one worker",
}


# Units of work sent out before every other (their few tests take minutes): the real models' tier.
FIRST = ("test_real_models",)
# Tests that are units of their own and take 20 s and more on 2 cores (``module::function``: all its
# parametrisations): sent out after the units of many tests, before the other single tests. In collection order
# they came among the last (test_project's mypy, 30 s of CPU where its cache is cold; test_terminal's), and the
# run waited for them at its end.
LONG = tuple(f"{module}::{function}" for module, functions in (
    ("test_project", ("test_mypy",)),
    ("test_figures", ("test_coattention_two_panels_and_a_16_head_run_fit",
                      "test_panel_figures_keep_their_text_inside")),
    ("test_terminal", ("test_a_closed_pipe_exits_0_quietly",)),
    ("test_startup", ("test_tensorflow_start_up_lines_never_reach_the_user",
                      "test_tensorflow_start_up_lines_on_request")),
    ("test_scale_out", ("test_resume_after_sigkill", "test_readme_file_maps_run")),
    ("test_hardening_options", ("test_fuzz_option_values",)),
    ("test_hardening_inputs", ("test_stdin_binary_huge_and_deep",)),
    ("test_summary_pictures", ("test_stats_png_of_a_summary_draws_its_columns",)),
    ("test_api", ("test_the_example_notebook_runs_in_a_real_kernel_offline",)),
    ("test_signals", ("test_a_batch_signalled_between_jobs_keeps_whole_lines_and_resumes",)),
) for function in functions)


def _sent_order(queue: dict[str, dict]) -> list[str]:
    """The units of ``queue`` (scope -> its tests, largest first) in the order they are sent out: FIRST's, the other
    units of many tests, LONG's (in LONG's order), the other single tests."""
    first = [scope for scope in queue if _unit_key(scope) in FIRST]
    long = sorted((scope for scope in queue if _unit_key(scope) in LONG),
                  key=lambda scope: LONG.index(_unit_key(scope)))
    rest = [scope for scope in queue if scope not in first and scope not in long]
    return [*first, *(scope for scope in rest if len(queue[scope]) > 1), *long,
            *(scope for scope in rest if len(queue[scope]) <= 1)]


def _unit_key(scope: str) -> str:
    """A unit of work's name as FIRST and LONG give it: its module, or ``module::function`` for a single test."""
    path, _, name = scope.partition("::")
    stem = Path(path).stem
    return f"{stem}::{name.split('[', 1)[0]}" if name else stem


# Modules that run as one unit of work together, on one worker: each builds small models from transformers configs,
# and importing transformers' model classes costs a worker ~4-8 s of CPU; one worker pays it instead of every one.
SHARED_UNITS = {name: "transformers models" for name in
                ("test_families", "test_generation_words", "test_model_attention", "test_recipes")}
# The README's inputs (tests/test_readme_examples.py's ``folder``: models built and captured, ~6 s of CPU besides
# TensorFlow's, torch's and KerasHub's imports) are made once in a worker: the tests that read them run on one.
# A key is a module, or a module's test function (``module::function``: all its parametrisations).
SHARED_UNITS.update({name: "the README's inputs" for name in (
    "test_readme_examples",  # the examples run one after another in one folder
    "test_long_paths", "test_api::test_every_attention_type_gives_the_command_s_document",
    "test_api::test_every_file_option_of_every_function_takes_arrays")})
# The S3 server on the loopback (tests/s3server.py: moto's, one a process; moto, s3fs and botocore cost a worker
# ~3-4 s of CPU to import) serves test_object_stores (its buckets made once for the module), the scale-out
# examples that read from a bucket and the capture to a bucket: they run on one worker. The scale-out examples
# each compare their shards with one unsharded run of the same batch (test_scale_out's module fixture
# ``unsharded_example``, a process of its own), made once there.
SHARED_UNITS.update({name: "the S3 server's tests" for name in (
    "test_object_stores", "test_capture::test_cli_capture_to_a_bucket",
    *(f"test_scale_out::{name}" for name in (
        "test_slurm_array_example", "test_slurm_array_example_on_a_shared_folder",
        "test_kubernetes_indexed_job_example", "test_one_machine_examples")))})


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (pyproject.toml's default): the modules of ONE_WORKER each as one unit of work, the
    modules and tests of each SHARED_UNITS name as one, every other test as a unit of its own. xdist's own
    loadgroup groups by ``xdist_group`` marks through a suffix of the test ids, which pytest 9.2 no longer lets
    it set (every test would be a unit: the corpus would run on every worker); any such group is still kept
    together here."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        # units go out largest first (xdist's --loadscope-reorder, on by default): the corpus and the
        # warm worker's module start at once, single tests fill the gaps; the units of FIRST before all, whatever
        # their number of tests (a few long tests: sent last, they would end the run a minute or two late)
        def _assign_work_unit(self, node) -> None:
            # the units of FIRST go out before the rest, and the tests of LONG after the units of many tests, before
            # the other single tests (the queue is put in that order once; each worker's collection keeps its order:
            # a unit is sent as indices into the worker's own collection)
            if not getattr(self, "_ordered", False):
                self._ordered = True
                self.workqueue = type(self.workqueue)((scope, self.workqueue[scope])
                                                      for scope in _sent_order(self.workqueue))
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            _, marked, group = nodeid.rpartition("@")
            if marked and not any(c in group for c in "[]:/"):  # test_x[id]@group
                return group
            path, _, name = nodeid.partition("::")
            stem = Path(path).stem
            if stem in ONE_WORKER:
                return path
            return SHARED_UNITS.get(f"{stem}::{name.split('[', 1)[0]}") or SHARED_UNITS.get(stem, nodeid)

    return Scheduling(config, log)


def pytest_sessionstart(session) -> None:
    """Compile the package's modules to bytecode once, before anything runs (in the controller only under
    xdist). Where PYTHONDONTWRITEBYTECODE is set no Python process writes its ``__pycache__``, so each of the
    suite's hundreds of ``python -m attnviz`` processes would compile attnviz's modules again (most of the
    start-up time of a command that fails early). Nothing is compiled that Python would not compile itself:
    the cache is checked against each source's mtime and size as usual, and ``__pycache__`` is ignored by git."""
    if hasattr(session.config, "workerinput"):
        return
    import compileall

    try:
        compileall.compile_dir(ROOT / "attnviz", quiet=2)  # a module that does not compile fails its tests
    except OSError:  # a folder we may not write: each process compiles for itself, as before
        pass


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores this process may use. Many tests wait on the processes they
    start (cold runs, warm workers, batch shards, a browser); the extra worker keeps the cores busy meanwhile
    (on 2 cores: 3 workers, about a sixth less wall time than 2)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores + 1


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """An xdist worker, its session over and its results sent, then exits: its objects (TensorFlow's, torch's,
    transformers', every test module's) are frozen out of the garbage collector's last passes (gc.freeze), which
    took ~3 s of a worker's exit, while the run waits for its workers to end. Exit handlers and the rest of the
    interpreter's shutdown run as before; the memory goes back to the system with the process."""
    if hasattr(config, "workerinput"):
        import gc

        gc.freeze()

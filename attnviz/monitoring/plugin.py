"""The attnviz dashboard in TensorBoard: a plugin (``tensorboard_plugins`` entry point ``attnviz``) that shows the
offline HTML report's interactive head view (``attnviz.render.html``, what ``inspect --html`` writes) for any run
and step whose event files name a capture file of exact weights (``attnviz/capture``, written by
``attnviz.keras.AttentionMonitor`` with ``keep`` and by ``inspect --tensorboard``).

Routes, under ``/data/plugin/attnviz/``: ``index.js`` (the dashboard: a run and a step to choose, the report in a
frame), ``runs`` (each run's steps that have a capture file) and ``report?run=RUN&step=STEP`` (the report, its
scripts allowed by their hashes in TensorBoard's Content-Security-Policy). TensorBoard and werkzeug are imported
here only, when TensorBoard loads the plugin."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from attnviz.monitoring.tensorboard import PLUGIN, TAGS

ASSETS = Path(__file__).resolve().parent / "assets"


class AttnvizPlugin(base_plugin.TBPlugin):
    """TensorBoard's attnviz dashboard: the head view of a recording's capture file."""

    plugin_name = PLUGIN

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._data = context.data_provider

    def get_plugin_apps(self) -> dict[str, Any]:
        return {"/index.js": wrappers.Request.application(self._index),
                "/runs": wrappers.Request.application(self._runs),
                "/report": wrappers.Request.application(self._report)}

    def is_active(self) -> bool:
        return False  # active where a run holds its data (``data_plugin_names``)

    def data_plugin_names(self) -> tuple[str, ...]:
        return (PLUGIN,)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="attnviz")

    # -- what the event files name

    def captures(self, context: Any, experiment: str) -> dict[str, dict[int, str]]:
        """Per run, per step: the capture file that step's recording was made from."""
        listed = self._data.list_tensors(context, experiment_id=experiment, plugin_name=PLUGIN)
        wanted = {run: [TAGS["capture"]] for run, tags in listed.items() if TAGS["capture"] in tags}
        if not wanted:
            return {}
        from tensorboard.data import provider

        read = self._data.read_tensors(context, experiment_id=experiment, plugin_name=PLUGIN,
                                       downsample=10**6, run_tag_filter=provider.RunTagFilter(tags=[TAGS["capture"]]))
        out: dict[str, dict[int, str]] = {}
        for run in wanted:
            for datum in read.get(run, {}).get(TAGS["capture"], []):
                value = datum.numpy
                text = value.item() if hasattr(value, "item") else value
                out.setdefault(run, {})[int(datum.step)] = text.decode() if isinstance(text, bytes) else str(text)
        return out

    # -- routes

    def _index(self, request: Any) -> Any:
        return http_util.Respond(request, (ASSETS / "index.js").read_text(), "application/javascript")

    def _runs(self, request: Any) -> Any:
        from tensorboard import plugin_util

        context = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        found = self.captures(context, experiment)
        return http_util.Respond(request, {run: sorted(steps) for run, steps in found.items()}, "application/json")

    def _report(self, request: Any) -> Any:
        from tensorboard import plugin_util

        context = plugin_util.context(request.environ)
        experiment = plugin_util.experiment_id(request.environ)
        run = request.args.get("run", "")
        try:
            step = int(request.args.get("step", ""))
        except ValueError:
            return http_util.Respond(request, "step: a whole number", "text/plain", code=400)
        path = self.captures(context, experiment).get(run, {}).get(step)
        if path is None:
            return http_util.Respond(request, f"no capture file for run {run!r} at step {step}", "text/plain",
                                     code=404)
        if not Path(path).is_file():
            return http_util.Respond(request, f"{path}: the capture file is gone", "text/plain", code=404)
        page = report(path, f"{run}, step {step}")
        return http_util.Respond(request, page, "text/html", csp_scripts_sha256s=script_hashes(page))


def report(path: str, title: str) -> str:
    """The offline HTML report of a capture file, as ``attnviz inspect FILE --html`` writes it."""
    import attnviz

    return str(attnviz.inspect(path).html(title=title))


def script_hashes(page: str) -> list[str]:
    """The base64 SHA-256 of each inline script of ``page``: TensorBoard's Content-Security-Policy runs those alone."""
    return [base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            for body in re.findall(r"<script[^>]*>(.*?)</script>", page, re.S)]


class AttnvizPluginLoader(base_plugin.TBLoader):
    """The loader TensorBoard's ``tensorboard_plugins`` entry point names."""

    def load(self, context: base_plugin.TBContext) -> AttnvizPlugin:
        return AttnvizPlugin(context)

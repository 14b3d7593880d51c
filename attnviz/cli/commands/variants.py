"""``attnviz variants``: every attention type attnviz computes, with its formula."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from attnviz.streams import out_console, stdout
from attnviz.variants import REGISTRY


def variants_command(
    json_out: Annotated[bool, typer.Option("--json", help="print the list as JSON")] = False,
) -> None:
    """List every attention type attnviz computes, with its formula."""
    if json_out:
        import json

        doc = [{"name": v.name, "summary": v.summary, "formula": v.formula,
                "inputs": [i.name for i in v.inputs]} for v in REGISTRY.values()]
        stdout().write(json.dumps(doc, indent=2) + "\n")
        return
    table = Table(title="attention variants", pad_edge=False)  # rich wraps it to the width; long words fold
    table.add_column("command", style="bold", no_wrap=True)
    table.add_column("inputs")
    table.add_column("formula", overflow="fold")
    table.add_column("what it is", overflow="fold")
    for v in REGISTRY.values():
        table.add_row(v.name, " ".join(i.name.upper() for i in v.inputs), v.formula, v.summary)
    out_console().print(table)

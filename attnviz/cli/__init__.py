"""The command line (the only package that imports typer)."""

from attnviz.cli.app import app

__all__ = ["app"]

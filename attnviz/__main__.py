"""`python -m attnviz`."""

from attnviz.cli import app

app(prog_name="attnviz")

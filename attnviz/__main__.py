"""`python -m attnviz`: the console script (through a warm worker when one listens, see attnviz.worker.client)."""

from attnviz.cli import main

main()

"""attnviz: compute, inspect and visualise attention from the command line.

This module holds the version only: importing it must stay instant.
"""

__version__ = "0.1.0"

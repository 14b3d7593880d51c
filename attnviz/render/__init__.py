"""Renderers: rich tables, matplotlib heatmaps and the JSON document. They return objects; the
command line owns the console and the files."""

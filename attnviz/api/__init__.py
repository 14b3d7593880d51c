"""The Python API behind ``attnviz``'s top-level names (see ``attnviz/__init__.py``): ``values`` (arrays,
tensors and label lists handed over in memory), ``running`` (compute, the per-type functions, inspect,
compare, rollout, load) and ``results`` (the typed results). A face over the library, as the command
line is: both call the same functions."""

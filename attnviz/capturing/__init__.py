"""Capture from a live model: ``attnviz.capture(model)`` and ``attnviz capture MODEL_DIR``.

``capturing`` (the context manager), ``hf`` (transformers' attention interface), ``keras`` (Keras'
``MultiHeadAttention`` layers), ``recorder`` (sites, streaming, generate()'s steps; the file itself is
``attnviz.capturefile``, which inspection reads too), ``folder`` (a local model folder for the command line).
torch, transformers and Keras are imported inside the functions that need them: importing this package
costs nothing.
"""

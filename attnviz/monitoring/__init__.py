"""Attention watched over time: a Keras model's attention recorded while it trains (``callback``:
``attnviz.keras.AttentionMonitor``), the head statistics inspect reports of any file (``records``), and
TensorBoard's event files written from them (``tensorboard``). TensorFlow and Keras are imported inside the
functions that need them: ``import attnviz`` stays free of them."""

"""``attnviz view``: an interactive terminal viewer of saved attention weights (a Textual application).

``model`` holds what the viewer shows, without Textual: the weights of one batch entry as ``inspect``
reads them, the head statistics and tags, the selected layer and head, the order heads are walked in,
the cursor, token search and the rollout; maps are reduced before they are drawn (thumbnails once, the
selected map to at most ``attnviz.blocks.MAX_SIDE`` a side), so a long map never blocks a key press.
``summary`` is the same model over a summary capture (each head's pooled map and the summary's head table).
``app`` is the Textual application over either; Textual is imported only when ``attnviz view`` runs.
"""

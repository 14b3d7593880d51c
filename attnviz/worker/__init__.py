"""The warm worker (``attnviz serve``): a process that keeps TensorFlow and the command line imported
and runs the commands of this user's ``attnviz`` invocations.

``protocol``: where it listens, who may talk to it, the frames (standard library only); ``client``:
the console script's side, sending a command to the worker (standard library only); ``server``: the
worker, handed the command line's runner; ``control``: starting, stopping and asking after it.
"""

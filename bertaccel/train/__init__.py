"""The training core: the loop (loop.py) and what hangs on its events (events.py), one step's
pieces, step graphs, warm-up and compile, data parallel ranks, checkpointing, batch fitting."""

"""How CPU processes that train at once share the host's cores."""
from __future__ import annotations

import os


def share_the_cores(processes: int) -> None:
    """CPU processes that train at once (the ranks of a run, the runs of launcher.runs_at_once)
    split the cores between them. torch gives every process a thread per core, and threads that
    spin against each other for the same cores slow each run more than fewer threads do: two CPU
    runs side by side on 2 cores took 92 s each with 2 threads apiece against 46 s with one (alone:
    28 s), so each would have measured the other. The user's OMP_NUM_THREADS wins."""
    if processes > 1 and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // processes))

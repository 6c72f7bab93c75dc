"""Issue 61, typed once, the runs/ slice: a sweep through submitit (hydra/launcher=local_jobs,
submitit's local executor: a process of its own per job, as on SLURM) converts each
configuration's config to the typed RunConfig once, in the submitting process (runs/sweep_plan.py);
the job's process gets that RunConfig in its pickled arguments and converts nothing again."""
from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest
from conftest import TINY, conversion_counter, sweep_children
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Every Python process of the sweep (the submitting one and each submitit job's) imports this at
# start-up (a sitecustomize on PYTHONPATH) and counts checks.validate's and checks.typed's
# conversions of a config not typed yet; each process writes its counts to its own file at exit.
SITECUSTOMIZE = "import os\nif os.environ.get('COUNTS_DIR'):\n" + textwrap.indent(
    conversion_counter('os.path.join(os.environ["COUNTS_DIR"], f"{os.getpid()}.json")'), "    ")


@pytest.mark.slow
def test_a_submitit_job_converts_its_config_no_second_time(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    counts_dir = tmp_path / "counts"
    counts_dir.mkdir()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COUNTS_DIR": str(counts_dir),
           "PYTHONPATH": os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH")) if p)}
    # inline: the run in the job's own process (the job's process is what is counted here)
    r = warm_cli.run([sys.executable, "-m", "bertaccel.run", "-m", "hydra/launcher=local_jobs", *TINY,
                      "launcher.name=inline", "train.epochs=1", "train.max_steps_per_epoch=2", "train.seed=1,2",
                      "sweep.baseline=false", f"tracking.uri={store}", f"cache_dir={tmp_path / 'cache'}"],
                     cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Submitted 2 local job(s)" in r.stdout + r.stderr
    runs = sweep_children(store)
    assert sorted(x.data.tags.get("status") for x in runs) == ["finished", "finished"]
    jobs = {int(x.data.tags["pid"]) for x in runs}  # the job processes, one per configuration
    assert len(jobs) == 2 and os.getpid() not in jobs
    counts = {int(f.stem): json.loads(f.read_text()) for f in counts_dir.glob("*.json")}
    assert jobs <= set(counts), (jobs, counts)  # (each job's process was counted)
    for pid in jobs:  # a job converts nothing: its RunConfig came typed from the submitting process
        assert counts[pid] == {"validate": 0, "typed": 0}, counts
    # the whole sweep, all processes: once per configuration (the sweep's plan)
    assert sum(c["validate"] for c in counts.values()) == 2, counts
    assert sum(c["typed"] for c in counts.values()) == 2, counts

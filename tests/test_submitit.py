"""Sweeps through submitit (hydra/launcher=local_jobs: submitit's local executor, the jobs of
hydra/launcher=slurm as processes of this machine): one process per configuration, every run
in MLflow once, a job killed from outside recorded and run again by the same command."""
from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter

import psutil
import pytest
from conftest import TINY, sweep_children
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from bertaccel.config import CONF_DIR, register_configs
from bertaccel.record.tracking import search_runs
from hydra_plugins.bertaccel_launcher.submitit_launchers import BertaccelSlurmLauncher, resources_problem
import warm_cli  # (tests/warm_cli.py: bertaccel commands forked from a warm parent)

# Four good configurations and a bad one (lr < 0). inline: the run in the job's own process (one
# fresh interpreter per job is what is tested here; a forkserver in each job would double the
# imports on a 2-core CI machine).
# 32 tokens a row: what is checked is which jobs ran and how they ended, not what they learnt; the
# 256 rows keep each run "running" long enough (seconds, four jobs on two cores) to be seen and killed.
SWEEP = ["-m", "hydra/launcher=local_jobs", "optimizer.lr=1e-4,2e-4,3e-4,4e-4,-1", "launcher.name=inline",
         *TINY, "dataset.train_subset=256", "dataset.max_length=32"]
BAD = "optimizer.lr=-1"


def _kill_job_running(pid: int) -> int:
    """SIGKILL the submitit job (its task process and everything under it) that runs process pid,
    as a scheduler ends a job; returns the task's pid."""
    proc = psutil.Process(pid)
    task = next(p for p in [proc, *proc.parents()] if "submitit.core._submit" in " ".join(p.cmdline()))
    for p in [task, *task.children(recursive=True)]:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return task.pid


@pytest.mark.slow
def test_four_jobs_land_four_runs_a_bad_one_is_not_submitted_a_killed_one_is_resumed(cli):
    cmd = [sys.executable, "-m", "bertaccel.run", *SWEEP, f"tracking.uri={cli.store}",
           f"cache_dir={cli.dir / 'cache'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # output to files, not pipes: nobody reads a pipe while the test watches the store
    out_file, err_file = open(cli.dir / "sweep.out", "w+"), open(cli.dir / "sweep.err", "w+")
    sweep = warm_cli.popen(cmd, cwd=cli.dir, env=env, stdout=out_file, stderr=err_file)
    killed, deadline = None, time.time() + 300
    while killed is None and time.time() < deadline and sweep.poll() is None:
        # (in a job: the bad configuration's record is "running" for an instant in the sweep's process)
        running = [r for r in sweep_children(cli.store)
                   if r.data.tags.get("status") == "running" and "scheduler_job_id" in r.data.tags]
        if running:
            killed = running[0]
            _kill_job_running(int(killed.data.tags["pid"]))
        time.sleep(0.1)
    sweep.wait(timeout=300)
    out, err = (cli.dir / "sweep.out").read_text(), (cli.dir / "sweep.err").read_text()
    out_file.close(), err_file.close()
    assert killed is not None, "no run was seen running: " + err[-2000:]
    assert sweep.returncode == 0, err[-3000:]  # the other three finished
    assert "5 runs: finished=3 skipped=0 failed=1 interrupted=1" in out, out[-3000:]
    # the bad one: refused and recorded here, before submission; the four others submitted
    assert f"error in run {BAD}: optimizer.lr=-1.0 must be > 0" in err
    assert "Submitted 4 local job(s)" in out + err

    runs = {k.info.run_name: k for k in sweep_children(cli.store)}
    assert runs.pop(BAD).data.tags["status"] == "failed" and len(runs) == 4
    kids = list(runs.values())
    # one submitit job, hence one process, per configuration; none for the bad one
    assert len({k.data.tags["scheduler_job_id"] for k in kids}) == 4
    assert {k.data.tags["scheduler"] for k in kids} == {"local"}
    (dead,) = [k for k in kids if k.info.run_id == killed.info.run_id]
    assert dead.data.tags["status"] == "interrupted" and dead.info.status == "KILLED"
    assert f"local job {dead.data.tags['scheduler_job_id']} ended without a result" in dead.data.tags["reason"]
    (parent,) = [r for r in search_runs(cli.store, "bertaccel") if r.data.tags.get("bertaccel.role") == "sweep"]
    assert parent.data.tags["runs_interrupted"] == "1" and parent.data.tags["runs_finished"] == "3"
    assert parent.data.tags["runs_failed"] == "1"
    assert {k.data.tags["mlflow.parentRunId"] for k in kids} == {parent.info.run_id}

    rerun = warm_cli.run(cmd, cwd=cli.dir, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Submitted 1 local job(s)" in rerun.stdout + rerun.stderr  # the finished three are not submitted
    assert "resumed: already finished=3, failed/skipped before and not retried=1" in rerun.stdout
    kids = [k for k in sweep_children(cli.store) if k.info.run_name != BAD]
    finished = Counter(k.data.tags["config_hash"] for k in kids if k.data.tags["status"] == "finished")
    assert len(finished) == 4 and set(finished.values()) == {1}  # each configuration exactly once
    assert killed.data.tags["config_hash"] in finished
    assert Counter(k.data.tags["status"] for k in kids)["interrupted"] == 1


@pytest.mark.slow
def test_hydras_own_submitit_launcher_is_refused_with_the_preset_to_use(cli):
    proc = cli(["-m", "hydra/launcher=submitit_slurm", "train.seed=1,2", *TINY])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "hydra/launcher=slurm" in proc.stderr


@pytest.mark.parametrize("overrides, params, problem", [
    (["num_gpus=2"], {"gpus_per_node": 1}, "num_gpus=2 but its job asks for gpus_per_node=1; use hydra/launcher=slurm_ddp"),
    (["num_gpus=2"], {"gpus_per_node": 2}, None),
    (["num_gpus=4"], {"gpus_per_node": None, "gpus_per_task": 2}, "num_gpus=4 but its job asks for gpus_per_task=2"),
    (["num_gpus=2", "train.device=cpu"], {"gpus_per_node": 1}, None),  # gloo ranks on the CPU
    ([], {"gpus_per_node": 1, "tasks_per_node": 4}, "tasks_per_node=4 nodes=None: give 1 and 1"),
    ([], {"gpus_per_node": 1, "nodes": 2}, "tasks_per_node=None nodes=2: give 1 and 1"),
])
def test_a_jobs_gpus_must_hold_its_ranks(compose_cfg, overrides, params, problem):
    got = resources_problem(compose_cfg(overrides), params)
    assert got == problem if problem is None else problem in got


@pytest.mark.parametrize("preset, gpus", [("slurm_gpu", "--gpus-per-node=1"), ("slurm_ddp", "--gpus-per-task=4")])
def test_slurm_presets_ask_for_the_runs_gpus_as_one_task(preset, gpus, tmp_path, monkeypatch):
    # submitit's SLURM executor wants an `srun` on PATH before it writes anything; nothing runs it here.
    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={preset}", "num_gpus=4",
                                                       "hydra.launcher.partition=gpu"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert params.pop("_target_").endswith("submitit_launchers.BertaccelSlurmLauncher")
    assert (params["tasks_per_node"], params["nodes"]) == (1, 1)
    problem = resources_problem(cfg, params)  # num_gpus=4: one GPU per job is refused before submission
    assert problem is None if preset == "slurm_ddp" else "use hydra/launcher=slurm_ddp" in problem
    # What SLURM would get: the batch file submitit writes for such a job (no cluster needed to write it).
    params["submitit_folder"] = str(tmp_path / "submitit")
    executor = BertaccelSlurmLauncher(**params)._executor(params)
    sbatch = executor._executor._make_submission_file_text("python -c pass", "uid")
    assert f"#SBATCH {gpus}\n" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert "#SBATCH --partition=gpu" in sbatch and "#SBATCH --time=240" in sbatch

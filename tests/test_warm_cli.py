"""tests/warm_cli.py: a command forked from the warm parent answers as the same command started in a
new interpreter (exit status, stdout, stderr), each command in a process of its own, and what the
parent cannot serve as subprocess.run would goes to subprocess.run."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import warm_cli

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _both(args, cwd, module="bertaccel.run"):
    cmd = [sys.executable, "-m", module, *args]
    return (subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV, timeout=300),
            warm_cli.run(cmd, cwd=cwd, capture_output=True, text=True, env=ENV, timeout=300))


@pytest.mark.parametrize("module, args", [
    ("bertaccel.run", ["precision=bogus", "train.batch_size=-3"]),    # a refusal: one line, exit 2
    ("bertaccel.run", ["seed=1"]),                                     # an unknown setting
    ("bertaccel.report", ["--csv", "missing.csv"]),                    # the report's refusal
    ("bertaccel.plan", ["--bogus"]),                                   # argparse's exit 2
])
def test_a_forked_command_says_what_a_new_interpreter_says(tmp_path, module, args):
    fresh, forked = _both(args, tmp_path, module)
    assert fresh.returncode != 0
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """Three small modules on the path of a warm parent of their own: one that reports its process,
    one that raises, one that sleeps."""
    root = tmp_path_factory.mktemp("probes")
    for name, source in {
        "probe": ("import os, sys\n"
                  "print(os.getpid(), os.getcwd(), os.environ.get('LEFT_BY_LAST'), sys.argv[1:])\n"
                  "os.environ['LEFT_BY_LAST'] = 'yes'\n"
                  "raise SystemExit(int(sys.argv[1]))\n"),
        "boom": "raise ValueError('the message')\n",
        "slow": "import time\nprint('started', flush=True)\ntime.sleep(60)\n",
    }.items():
        (root / name).mkdir()
        (root / name / "__main__.py").write_text(source)
    env = {**ENV, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    parent = warm_cli.Warm(env)
    assert parent.started()
    yield parent, env, root
    parent.close()


def test_each_command_is_a_process_of_its_own_with_its_own_directory_and_environment(probes, tmp_path):
    """Two commands one after the other: each sees its own working directory and environment, and
    what one does to its process (here: a variable it sets) is gone for the next."""
    parent, env, _ = probes
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    before = parent.forked
    first = parent.run("probe", ["3"], a, env, 60)
    second = parent.run("probe", ["0"], b, env, 60)
    assert parent.forked == before + 2
    pid1, cwd1, left1, argv1 = first.stdout.split(maxsplit=3)
    pid2, cwd2, left2, _ = second.stdout.split(maxsplit=3)
    assert (first.returncode, second.returncode) == (3, 0)
    assert pid1 != pid2 and str(parent.proc.pid) not in (pid1, pid2)
    assert (cwd1, cwd2) == (str(a), str(b))
    assert left1 == left2 == "None"
    assert argv1.strip() == "['3']"


def test_an_uncaught_exception_ends_the_command_as_it_ends_an_interpreter(probes, tmp_path):
    parent, env, _ = probes
    done = parent.run("boom", [], tmp_path, env, 60)
    assert done.returncode == 1
    assert done.stderr.rstrip().endswith("ValueError: the message") and "Traceback" in done.stderr


def test_a_command_past_its_timeout_is_killed_as_subprocess_run_kills_it(probes, tmp_path):
    parent, env, _ = probes
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        parent.run("slow", [], tmp_path, env, 2)
    assert "started" in caught.value.output
    assert parent.run("probe", ["0"], tmp_path, env, 60).returncode == 0  # (the parent serves on)


def test_what_the_parent_cannot_serve_goes_to_subprocess_run(tmp_path):
    """Another program, input on stdin, or output not captured as text: subprocess.run itself."""
    done = warm_cli.run([sys.executable, "-c", "print(41 + 1)"], capture_output=True, text=True)
    assert done.stdout == "42\n"
    fed = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--help"], input="", capture_output=True,
                       text=True)
    assert fed.returncode == 0 and "usage: python -m bertaccel.report" in fed.stdout
    raw = warm_cli.run([sys.executable, "-m", "bertaccel.report", "--help"], capture_output=True)
    assert isinstance(raw.stdout, bytes)


def test_a_commands_forkserver_is_forked_from_it_without_its_imports_and_ends_with_it(tmp_path):
    """A sweep's runs fork from the command's own forkserver as always, but that server is forked
    from the command (which the warm parent gave the preload) instead of a new interpreter importing
    the preload again: it is the command's child, named as a forkserver (the code and the tests find
    it by that), spends well under the 5-8 CPU-seconds of an imported preload, and is gone when the
    command has ended."""
    import threading
    import time

    import psutil

    warm = warm_cli._parent(ENV)
    assert warm is not None and warm.proc is not None
    seen: dict = {}

    def watch() -> None:
        while "done" not in seen:
            try:
                for command in psutil.Process(warm.proc.pid).children():
                    for child in command.children():
                        if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                            seen.setdefault("server", child.pid)
                            seen["parent"] = child.ppid() == command.pid
                            seen["cpu_s"] = sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = warm_cli.run([sys.executable, "-m", "bertaccel.run", "-m", "model=tiny", "train.device=cpu",
                          "dataset.train_subset=32", "dataset.test_subset=16", "train.batch_size=16", "train.seed=1,2",
                          f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}", f"cache_dir={tmp_path / 'cache'}"],
                         cwd=tmp_path, capture_output=True, text=True, env=ENV, timeout=300)
    finally:
        seen["done"] = True
        watcher.join()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 runs: finished=2" in r.stdout, r.stdout[-2000:]
    assert "server" in seen and seen["parent"], seen
    assert seen["cpu_s"] < 2.0, seen
    deadline = time.time() + 10
    while psutil.pid_exists(seen["server"]) and psutil.Process(seen["server"]).status() != psutil.STATUS_ZOMBIE:
        assert time.time() < deadline, "the command's forkserver outlived it"
        time.sleep(0.1)


def test_popen_serves_commands_side_by_side_with_pipes_files_and_signals(probes, tmp_path):
    """warm_cli.popen: two commands held at once (the parent serves the second while the first
    runs), each with the pipes or file it was given, its own session where asked, its exit status
    from poll/wait/communicate, and a signal ending it as it ends a process Popen started."""
    import signal

    parent, env, _ = probes
    slow = [sys.executable, "-m", "slow"]
    with open(tmp_path / "out.txt", "w") as out:
        held = warm_cli._popen_from(parent, slow, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
    assert held.poll() is None
    quick = warm_cli._popen_from(parent, [sys.executable, "-m", "probe", "3"], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_text, err_text = quick.communicate(timeout=60)
    assert quick.returncode == 3 and out_text.split()[1:3] == [str(tmp_path), "None"] and err_text == ""
    assert os.getsid(held.pid) == held.pid != os.getsid(0)  # (start_new_session: a group to signal)
    with pytest.raises(subprocess.TimeoutExpired):
        held.wait(timeout=0.2)
    os.killpg(held.pid, signal.SIGTERM)
    assert held.wait(timeout=30) == -signal.SIGTERM
    assert (tmp_path / "out.txt").read_text() == "started\n"
    assert warm_cli.popen([sys.executable, "-c", "pass"]).wait(timeout=60) == 0  # (another program: Popen)


def test_a_popen_command_says_what_a_new_interpreter_says(tmp_path):
    cmd = [sys.executable, "-m", "bertaccel.run", "precision=bogus", "train.batch_size=-3"]
    fresh = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    forked = warm_cli.popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert isinstance(forked, warm_cli.WarmProcess)
    assert forked.communicate(timeout=300) == fresh.communicate(timeout=300)
    assert forked.returncode == fresh.returncode == 2


def test_past_max_parents_the_least_recent_idle_parent_makes_way_and_a_busy_one_does_not(monkeypatch, tmp_path):
    """A new environment past MAX_PARENTS stops the least recently used parent that runs nothing
    (a parent's start costs less than a command's new interpreter); one holding a command it runs
    is kept, and the command goes to subprocess."""
    monkeypatch.setattr(warm_cli, "_parents", {})
    monkeypatch.setattr(warm_cli, "MAX_PARENTS", 1)
    envs = [{**ENV, "BERTACCEL_TEST_PARENT": str(i)} for i in range(3)]
    cmd = [sys.executable, "-m", "bertaccel.run", "seed=1"]  # (an unknown setting: refused at once)
    try:
        assert warm_cli.run(cmd, cwd=tmp_path, env=envs[0], capture_output=True, text=True).returncode == 2
        (first,) = warm_cli._parents.values()
        assert warm_cli.run(cmd, cwd=tmp_path, env=envs[1], capture_output=True, text=True).returncode == 2
        (second,) = warm_cli._parents.values()
        assert second is not first and first.proc.poll() is not None and second.forked == 1
        held = warm_cli.popen([*cmd[:3], "model=tiny", "train.device=cpu", "dataset.train_subset=4000",
                               "train.max_steps_per_epoch=100000", f"tracking.uri=sqlite:///{tmp_path / 'm.db'}"],
                              cwd=tmp_path, env=envs[1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert isinstance(held, warm_cli.WarmProcess) and second.busy == 1
        assert warm_cli._parent(envs[2]) is None and list(warm_cli._parents.values()) == [second]
        held.kill()
        assert held.wait(timeout=60) == -9 and second.busy == 0
    finally:
        for parent in warm_cli._parents.values():
            parent.close()

"""Bad input on the command line: one line naming the valid options, exit 2, nothing written."""
from __future__ import annotations

import pytest

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

# (overrides, words the one stderr line must contain)
BAD = {
    "unknown_precision": (["precision=fp4"], ["precision=fp4", "bf16", "fp16", "fp32", "fp8"]),
    "unknown_hardware": (["hardware=tpu"], ["hardware=tpu", "auto", "cpu", "h100"]),
    "not_a_float": (["optimizer.lr=abc"], ["optimizer.lr=abc", "float"]),
    "schema_is_no_option": (["precision=precision_schema"], ["precision=precision_schema", "fp32"]),
    "csv_without_test_path": (["dataset=csv", "dataset.train_path=/nonexistent"], ["dataset.test_path"]),
    "csv_missing_file": (["dataset=csv", "dataset.train_path=/nonexistent", "dataset.test_path=/nonexistent2"],
                         ["dataset.train_path=/nonexistent", "no such file"]),
}


def test_every_problem_is_a_line_of_its_own_exit_2_and_nothing_written(cli):
    """Three problems (two options' own and a rule between sections): three lines, each one
    starting with "error: ", exit 2, nothing written."""
    r = cli(["model=tiny", "train.device=cpu", "dataset.train_subset=16", "dataset.test_subset=16",
             "accumulation=0", "compile.mode=fast", "num_gpus=2", "freezing=layerwise"], timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert lines == [
        "error: compile.mode='fast' is not one of off, default, max-autotune, reduce-overhead",
        "error: accumulation=0 must be an integer >= 1 or adaptive",
        "error: num_gpus=2 with freezing=layerwise: DDP registers its gradient hooks once, for the parameters "
        "trainable at the start; use num_gpus=1 or freezing=none"], r.stderr[-3000:]
    assert not (cli.dir / "outputs").exists()
    assert not (cli.dir / "mlflow.db").exists()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, name):
    overrides, words = BAD[name]
    r = cli(["model=tiny", "train.device=cpu", "train.max_steps_per_epoch=1", "dataset.train_subset=16",
             "dataset.test_subset=16", *overrides], timeout=300)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("error: ")
    for w in words:
        assert w.lower() in lines[0].lower(), lines[0]
    assert "_schema" not in lines[0].replace("precision=precision_schema", "")
    assert not (cli.dir / "outputs").exists()
    assert not (cli.dir / "mlflow.db").exists()
    assert not (cli.dir / "cache").exists()

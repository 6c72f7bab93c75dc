"""Bad input on the command line: one line naming the valid options, exit 2, nothing written."""
from __future__ import annotations

import pytest

# Every test here starts a real process (the CLI, a script, a server) or trains: slow (docs/contributing.md).
pytestmark = pytest.mark.slow

# (overrides, words the one stderr line must contain)
BAD = {
    "unknown_precision": (["precision=fp8"], ["precision=fp8", "bf16", "fp16", "fp32"]),
    "unknown_hardware": (["hardware=tpu"], ["hardware=tpu", "auto", "cpu", "h100"]),
    "not_a_float": (["optimizer.lr=abc"], ["optimizer.lr=abc", "float"]),
    "schema_is_no_option": (["precision=precision_schema"], ["precision=precision_schema", "fp32"]),
    "csv_without_test_path": (["dataset=csv", "dataset.train_path=/nonexistent"], ["dataset.test_path"]),
    "csv_missing_file": (["dataset=csv", "dataset.train_path=/nonexistent", "dataset.test_path=/nonexistent2"],
                         ["dataset.train_path=/nonexistent", "no such file"]),
}


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

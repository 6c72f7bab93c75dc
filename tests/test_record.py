"""What a run's record says ran: the shape of the model it built and the hardware profile it priced with."""
from __future__ import annotations

import pytest
import yaml
from mlflow import MlflowClient

from bertaccel.config import ConfigError
from bertaccel.options.checks import validate
from bertaccel.record.run_record import run_settings
from bertaccel.record.tracking import runs_by_status

SHAPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@pytest.mark.slow
def test_pretrained_default_run_records_the_built_shape_and_the_resolved_profile(cli):
    # The defaults a new user gets: model=minilm_l6 (pretrained, 384/6/12/1536), hardware=auto.
    r = cli(["train.device=cpu", "dataset.train_subset=16", "dataset.test_subset=16", "dataset.max_length=32",
             "train.batch_size=8", "train.eval_batch_size=16", "train.max_steps_per_epoch=2"])
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = runs_by_status(cli.store, "bertaccel")["finished"]
    # The built shape and the profile restate the model and hardware choices: tags config.*,
    # read back with the params by run_settings (record/run_record.py).
    params, metrics = run_settings(run), run.data.metrics
    assert not any(k.startswith(("model.", "hardware.")) for k in run.data.params)
    assert {k: params.get(f"model.{k}") for k in SHAPE} == {
        "hidden_size": "384", "num_hidden_layers": "6", "num_attention_heads": "12", "intermediate_size": "1536"}
    assert params["hardware"] == "auto"  # the choice as typed; hardware.* is the profile it resolved to
    assert params["hardware.name"] == "cpu" and float(params["hardware.price_per_gpu_hour_usd"]) == 0.0893
    assert metrics["cost_usd"] == pytest.approx(metrics["train_time_s"] / 3600 * 0.0893)
    client = MlflowClient(cli.store)
    config = yaml.safe_load(open(client.download_artifacts(run.info.run_id, "config.yaml", str(cli.dir))))
    # The config has no shape of its own for a pretrained model (the weights have it): null, not a default.
    assert {k: config["model"][k] for k in SHAPE} == dict.fromkeys(SHAPE)
    assert config["hardware"]["name"] == "cpu" and config["hardware"]["price_per_gpu_hour_usd"] == 0.0893


@pytest.mark.slow  # several seconds on one core: the full suite runs it, the inner loop does not
def test_shape_fields_are_for_random_init_models_only(compose_cfg):
    assert {k: compose_cfg([]).model[k] for k in SHAPE} == dict.fromkeys(SHAPE)
    tiny = compose_cfg(["model=tiny"]).model
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads, tiny.intermediate_size) == (32, 2, 2, 64)
    with pytest.raises(ConfigError, match=r"^model.hidden_size=768: model=minilm_l6 is pretrained"):
        validate(compose_cfg(["model.hidden_size=768"]))
    with pytest.raises(ConfigError, match=r"^model=tiny \(random_init\) needs model.intermediate_size"):
        validate(compose_cfg(["model=tiny", "model.intermediate_size=null"]))

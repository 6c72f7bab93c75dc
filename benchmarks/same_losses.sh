#!/usr/bin/env bash
# Behaviour unchanged? The default job and a 2x2 sweep on the CPU, run from a source tree SRC (a
# checkout or `git archive` of any commit), their final losses and accuracies written to
# OUT/losses.txt. Run it for the tree before a refactor and the tree after, then diff the two files
# (docs/results/index.md, issue 45): the same ops in the same order give the same bits on a CPU.
#
#   bash benchmarks/same_losses.sh SRC OUT [OVERRIDES ...]
#
# OVERRIDES go to both commands (tests/test_same_losses.py: the tiny model, two steps an epoch).
set -u
src=$(cd "${1:?usage: same_losses.sh SRC OUT [OVERRIDES ...]}" && pwd); out=${2:?usage: same_losses.sh SRC OUT [OVERRIDES ...]}
shift 2
mkdir -p "$out" && cd "$out" || exit 2
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=$src
start=$(date +%s)
python -m bertaccel.run train.device=cpu cache_dir="$PWD/cache" "$@" > default.log 2>&1
python -m bertaccel.run -m train.device=cpu cache_dir="$PWD/cache" dataset.train_subset=1024 dataset.test_subset=256 \
  accumulation=1,2 freezing=none,layerwise sweep.baseline=false "$@" > sweep.log 2>&1
python - > losses.txt <<'PY'
import mlflow
client = mlflow.tracking.MlflowClient("sqlite:///mlflow.db")
experiment = client.get_experiment_by_name("bertaccel")
for run in sorted(client.search_runs([experiment.experiment_id]), key=lambda r: r.info.run_name or ""):
    if "train_loss" in run.data.metrics:
        history = [m.value for m in client.get_metric_history(run.info.run_id, "train_loss")]
        print(run.info.run_name, "train_loss", history, "test_accuracy", run.data.metrics.get("test_accuracy"))
PY
echo "elapsed $(( $(date +%s) - start )) s" >> losses.txt
cat losses.txt

#!/usr/bin/env bash
# sweep.concurrent's projection against the same sweep run one run at a time, in one call on one
# machine (issue 62, item 2): the sweep is run twice from scratch (its own store and compile cache
# each), alone (sweep.concurrent=1) then shared (sweep.concurrent=N), each command's wall time
# measured around it, then benchmarks/exclusive_proof.py's table.
#
#   bash benchmarks/exclusive_proof.sh OUT N [--config-name NAME] OVERRIDES ...
#
# e.g. the design card's sweep with 2 repeats, 4 runs at a time:
#   bash benchmarks/exclusive_proof.sh out/card 4 -m precision=fp16,fp32 attention=xformers,triton sweep.repeats=2
set -u
out=${1:?usage: exclusive_proof.sh OUT N OVERRIDES ...}; n=${2:?usage: exclusive_proof.sh OUT N OVERRIDES ...}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" && out=$(cd "$out" && pwd)
for mode in alone shared; do
  concurrent=1; [ "$mode" = shared ] && concurrent=$n
  start=$(date +%s%N)
  python -m bertaccel.run "$@" "sweep.concurrent=$concurrent" "tracking.uri=sqlite:///$out/$mode.db" \
    "cache_dir=$out/cache-$mode" "hydra.sweep.dir=$out/multirun-$mode" > "$out/$mode.log" 2>&1
  rc=$?
  end=$(date +%s%N)
  echo "$mode: sweep.concurrent=$concurrent, exit $rc, command wall $(( (end - start) / 1000000 )) ms" | tee -a "$out/walls.txt"
  grep -E "^[0-9]+ runs: " "$out/$mode.log" | tail -1
done
python "$here/exclusive_proof.py" --alone "sqlite:///$out/alone.db" --shared "sqlite:///$out/shared.db" --out "$out/table.md"
cat "$out/walls.txt"

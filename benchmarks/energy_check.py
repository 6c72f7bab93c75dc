"""Check a sweep's NVML energy against nvidia-smi, read independently, and print its metrics.

    python benchmarks/energy_check.py --out energy_check -- precision=fp32,bf16 profile=true ...
    python benchmarks/energy_check.py --out energy_check --table-only     # no GPU needed

Starts `nvidia-smi` logging power every 100 ms, runs `python -m bertaccel.run -m <overrides>`
into its own MLflow store (<out>/mlflow.db), then integrates the nvidia-smi power samples over
each run's training windows (the `train_windows_unix` tag) and compares that with the run's
`energy_kwh` (NVML energy counter). Prints one side-by-side table (also <out>/energy_check.md),
and the change in energy per sample of each precision against fp32.

--table-only builds the table from a store already there (<out>/mlflow.db, and the nvidia-smi
log if <out> has one) without running or logging anything: the part a CPU can run. A value that
could not be had is null, with why in the last column, never 0.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, Tuple

SMI_FIELDS = ("power.draw.instant", "power.draw")  # newer drivers have the instant reading


def start_smi(log_path: Path, gpu: int) -> Tuple[subprocess.Popen, str]:
    for field in SMI_FIELDS:
        f = open(log_path, "w")
        proc = subprocess.Popen(["nvidia-smi", f"--query-gpu=timestamp,{field}", "--format=csv,noheader,nounits",
                                 "-lms", "100", "-i", str(gpu)], stdout=f, stderr=subprocess.STDOUT)
        time.sleep(1.5)
        if proc.poll() is None:
            return proc, field
        f.close()
    sys.exit(f"error: nvidia-smi could not log {' or '.join(SMI_FIELDS)}: {log_path.read_text().strip()}")


def read_smi(log_path: Path) -> List[Tuple[float, float]]:
    samples = []
    for line in log_path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time, like time.time()
            samples.append((t, float(parts[1])))
        except (ValueError, IndexError):
            continue  # "[N/A]" or a warning line
    return samples


def integrate(samples: List[Tuple[float, float]], t0: float, t1: float) -> Tuple[float, float, int]:
    """(joules, mean watts, samples used) over [t0, t1]: trapezoids, edges linearly interpolated."""
    def at(t: float) -> float:
        for (ta, pa), (tb, pb) in zip(samples, samples[1:]):
            if ta <= t <= tb:
                return pa + (pb - pa) * (t - ta) / (tb - ta) if tb > ta else pa
        raise ValueError(f"no nvidia-smi samples around t={t}")
    inside = [(t, p) for t, p in samples if t0 < t < t1]
    pts = [(t0, at(t0))] + inside + [(t1, at(t1))]
    joules = sum(0.5 * (pa + pb) * (tb - ta) for (ta, pa), (tb, pb) in zip(pts, pts[1:]))
    return joules, joules / (t1 - t0), len(inside)


def fmt(v, spec=".3g") -> str:
    return "null" if v is None else format(v, spec)


SHARES = ("gemm", "attention", "elementwise", "optimizer", "other")
SMI_COLUMNS = ("kWh nvidia-smi", "diff %", "smi mean W")


def run_rows(uri: str, experiment: str) -> List:
    """The training runs of the experiment, oldest first: a sweep's parent run (tag
    bertaccel.role=sweep, bertaccel/record/sweep.py) holds no measurements and is left out."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]) if exp else []
    return [r for r in runs if r.data.tags.get("bertaccel.role") != "sweep"]


def smi_energy(samples: Optional[List[Tuple[float, float]]], windows_tag: Optional[str],
               no_log: str) -> Tuple[Optional[float], Optional[float], str]:
    """(joules, seconds) nvidia-smi saw over the run's training windows, or (None, None, why)."""
    if samples is None:
        return None, None, no_log
    if windows_tag is None:
        return None, None, "no train_windows_unix tag on the run"
    joules = seconds = 0.0
    try:
        for t0, t1 in json.loads(windows_tag):
            joules += integrate(samples, t0, t1)[0]
            seconds += t1 - t0
    except ValueError as e:
        return None, None, str(e)
    if seconds <= 0:
        return None, None, "training windows of 0 s"
    return joules, seconds, ""


def energy_table(uri: str, experiment: str, samples: Optional[List[Tuple[float, float]]], field: str,
                 no_log: str) -> str:
    """The side-by-side table of the experiment's runs and the energy-per-sample lines.
    samples: nvidia-smi's (unix time, W), None without a log (no_log says why)."""
    cols = ["run", "status", "train_time_s", "samples/s", "energy_kwh (run)", f"kWh nvidia-smi ({field})",
            "diff %", "avg_power_w", "smi mean W", "J/sample", "occupancy_pct", "sm_active_pct",
            "tensor_active_pct", "dram_bw_util_pct", "mfu", "gemm/attn/elem/opt/other %", "peak GiB", "null: why"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    per_sample: Dict[str, Tuple[Optional[float], str]] = {}
    for r in run_rows(uri, experiment):
        m, tags = r.data.metrics, r.data.tags
        if tags.get("status") != "finished":
            lines.append(f"| {r.info.run_name} | {tags.get('status')}: {tags.get('reason', '')} |")
            continue
        why: Dict[str, List[str]] = {}  # reason -> the columns it nulls: each reason said once per run

        def get(metric: str, column: str = "") -> Optional[float]:
            value = m.get(metric)
            if value is None:
                why.setdefault(tags.get(f"{metric}_source", "not logged"), []).append(column or metric)
            return value

        smi_j, smi_s, smi_why = smi_energy(samples, tags.get("train_windows_unix"), no_log)
        if smi_j is None:
            why.setdefault(smi_why, []).extend(SMI_COLUMNS)
        e = get("energy_kwh")
        if e is None and smi_j is not None:  # nothing to compare nvidia-smi with, for the same reason
            why[tags.get("energy_kwh_source", "not logged")].append("diff %")
        diff = None if e is None or not smi_j else (e * 3.6e6 - smi_j) / smi_j * 100
        share_values = [get(f"profile_{c}_share", "shares") for c in SHARES]
        shares = "null" if None in share_values else "/".join(format(v * 100, ".0f") for v in share_values)
        precision = r.data.params.get("precision", r.info.run_name)
        per_sample[precision] = (get("energy_per_sample_j", "J/sample"),
                                 tags.get("energy_per_sample_j_source", "not logged"))
        cells = [
            r.info.run_name, "finished", fmt(get("train_time_s"), ".2f"), fmt(get("throughput_samples_s"), ".0f"),
            fmt(e, ".5f"), fmt(None if smi_j is None else smi_j / 3.6e6, ".5f"), fmt(diff, "+.1f"),
            fmt(get("avg_power_w"), ".0f"), fmt(None if smi_j is None else smi_j / smi_s, ".0f"),
            fmt(per_sample[precision][0], ".3f"), fmt(get("occupancy_pct"), ".1f"), fmt(get("sm_active_pct"), ".1f"),
            fmt(get("tensor_active_pct"), ".1f"), fmt(get("dram_bw_util_pct"), ".1f"), fmt(get("mfu"), ".3f"),
            shares, fmt(get("peak_memory_gib"), ".2f"),
            "; ".join(f"{', '.join(dict.fromkeys(c))}: {reason}" for reason, c in why.items())]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    fp32, fp32_why = per_sample.get("fp32", (None, ""))
    for p, (v, _) in per_sample.items():
        if p == "fp32":
            continue
        if fp32 and v:
            lines.append(f"\nenergy per sample, {p} vs fp32: {(v / fp32 - 1) * 100:+.1f}% "
                         "(thesis Table 4.7, fp16 vs fp32 on a V100: -66% energy)")
        elif "fp32" in per_sample:
            whys = {"fp32": fp32_why, p: per_sample[p][1]}
            said = (f"both: {fp32_why}" if len(set(whys.values())) == 1
                    else "; ".join(f"{k}: {w}" for k, w in whys.items()))
            lines.append(f"\nenergy per sample, {p} vs fp32: null ({said})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="energy_check", help="folder for the store, the log and the table")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--table-only", action="store_true",
                    help="build the table from <out>/mlflow.db (and <out>/nvidia_smi.csv if there); run nothing")
    ap.add_argument("overrides", nargs="*", help="bertaccel.run overrides (after --)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    uri = f"sqlite:///{out / 'mlflow.db'}"
    log = out / "nvidia_smi.csv"
    returncode = 0
    if args.table_only:
        if not (out / "mlflow.db").is_file():
            sys.exit(f"error: --table-only: no {out / 'mlflow.db'}; run the check first (without --table-only)")
        field = (out / "nvidia_smi.field").read_text().strip() if (out / "nvidia_smi.field").is_file() else "log"
    else:
        if shutil.which("nvidia-smi") is None:
            sys.exit("error: nvidia-smi not found: this check needs an NVIDIA GPU and its driver tools "
                     "(--table-only builds the table of a store already there)")
        out.mkdir(parents=True, exist_ok=True)
        smi, field = start_smi(log, args.gpu)
        (out / "nvidia_smi.field").write_text(field + "\n")
        try:
            returncode = subprocess.run([sys.executable, "-m", "bertaccel.run", "-m", *args.overrides,
                                         f"tracking.uri={uri}", "tracking.experiment=energy_check"]).returncode
        finally:
            time.sleep(1.0)
            smi.terminate()
            smi.wait()
    samples = read_smi(log) if log.is_file() else None
    text = energy_table(uri, "energy_check", samples, field, f"no nvidia-smi log ({log.name}) in {out}")
    (out / "energy_check.md").write_text(text + "\n")
    print(text)
    sys.exit(returncode)


if __name__ == "__main__":
    main()

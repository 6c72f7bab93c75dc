"""Check a sweep's NVML energy against nvidia-smi, read independently, and print its metrics.

    python benchmarks/energy_check.py --out energy_check -- precision=fp32,bf16 profile=true ...

Starts `nvidia-smi` logging power every 100 ms, runs `python -m bertaccel.run -m <overrides>`
into its own MLflow store (<out>/mlflow.db), then integrates the nvidia-smi power samples over
each run's training windows (the `train_windows_unix` tag) and compares that with the run's
`energy_kwh` (NVML energy counter). Prints one side-by-side table (also <out>/energy_check.md),
and the change in energy per sample of each precision against fp32.
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
from typing import List, Tuple

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="energy_check", help="folder for the store, the log and the table")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="bertaccel.run overrides (after --)")
    args = ap.parse_args()
    if shutil.which("nvidia-smi") is None:
        sys.exit("error: nvidia-smi not found: this check needs an NVIDIA GPU and its driver tools")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    smi, field = start_smi(out / "nvidia_smi.csv", args.gpu)
    try:
        run = subprocess.run([sys.executable, "-m", "bertaccel.run", "-m", *args.overrides,
                              f"tracking.uri={uri}", "tracking.experiment=energy_check"])
    finally:
        time.sleep(1.0)
        smi.terminate()
        smi.wait()
    samples = read_smi(out / "nvidia_smi.csv")

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("energy_check")
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]) if exp else []
    cols = ["run", "status", "train_time_s", "samples/s", "energy_kwh NVML", f"kWh nvidia-smi ({field})",
            "diff %", "avg_power_w", "smi mean W", "J/sample", "occupancy_pct", "sm_active_pct",
            "tensor_active_pct", "dram_bw_util_pct", "mfu", "gemm/attn/elem/opt/other %", "peak GiB"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    per_sample = {}
    for r in runs:
        m, tags = r.data.metrics, r.data.tags
        if tags.get("status") != "finished":
            lines.append(f"| {r.info.run_name} | {tags.get('status')}: {tags.get('reason', '')} |")
            continue
        windows = json.loads(tags["train_windows_unix"])
        smi_j = smi_s = 0.0
        for t0, t1 in windows:
            j, _, _ = integrate(samples, t0, t1)
            smi_j += j
            smi_s += t1 - t0
        e = m.get("energy_kwh")
        diff = None if e is None else (e * 3.6e6 - smi_j) / smi_j * 100
        shares = "/".join(fmt(m.get(f"profile_{c}_share", float("nan")) * 100, ".0f")
                          for c in ("gemm", "attention", "elementwise", "optimizer", "other"))
        per_sample[r.data.params.get("precision", r.info.run_name)] = m.get("energy_per_sample_j")
        lines.append("| " + " | ".join([
            r.info.run_name, "finished", fmt(m.get("train_time_s"), ".2f"), fmt(m.get("throughput_samples_s"), ".0f"),
            fmt(e, ".5f"), fmt(smi_j / 3.6e6, ".5f"), fmt(diff, "+.1f"), fmt(m.get("avg_power_w"), ".0f"),
            fmt(smi_j / smi_s, ".0f"), fmt(m.get("energy_per_sample_j"), ".3f"), fmt(m.get("occupancy_pct"), ".1f"),
            fmt(m.get("sm_active_pct"), ".1f"), fmt(m.get("tensor_active_pct"), ".1f"),
            fmt(m.get("dram_bw_util_pct"), ".1f"), fmt(m.get("mfu"), ".3f"), shares,
            fmt(m.get("peak_memory_gib"), ".2f")]) + " |")
    if "fp32" in per_sample and per_sample["fp32"]:
        for p, v in per_sample.items():
            if p != "fp32" and v:
                lines.append(f"\nenergy per sample, {p} vs fp32: {(v / per_sample['fp32'] - 1) * 100:+.1f}% "
                             "(thesis Table 4.7, fp16 vs fp32 on a V100: -66% energy)")
    text = "\n".join(lines)
    (out / "energy_check.md").write_text(text + "\n")
    print(text)
    sys.exit(run.returncode)


if __name__ == "__main__":
    main()

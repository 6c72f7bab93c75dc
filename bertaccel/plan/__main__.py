"""python -m bertaccel.plan: predict a sweep's time, cost and energy before it runs.

    python -m bertaccel.plan [--config-name STUDY] [--config-dir DIR] [overrides as for bertaccel.run -m]
                             [--hardware a100,h100] [--prune] [--out DIR]

Prints the predictions, the thesis' scores on them and the best configuration per strategy;
--out DIR also writes plan.md, plan.csv (the report's CSV form: `python -m bertaccel.report
--csv DIR/plan.csv` reads it) and plots/. Bad input: one line, exit 2, nothing written.
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
    from bertaccel.report.stop import while_starting

    while_starting()  # Ctrl-C during the imports below: one line (report/stop.py)
    from bertaccel.runs.bytecode import cache_bytecode

    cache_bytecode()  # before the heavy imports (runs/bytecode.py)

if __name__ == "__main__" and "--probe" in sys.argv[1:] and not {"-h", "--help"} & set(sys.argv[1:]):
    # The runs' forkserver first, before this module's own imports (torch: seconds): the probes
    # fork from it, and its preload (the longest wait of a plan with probes, 13-14 s on an H100
    # host) then runs beside the imports and the grid's composition, as a sweep's does
    # (runs/forkserver.py start_early). Stopped at exit, also on bad input.
    from bertaccel.runs.forkserver import start_now

    start_now(sys.argv[1:])  # (a grid that compiles: its probes and fills find Inductor imported)

import argparse  # noqa: E402 (after the server's start)
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ..config import first_line
from ..report.args import OneLineParser
from ..report.folder import OutputFolderError, check_folder, write_folder
from ..report.stop import held, run
from .calibrate import DEFAULT_MFU, POWER_UTILISATION

if TYPE_CHECKING:  # (imported where used: the forkserver starts first)
    from ..report.scoring import Scored
    from .grid import Grid
    from .predict import Planner
    from .pricing import Prediction

SCALING = (f"--hardware: each configuration re-priced on the profile: achieved FLOP/s from runs on that hardware "
           f"when the store has similar ones, else the similar runs' times moved there through the roofline of "
           f"plan/roofline.py (GEMM share x the peak TFLOP/s ratio, memory-bound share x the memory bandwidth "
           f"ratio, launch share unchanged; estimated bytes and launches), or by the peak TFLOP/s ratio alone "
           f"where a profile lacks a bandwidth (the same MFU assumed), else the default MFU {DEFAULT_MFU:g}; "
           f"power from runs on that hardware, else {POWER_UTILISATION:g} x its tdp_w; its price")


def _args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = OneLineParser(prog="python -m bertaccel.plan",
                       description="Predict time, cost and energy of every configuration of a sweep "
                                   "before it runs (the overrides of bertaccel.run -m).")
    ap.add_argument("--config-name", default="config", help="the study (bertaccel/sweeps/) or primary config")
    ap.add_argument("--config-dir", help="a folder of your own studies (as for bertaccel.run)")
    ap.add_argument("-m", "--multirun", action="store_true", help="accepted for symmetry with bertaccel.run -m")
    ap.add_argument("--hardware", help="comma-separated profiles (conf/hardware) to re-price the grid on")
    ap.add_argument("--prune", action="store_true", help="list configurations no weight strategy can make best")
    ap.add_argument("--probe", action="store_true",
                    help="time a few steps of each distinct configuration on this machine first (cached under "
                         "cache_dir/probe) and predict from them where the store has no run of that configuration")
    ap.add_argument("--out", help="folder for plan.md, plan.csv and plots/")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. precision=fp32,bf16 train.epochs=1")
    return ap.parse_intermixed_args(argv)


def _targets(spec: Optional[str]) -> List[str]:
    from bertaccel.options.hardware import load_profiles

    from .grid import PlanInputError

    if spec is None:
        return []
    known = sorted(p["name"] for p in load_profiles())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if not names:
        raise PlanInputError(f"--hardware {spec!r}: give profile names, e.g. --hardware a100,h100; "
                             f"choose from {', '.join(known)}")
    if bad:
        raise PlanInputError(f"--hardware {spec}: {', '.join(bad)} is not a hardware profile; "
                             f"choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _plots(preds: Sequence[Prediction], several: bool) -> List[Dict[str, Any]]:
    from ..report.plots import scatter_png
    from .output import score_rows_of

    rows = score_rows_of(preds, several)
    out = []
    for stem, y, ylabel in (("predicted_time_vs_cost", "cost_usd", "predicted cost (USD)"),
                            ("predicted_time_vs_energy", "energy_kwh", "predicted energy (kWh)")):
        title = f"Predicted train time vs {ylabel.split(' ', 1)[1]} (before running)"
        png, drawn = scatter_png(rows, "time_s", y, "predicted train time (s)", ylabel, title)
        out.append({"stem": stem, "png": png, "drawn": drawn, "title": title})
    return out


def _notes(grid: Grid, planner: Planner, preds: Sequence[Prediction], scored: Scored, probed: bool,
           targets: List[str]) -> List[str]:
    """The plan's notes: what was planned, where its numbers came from, what is left out."""
    from . import output

    notes = [f"{len(grid.configs)} configurations of --config-name {grid.config_name} (sweep id {grid.sweep_id}), "
             f"as bertaccel.run -m expands them; each trains the configured epochs on its train split after "
             f"dataset.train_subset (set dataset.train_subset=null for the full split)"]
    if probed:
        notes.append(f"--probe: {planner.prober.probe_s:.1f} s of probing on this machine this time (cached probes "
                     f"cost nothing); a configuration with finished runs of its own in the store is predicted from "
                     f"them, not from its probe")
    notes += planner.notes + planner.prober.notes + planner.walls.notes() + [output.OCCUPANCY_NOTE] + ([SCALING] if targets else [])
    short = {i: [m for m in ms if m != "occupancy_pct"] for i, ms in scored.affected.items()}
    short = {i: ms for i, ms in short.items() if ms}
    if short:
        left = sorted({m for ms in short.values() for m in ms})
        notes.append(f"{len(short)} of {len(preds)} rows have no predicted {' or '.join(left)} (see their basis): "
                     f"they are scored without it, so their scores under strategies that weigh it are not comparable "
                     f"with the other rows'")
    invalid = [(c.name, c.invalid) for c in grid.configs if c.invalid]
    if invalid:
        notes.append(f"{len(invalid)} configuration(s) the project's validation refuses: "
                     + "; ".join(f"{name}: {'; '.join(why.splitlines())}" for name, why in invalid[:3]))
    return notes


def _refused(e: BaseException, a: argparse.Namespace) -> List[str]:
    """The lines of a command line the grid cannot be composed from, worded as the run CLI words
    them: every problem it has (a typo key and the bad values beside it), a study not found, a
    --config-dir that is not there or a file that is not YAML (runs/command_config.py)."""
    from hydra.errors import ConfigCompositionException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from ..run import input_error
    from ..runs.command_config import every_problem, study_error

    if "Cannot find primary config" in first_line(e):
        where = (f" nor in --config-dir {a.config_dir}" if a.config_dir
                 else " (for a study of your own, give its folder: --config-dir DIR)")
        return [f"--config-name {a.config_name}: no such study or config in bertaccel/sweeps/{where}"]
    if isinstance(e, (ConfigCompositionException, OverrideParseException, OmegaConfBaseException, YAMLError)):
        return every_problem(e, a.config_name, a.config_dir, a.overrides, True, input_error)
    return [study_error(e) or first_line(e)]


def main(argv: Optional[List[str]] = None, written: Optional[List[str]] = None) -> int:
    """written: what was written so far is appended to it (report/stop.py says it on Ctrl-C)."""
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from ..runs.command_config import StudyError
    from . import output
    from .grid import PlanInputError, expand
    from .predict import Planner

    written = [] if written is None else written
    a = _args(argv)
    try:
        if a.out is not None:
            check_folder(a.out, "plan")  # before any work: a bad --out costs nothing
        if a.config_dir is not None and not a.config_dir.strip():  # (else taken as not given)
            raise PlanInputError("--config-dir '': give a folder of studies or leave --config-dir out")
        targets = _targets(a.hardware)
        grid = expand(a.config_name, a.overrides, a.config_dir)
    except (PlanInputError, OutputFolderError, StudyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ConfigCompositionException, OverrideParseException, OmegaConfBaseException, HydraException, YAMLError) as e:
        print("\n".join(f"error: {line}" for line in _refused(e, a)), file=sys.stderr)
        return 2
    refused = grid.refusal()
    if refused:  # bad input in every configuration: refused as run -m refuses it, nothing saved
        print("\n".join(f"error: {line}" for line in refused.splitlines()), file=sys.stderr)
        return 2
    planner = Planner(targets)
    planner.prober.enabled = a.probe
    if a.probe:
        planner.walls.machine.start()  # (in the background while the probes run)
    planner.probe_ahead(grid.configs)
    preds = [p for planned in grid.configs for p in planner.predict(planned)]
    several = bool(targets)
    scored = output.score(preds, several)
    tables = output.main_tables(preds, scored, several)
    if a.probe or any(p.run_wall_s is not None for p in preds):
        tables.insert(1, output.wait_table(preds, planner.walls.sweep_wall_s()))
    if a.prune:
        tables.append(output.prune_table(preds, several))
    notes = _notes(grid, planner, preds, scored, a.probe, targets)
    for t in tables:
        print(output.text(t), end="\n\n")
    for n in notes:
        print(f"note: {n}")
    for line in output.best_lines(preds, scored, several):
        print(line)
    own = [p for p in preds if not p.why.get("run_wall_s", "").endswith("own hardware only")]
    if grid.configs:
        from .saved import save_plan

        with held():  # (whole or not begun: a Ctrl-C meanwhile is taken after it)
            saved = save_plan(grid.configs[0].cfg.cache_dir, grid.sweep_id, own, planner.walls.sweep_wall_s())
            written.append(f"the saved plan {saved}")
        print(f"plan saved for the sweep's runs: {saved} (each run of sweep {grid.sweep_id} logs its prediction)")
    if a.out is not None:
        plots = _plots(preds, several)
        md = output.markdown(tables, notes, f"bertaccel plan: {grid.config_name}")
        md += "\n## Plots\n\n" + "\n\n".join(f"![{p['title']}](plots/{p['stem']}.png)" for p in plots)
        try:
            with held():
                write_folder(a.out, "plan", {"plan.md": md + "\n", "plan.csv": output.to_csv(preds, several)}, plots)
                written.append(f"the plan {a.out}")
        except OutputFolderError as e:  # --out changed since check_folder, or could not be written
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"plan: {Path(a.out) / 'plan.md'}, {Path(a.out) / 'plan.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))

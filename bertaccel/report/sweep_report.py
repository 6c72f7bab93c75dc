"""The report of a sweep, attached to its MLflow parent run when the sweep ends, so the MLflow UI
shows it beside the runs it scores (artifact `report/report.html`, with report.md and plots/).

Where it lives, and why: the sweep's end is in runs/ (runs/progress.py, SweepProgress), and runs/
may not import report/, which stands above it (pyproject.toml, [tool.importlinter]). So the report
attaches itself, from report/: its Hydra callback is listed after SweepProgress in conf/config.yaml,
Hydra calls it by name (no import of it from below), starts callbacks in order and ends them in
reverse, so it reads the sweep's context after SweepProgress has opened the parent run and
attaches the report before SweepProgress closes it and prints the summary.

It covers every configuration of the sweep: the runs it ran and those it resumed from earlier
runs or took from another sweep running them (tag in_sweep.<id>, record/sweep.py adopt).

The parent run's description (the tag MLflow's UI shows as a run's description, DESCRIPTION_TAG)
carries the answer: the report's headline and what changes it, and where the report is, so the
runs list and the parent's page say what the sweep found without opening the report.

It never fails the sweep: a report that cannot be built is the parent run's tag REASON_TAG (why),
and its description; a sweep without finished runs attaches nothing and says so there. Two sweep processes of the
same command (one parent run) each attach the report as they end; the last one's covers every run.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional

from hydra.experimental.callback import Callback

from bertaccel.config import first_line

if TYPE_CHECKING:
    from omegaconf import DictConfig
from bertaccel.record.access import attach_files, local_path, set_tags
from bertaccel.context import SweepContext, current as run_context
from bertaccel.record.sweep import sweep_runs

ARTIFACT_DIR = "report"  # on the parent run: report/report.html, report/report.md, report/plots/
REPORT_TAG = "report"  # the attached report's path on the parent run
REASON_TAG = "report_reason"  # why no report is attached
REASON_CHARS = 500
DESCRIPTION_TAG = "mlflow.note.content"  # MLflow's UI shows it (Markdown) as the run's description
DESCRIPTION_CHARS = 4000  # the answer's lines are cut here; the report's path always follows


def finished_runs(uri: str, experiment: str, sweep_id: str) -> int:
    """The sweep's configuration runs that finished: this time or in an earlier run of it, and
    those it took from earlier runs or from another sweep (record/sweep.py sweep_runs)."""
    return len(sweep_runs(uri, experiment, sweep_id, "tags.status = 'finished'"))


def build_report(uri: str, experiment: str, sweep_id: str, out: Path) -> Optional[str]:
    """Write the sweep's report into `out` as `python -m bertaccel.report --sweep <id>` would;
    None when written, else the report's own one-line reason."""
    from bertaccel.report.__main__ import main as report_main

    said = io.StringIO()  # the report's console lines are not the sweep's output
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = report_main(["--uri", uri, "--experiment", experiment, "--sweep", sweep_id, "--out", str(out)])
    if code == 0:
        return None
    errors = [line for line in said.getvalue().splitlines() if line.startswith("error:")]
    return (errors[-1] if errors else f"the report exited with status {code}").removeprefix("error: ")


def _tag(uri: str, run_id: str, **tags: str) -> None:
    """Set tags on the parent run; one given as "" is removed (an earlier sweep's reason). A reason
    (REASON_TAG) is also the run's description, where MLflow's UI shows it."""
    if tags.get(REASON_TAG):
        tags = {DESCRIPTION_TAG: tags[REASON_TAG], **tags}
    set_tags(uri, run_id, {k: v if k == DESCRIPTION_TAG else v[:REASON_CHARS] for k, v in tags.items()})


def description(answer: str, artifact_uri: str) -> str:
    """The parent run's description: the answer as the report's console says it (answer.txt,
    headline.answer_text: the same headline, winners and numbers), then where the report is (the
    artifact path on this run, and the file itself where the store's artifacts are local files)."""
    html = f"{ARTIFACT_DIR}/report.html"
    where = f"Report: `{html}` in this run's artifacts"
    if artifact_uri.startswith("file:"):
        where += f" ({local_path(artifact_uri) / html})"
    elif artifact_uri and "://" not in artifact_uri:  # a plain local path (a file store)
        where += f" ({Path(artifact_uri) / html})"
    lines = answer.strip().splitlines()
    # Markdown (the UI renders the description): the headline, then a bullet per line of strategies
    # with its details under it.
    head = [line for line in lines if " best: " not in line and not line.startswith(" ")]
    rest = lines[len(head):]
    text = "\n\n".join([" ".join(head), "\n".join(f"- {line.strip()}" if " best: " in line else f"  {line.strip()}"
                                                   for line in rest)]) if lines else "The report has no answer."
    return f"{text[:DESCRIPTION_CHARS]}\n\n{where}."


def attach_report(ctx: SweepContext, experiment: str) -> str:
    """Attach the sweep's report to its parent run; what happened, in one line (also tagged)."""
    finished = finished_runs(ctx.uri, experiment, ctx.sweep_id)
    if not finished:
        why = "no report: the sweep has no finished runs"
        _tag(ctx.uri, ctx.parent_run_id, **{REASON_TAG: why})
        return why
    with tempfile.TemporaryDirectory(prefix="bertaccel-sweep-report-") as tmp:
        out = Path(tmp) / "report"
        failed = build_report(ctx.uri, experiment, ctx.sweep_id, out)
        if failed is not None:
            why = f"no report: it could not be built ({failed})"
            _tag(ctx.uri, ctx.parent_run_id, **{REASON_TAG: why})
            return why
        # What a reader opens (not the folder's bertaccel marker, which only guards --out).
        plots = [(out / "plots", f"{ARTIFACT_DIR}/plots")] if (out / "plots").is_dir() else []
        artifact_uri = attach_files(ctx.uri, ctx.parent_run_id, [out / "report.html", out / "report.md"],
                                    ARTIFACT_DIR, plots)
        about = description((out / "answer.txt").read_text(encoding="utf-8"), artifact_uri)
    _tag(ctx.uri, ctx.parent_run_id, **{REPORT_TAG: f"{ARTIFACT_DIR}/report.html", REASON_TAG: "",
                                        DESCRIPTION_TAG: about})
    return f"report of {finished} finished runs attached to the parent run ({ARTIFACT_DIR}/report.html)"


class SweepReport(Callback):
    """Hydra callback (conf/config.yaml, after sweep_progress): the report on the parent run."""

    def __init__(self) -> None:
        self.context: Optional[SweepContext] = None
        self.experiment = ""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # SweepProgress.on_multirun_start ran just before (Hydra starts callbacks in order).
        self.context, self.experiment = run_context().sweep, str(config.tracking.experiment)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        ctx = self.context
        if ctx is None or not ctx.uri:
            return
        try:
            said = attach_report(ctx, self.experiment)
        except Exception as e:  # noqa: BLE001 - the sweep's runs are recorded; a report is never worth failing it
            said = f"no report: attaching it failed ({type(e).__name__}: {first_line(e, default='')})"
            with contextlib.suppress(Exception):
                _tag(ctx.uri, ctx.parent_run_id, **{REASON_TAG: said})
        print(f"[sweep] {said}", flush=True)

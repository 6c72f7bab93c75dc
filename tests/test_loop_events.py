"""The loop's events (train/loop.py's list, train/events.py's objects): their order, which side of the timed window each runs
on, and a few of the event objects alone. Real tiny model and data, the real loop."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_training

from bertaccel.measure.collectors import CollectorSet
from bertaccel.measure.collectors.base import Collector, Reading
from bertaccel.options.optimizer import lr_factor
from bertaccel.train.events import CompileEventCount, FreezingSchedule, LrSchedule, NonFiniteCheck, NonFiniteLoss
from bertaccel.train.loop import _prepare, train
from bertaccel.train.state import Callback, Window
from bertaccel.train.step import windows

CPU = torch.device("cpu")
EPOCHS, STEPS = 2, 3


def _setup(compose_cfg, tmp_path, overrides=()):
    cfg = compose_cfg(["model=tiny", "train.device=cpu", "dataset.train_subset=160", "dataset.test_subset=48",
                       "train.batch_size=16", "train.eval_batch_size=32", f"cache_dir={tmp_path}", *overrides])
    model, loaders, _ = tiny_training(cfg)
    return cfg, model, loaders


class Recorder(Callback):
    """Per event, and per forward of the model, whether the window's clock was running."""

    def __init__(self, model: torch.nn.Module):
        self.seen: list = []  # (what, clock running)
        self.win = None
        self.last_event = None
        model.register_forward_hook(self._forward)

    def running(self) -> bool:
        return self.win is not None and self.win.timing

    def _note(self, event: str) -> None:
        self.last_event = event
        self.seen.append((event, self.running()))

    def _forward(self, module, args, output) -> None:
        kind = "train forward" if module.training else "eval forward"
        self.seen.append((f"{kind} after {self.last_event}", self.running()))

    def run_start(self, run): self._note("run_start")
    def epoch_start(self, run, epoch): self._note("epoch_start")

    def window_start(self, run, win):
        self.win = win
        self._note("window_start")

    def step_start(self, run, win): self._note("step_start")
    def step_end(self, run, win): self._note("step_end")
    def window_end(self, run, win): self._note("window_end")
    def epoch_end(self, run, win): self._note("epoch_end")
    def run_end(self, run): self._note("run_end")


class WindowWatch(Collector):
    """A collector noting, at start and stop, whether the window's clock was running."""
    metrics = ("watch",)

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def start(self) -> None:
        self.recorder.seen.append(("collectors start", self.recorder.running()))

    def stop(self) -> None:
        self.recorder.seen.append(("collectors stop", self.recorder.running()))

    def results(self):
        return {"watch": Reading(0.0, "test")}


@pytest.mark.slow
def test_events_run_in_order_and_only_the_steps_are_timed(compose_cfg, tmp_path):
    cfg, model, (tr, te) = _setup(compose_cfg, tmp_path, [f"train.epochs={EPOCHS}",
                                                           f"train.max_steps_per_epoch={STEPS}",
                                                           "layer_timing=true", "profile=true"])
    rec = Recorder(model)
    result = train(model, tr, te, cfg, CPU, log=lambda m: None, collectors=CollectorSet([WindowWatch(rec)]),
                   profile_dir=tmp_path / "profile", callbacks=[rec])
    events = [(what, running) for what, running in rec.seen if "forward" not in what]
    window = [("collectors start", False), ("window_start", False),
              *[("step_start", True), ("step_end", True)] * STEPS,
              ("window_end", False), ("collectors stop", False)]
    assert events == [("run_start", False),
                      *[("epoch_start", False), *window, ("epoch_end", False)] * EPOCHS,
                      ("run_end", False)]
    forwards = [(what, running) for what, running in rec.seen if "forward" in what]
    # Training forwards all inside the window; evaluation (at epoch end) and the run-end work
    # (layer timing: train mode, the profiler: train mode) all outside it.
    assert {f for f in forwards if f[1]} == {("train forward after step_start", True)}
    assert ("eval forward after epoch_end", False) in forwards
    assert {what for what, running in forwards if not running} == {"eval forward after epoch_end",
                                                                    "train forward after run_end"}
    # Between the collectors' start and stop only the steps run: no evaluation inside.
    start = rec.seen.index(("collectors start", False))
    stop = rec.seen.index(("collectors stop", False))
    assert all(what.startswith(("step_", "train forward after step_start", "window_"))
               for what, _ in rec.seen[start + 1:stop])
    assert result.optimizer_steps == EPOCHS * STEPS and len(result.lr_per_step) == EPOCHS * STEPS
    assert all(e.eval_time_s > 0 and e.train_time_s > 0 for e in result.epochs)
    assert result.backprop is not None and result.profile is not None, result.profile_error
    first, second = (e.window_unix for e in result.epochs)
    assert first[0] < first[1] < second[0] < second[1] == result.last_window_end_unix


def _run_and_window(compose_cfg, tmp_path, overrides=()):
    cfg, model, (tr, te) = _setup(compose_cfg, tmp_path, list(overrides))
    run = _prepare(model, tr, te, cfg, CPU, lambda m: None)
    return run, next(iter(windows(tr, 1)))


def test_nonfinite_check_alone(compose_cfg, tmp_path):
    run, batches = _run_and_window(compose_cfg, tmp_path, ["train.log_every_steps=2"])
    check = NonFiniteCheck()
    win = Window(0, run.model, CPU)
    win.add(batches, torch.tensor(float("nan")))
    run.global_step = 1
    check.step_end(run, win)  # step 1 of a log interval of 2: the loss is not read
    win.add(batches, torch.tensor(0.5))
    run.global_step = 2
    with pytest.raises(NonFiniteLoss, match=r"non-finite training loss \(nan\) by optimizer step 2 \(epoch 1\)"):
        check.step_end(run, win)
    with pytest.raises(NonFiniteLoss, match=r"in epoch 1"):
        check.epoch_end(run, win)
    fine = Window(1, run.model, CPU)
    fine.add(batches, torch.tensor(0.5))
    fine.add(batches, torch.tensor(0.7))
    check.step_end(run, fine)
    check.epoch_end(run, fine)
    assert fine.epoch_loss() == pytest.approx(0.6)


def test_freezing_schedule_and_lr_schedule_alone(compose_cfg, tmp_path):
    run, _ = _run_and_window(compose_cfg, tmp_path, ["freezing=layerwise", "optimizer.schedule=linear",
                                                    "optimizer.warmup_ratio=0.5"])
    freezing, schedule = FreezingSchedule(), LrSchedule(run.cfg.optimizer)
    trainable = []
    for epoch in range(2):
        freezing.epoch_start(run, epoch)
        params = {id(p) for g in run.step.optimizer.param_groups for p in g["params"]}
        assert params == {id(p) for p in run.model.parameters() if p.requires_grad}
        trainable.append(params)
    assert trainable[0] != trainable[1]  # the optimizer was rebuilt over the next layer
    win = Window(0, run.model, CPU)
    for step in range(3):
        run.global_step = step
        schedule.step_start(run, win)
        expected = run.step.base_lr * lr_factor("linear", step, run.total_steps, 0.5, run.cfg.optimizer.min_lr_ratio)
        assert run.result.lr_per_step[-1] == pytest.approx(expected)
        assert all(g["lr"] == run.result.lr_per_step[-1] for g in run.step.optimizer.param_groups)
    assert run.result.lr_per_step[0] < run.result.lr_per_step[1] < run.result.lr_per_step[2]  # warming up


def test_eager_window_counts_no_compiles(compose_cfg, tmp_path):
    run, batches = _run_and_window(compose_cfg, tmp_path)
    lines = []
    run.log = lines.append
    count, win = CompileEventCount(), Window(0, run.model, CPU)
    count.window_start(run, win)
    run.step.micro(batches[0])
    count.epoch_end(run, win)
    assert win.compiles_in_window == 0 and lines == []
    assert math.isfinite(float(win.loss_sum))


class RaisesAtWindowStart(Callback):
    def window_start(self, run, win):
        raise RuntimeError("a window_start hook failed")


def test_a_window_start_that_raises_still_ends_what_started(compose_cfg, tmp_path):
    """The window's hooks nest as with-blocks (state.Events.window): when a window_start raises,
    every object whose window_start ran gets its window_end (the collectors stop, no sampler is
    left running), in reverse order; the objects after it get neither."""
    cfg, model, (tr, te) = _setup(compose_cfg, tmp_path, ["train.epochs=1", "train.max_steps_per_epoch=1"])
    rec = Recorder(model)
    with pytest.raises(RuntimeError, match="a window_start hook failed"):
        train(model, tr, te, cfg, CPU, log=lambda m: None, collectors=CollectorSet([WindowWatch(rec)]),
              callbacks=[rec, RaisesAtWindowStart()])
    assert rec.seen == [("run_start", False), ("epoch_start", False), ("collectors start", False),
                        ("window_start", False), ("window_end", False), ("collectors stop", False)]


def _train_imports() -> dict:
    """Each module of bertaccel/train and the modules of bertaccel/train it imports anywhere in
    its text (inside functions and under TYPE_CHECKING too: an import there is still a circle)."""
    import ast
    from pathlib import Path

    import bertaccel.train

    root = Path(bertaccel.train.__file__).parent
    names = {p.stem for p in root.glob("*.py")}
    graph = {}
    for path in root.glob("*.py"):
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:  # relative: from . import x / from .x import y
                    module = "bertaccel.train" + (f".{module}" if module else "")
                if module == "bertaccel.train":
                    edges |= {a.name for a in node.names if a.name in names}
                elif module.startswith("bertaccel.train."):
                    edges.add(module.split(".")[2])
            elif isinstance(node, ast.Import):
                edges |= {a.name.split(".")[2] for a in node.names if a.name.startswith("bertaccel.train.")}
        graph[path.stem] = edges - {path.stem}
    return graph


def test_train_has_no_import_circle():
    graph = _train_imports()
    assert {"loop", "events", "state", "step", "forward"} <= set(graph)
    state = dict.fromkeys(graph, 0)  # 0 unvisited, 1 on the current path, 2 done

    def visit(module, path):
        state[module] = 1
        for other in sorted(graph[module]):
            assert state[other] != 1, f"import circle in bertaccel/train: {' -> '.join(path + [module, other])}"
            if state[other] == 0:
                visit(other, path + [module])
        state[module] = 2

    for module in sorted(graph):
        if state[module] == 0:
            visit(module, [])

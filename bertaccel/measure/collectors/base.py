"""The collector interface: measurements taken over the training window only.

A collector is started and stopped around every training window of a run (one per epoch, so
evaluation stays outside) and accumulates over them; `results()` then gives one Reading per
metric it owns. A Reading always carries its source; a value of None comes with the reason
in place of the source, so "not measured" is never written down as 0.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

log = logging.getLogger("bertaccel")


@dataclass(frozen=True)
class Reading:
    value: Optional[float]
    source: str  # where the number comes from; for value=None: "null: <why>"

    @staticmethod
    def null(reason: str) -> "Reading":
        return Reading(None, f"null: {reason}")


class Collector:
    """start()/stop() bracket one training window (called once per epoch); results() at the end."""

    #: the metric names this collector owns; results() returns exactly these keys
    metrics: Sequence[str] = ()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def results(self) -> Dict[str, Reading]:
        raise NotImplementedError

    def close(self) -> None:
        """Release handles (after results())."""


class Unavailable(Collector):
    """A source this machine does not have: every metric null with one reason."""

    def __init__(self, metrics: Sequence[str], reason: str):
        self.metrics = tuple(metrics)
        self.reason = reason

    def results(self) -> Dict[str, Reading]:
        return {m: Reading.null(self.reason) for m in self.metrics}


class Sampler(Collector):
    """A collector that samples in a background thread every `interval_s` while a window is open.

    Subclasses implement `_open()` (first sample at the window start), `_sample(now, dt)`
    (called with the monotonic time and the seconds since the previous sample) and may
    override `_close()`; the final `_sample` at stop() closes the last interval exactly.
    """

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._last = 0.0
        self.window_s = 0.0  # summed length of all windows
        self.error: Optional[str] = None  # set when sampling failed; results() are then null

    def _open(self) -> None:
        pass

    def _sample(self, now: float, dt: float) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass

    def _tick(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._sample(now, now - self._last)
            self._last = now

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._tick()
            except Exception as e:  # noqa: BLE001 - a sampling failure ends sampling, not the run
                self._failed(e)
                return

    def _failed(self, e: BaseException) -> None:
        log.warning(f"{type(self).__name__}: sampling stopped: {type(e).__name__}: {e}")
        self.error = f"{type(e).__name__}: {e}"

    def start(self) -> None:
        self._stop.clear()
        self._open()
        self._window_start = self._last = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:  # not started (or already stopped): nothing to close
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self.error is None:
            self._tick()
        self._close()
        self.window_s += time.monotonic() - self._window_start


class TimeWeightedMean:
    """Mean of a sampled quantity, each sample weighted by the interval it covers."""

    def __init__(self) -> None:
        self.weighted_sum = 0.0
        self.seconds = 0.0

    def add(self, value: float, seconds: float) -> None:
        if seconds > 0:
            self.weighted_sum += value * seconds
            self.seconds += seconds

    @property
    def mean(self) -> Optional[float]:
        return self.weighted_sum / self.seconds if self.seconds > 0 else None


class CollectorSet:
    """What the training loop holds: start/stop around each window, never raising.

    A collector that raises is dropped for the rest of the run and all its metrics become
    null with the error as the reason; the run itself goes on.
    """

    def __init__(self, collectors: Iterable[Collector] = ()):
        self.collectors: List[Collector] = list(collectors)
        self._broken: Dict[int, str] = {}

    def _each(self, action: str) -> None:
        for i, c in enumerate(self.collectors):
            if i in self._broken:
                continue
            try:
                getattr(c, action)()
            except Exception as e:  # noqa: BLE001 - collectors never crash a run
                reason = f"{type(c).__name__}.{action}() failed: {type(e).__name__}: {e}"
                log.warning(f"collector {reason}; its metrics are null for this run")
                self._broken[i] = reason

    def start(self) -> None:
        self._each("start")

    def stop(self) -> None:
        self._each("stop")

    def results(self) -> Dict[str, Reading]:
        out: Dict[str, Reading] = {}
        for i, c in enumerate(self.collectors):
            if i not in self._broken:
                try:
                    out.update(c.results())
                    continue
                except Exception as e:  # noqa: BLE001
                    self._broken[i] = f"{type(c).__name__}.results() failed: {type(e).__name__}: {e}"
            out.update({m: Reading.null(self._broken[i]) for m in c.metrics})
        for c in self.collectors:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - releasing a handle must not lose the results
                pass
        return out

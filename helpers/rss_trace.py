"""Where a process's host RAM goes: its resident set size (RSS) sampled by a background thread and
attributed to the phase the process is in (imports, model construction, ``deepspeed.initialize``,
forward and backward, the optimizer step). helpers.bench records one trace per run; notebook 06
shows it for the largest models, where host RAM is the wall.

A sampler can miss a short spike (its thread waits for the GIL on a busy 2-core machine), so at
every phase switch the trace also reads the kernel's high-water mark of the process's RSS
(``getrusage``'s ``ru_maxrss``): when it rose during the phase being left, the new high was that
phase's, and its peak is exact. (A process started from a bigger one begins with its parent's RSS
as its mark, so this helps only once the process passes it.)
"""

from __future__ import annotations

import resource
import sys
import threading
from dataclasses import asdict, dataclass


def high_water_bytes() -> int:
    """The most RSS this process has held so far, as the kernel counts it (``ru_maxrss``: KiB on
    Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


@dataclass
class Phase:
    """One phase: RSS when it first began, the highest RSS seen while in it, how often it began."""

    name: str
    start_bytes: int
    peak_bytes: int
    entries: int = 1


class PhaseTrace:
    """Peak RSS per named phase. ``enter(name)`` switches phase (a phase entered again, like one
    training step's forward and backward after another, keeps one peak); ``stop()`` returns them in
    the order they first began."""

    def __init__(self, interval_s: float = 0.02):
        import psutil

        self._process = psutil.Process()
        self._interval = interval_s
        self._phases: dict[str, Phase] = {}
        self._current: Phase | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True)
        self._high_water = high_water_bytes()  # at the current phase's start
        # On Linux a process started by fork and exec inherits its parent's RSS at the fork as its
        # first high-water mark: only a mark above this one is the process's own.
        self.inherited_high_water = self._high_water

    def _sample(self) -> int:
        rss = self._process.memory_info().rss
        with self._lock:
            if self._current is not None:
                self._current.peak_bytes = max(self._current.peak_bytes, rss)
        return rss

    def _sample_forever(self) -> None:
        while not self._done.wait(self._interval):
            self._sample()

    def _close_current(self) -> None:
        """Sample the last moments of the phase being left; where the kernel's high-water mark rose
        during it, that high was this phase's."""
        self._sample()
        high = high_water_bytes()
        with self._lock:
            if self._current is not None and high > self._high_water:
                self._current.peak_bytes = max(self._current.peak_bytes, high)
            self._high_water = high

    def enter(self, name: str) -> None:
        """From now on, RSS counts towards ``name``."""
        self._close_current()
        rss = self._process.memory_info().rss
        with self._lock:
            phase = self._phases.get(name)
            if phase is None:
                phase = self._phases[name] = Phase(name, rss, rss, 0)
            phase.entries += 1
            phase.peak_bytes = max(phase.peak_bytes, rss)
            self._current = phase
        if not self._thread.is_alive() and not self._done.is_set():
            self._thread.start()

    def stop(self) -> list[dict]:
        """End the trace; the phases as dicts (name, start_bytes, peak_bytes, entries)."""
        self._close_current()
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            return [asdict(p) for p in self._phases.values()]

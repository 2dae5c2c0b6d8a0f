"""The process's memory and CPU figures, read cheaply on the background thread once per step.

Names (docs/schema.md): ``memory/rss_bytes`` and ``memory/rss_peak_bytes``
(resident set and its high-water mark, ``/proc/self/status`` VmRSS/VmHWM;
``getrusage`` where there is no /proc), ``process/cpu_user_s``,
``process/cpu_system_s`` (CPU time of the whole process, all threads, since it
started: a slow step with little CPU was waiting, one with much was computing
or contending) and ``process/threads``.

CUDA, only where the program already uses it: ``memory/cuda_allocated_bytes``,
``memory/cuda_reserved_bytes``, ``memory/cuda_peak_allocated_bytes`` and
``memory/cuda_peak_reserved_bytes`` (lifetime peaks, never reset: torchtitan's
memory monitor reads the same statistics). The rules that keep this harmless:

* torch is never imported here: a process that did not import it has no CUDA figures;
* nothing is read unless ``torch.cuda.is_initialized()``: a call that creates a
  context (the first ``memory_allocated()`` of a process, say) would cost
  hundreds of MB of device memory in every rank that never used the GPU;
* the device is always passed explicitly (the rank's own: ``local_rank`` when
  the process sees that many devices, else its current one): a call without a
  device reads, and may initialise, GPU 0 from every process of the host;
* the caching allocator's counters are host-side reads: no synchronisation.

``OTEL_TITAN_CUDA_STEP_PEAK=1`` also writes ``memory/cuda_step_peak_allocated_bytes``,
the peak within each step, by resetting the allocator's peak counter after
each reading (off by default: it changes what ``torch.cuda.max_memory_allocated``
returns to the program).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections import deque
from typing import Any

from otel_titan.environment_variables import (
    OTEL_TITAN_CUDA_STEP_PEAK,
    OTEL_TITAN_PROCESS_FIGURES,
    flag,
)

__all__ = [
    "ProcessFigures",
    "BoundaryReadings",
    "cuda_device",
    "process_figures_on",
    "FIGURE_NAMES",
]

_STATUS = "/proc/self/status"
#: Every name `ProcessFigures.read` may return: the logger's own figures, which the metrics' name
#: cap never drops.
FIGURE_NAMES = frozenset(
    {
        "memory/rss_bytes",
        "memory/rss_peak_bytes",
        "process/cpu_user_s",
        "process/cpu_system_s",
        "process/threads",
        "memory/cuda_allocated_bytes",
        "memory/cuda_reserved_bytes",
        "memory/cuda_peak_allocated_bytes",
        "memory/cuda_peak_reserved_bytes",
        "memory/cuda_step_peak_allocated_bytes",
    }
)


def _status_fields(path: str = _STATUS) -> dict[str, int]:
    """VmRSS, VmHWM (bytes) and Threads from /proc/self/status; empty where there is none."""
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as handle:
            for line in handle:
                key, _, rest = line.partition(b":")
                if key in (b"VmRSS", b"VmHWM"):
                    out[key.decode()] = int(rest.split()[0]) * 1024  # kB
                elif key == b"Threads":
                    out["Threads"] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def process_figures_on(option: bool | None, environ: Any = None) -> bool:
    """The ``process_figures`` option, else ``OTEL_TITAN_PROCESS_FIGURES``
    (`environment_variables.flag`: ``0``, ``false``, ``no``, ``off``: off), else on.

    Example:
        >>> process_figures_on(None, {}), process_figures_on(None, {"OTEL_TITAN_PROCESS_FIGURES": "0"}), process_figures_on(True, {"OTEL_TITAN_PROCESS_FIGURES": "0"})
        (True, False, True)
    """
    if option is not None:
        return option
    return flag(OTEL_TITAN_PROCESS_FIGURES, True, environ)


def cuda_device(torch: Any, local_rank: int | None) -> int | None:
    """The rank's own CUDA device index, or None when CUDA is not in use (never initialises it).

    Example:
        >>> cuda_device(None, 0) is None
        True
    """
    if torch is None:
        return None
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        count = cuda.device_count()
        if local_rank is not None and 0 <= local_rank < count:
            return local_rank
        return int(cuda.current_device())
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the logger
        return None


_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class BoundaryReadings:
    """The resident memory and CPU times at the moment each step ended, read by the training loop's
    `set_step`.

    Read later, on the background thread, a step's figures came a median
    25 ms (up to 167 ms) into the next step: 300 MiB allocated at the start of
    step 10 showed as step 9's ``memory/rss_bytes``. Called as
    `step_context.add_boundary_hook`: one ``/proc/self/statm`` read and one
    ``os.times()`` on the training thread, a few microseconds once a step, and
    one deque append; the sampler takes them on the processor thread.

    Example:
        >>> readings = BoundaryReadings()
        >>> readings(9)
        >>> sorted(readings.take(9)[0])
        ['memory/rss_bytes', 'process/cpu_system_s', 'process/cpu_user_s']
    """

    def __init__(self) -> None:
        self._fresh: deque[tuple[int, int, dict[str, int | float]]] = deque(maxlen=256)
        self._pending: dict[int, tuple[dict[str, int | float], int]] = {}
        self._statm = os.path.exists(_STATM)

    def __call__(self, ended_step: int) -> None:
        """The training thread, at ``set_step``: the figures now, for `ended_step`."""
        now = time.perf_counter_ns()
        figures: dict[str, int | float] = {}
        if self._statm:
            try:
                fd = os.open(_STATM, os.O_RDONLY)
                try:
                    figures["memory/rss_bytes"] = int(os.read(fd, 128).split()[1]) * _PAGE
                finally:
                    os.close(fd)
            except (OSError, ValueError, IndexError):
                self._statm = False
        times = os.times()
        figures["process/cpu_user_s"] = round(times.user, 3)
        figures["process/cpu_system_s"] = round(times.system, 3)
        self._fresh.append((ended_step, now, figures))  # atomic: no lock on the training thread

    def take(self, step: int) -> tuple[dict[str, int | float], int] | None:
        """The processor thread: ``(figures, perf_counter_ns)`` read when `step` ended, or None."""
        fresh = self._fresh
        while fresh:
            ended, at, figures = fresh.popleft()
            self._pending[ended] = (figures, at)
        found = self._pending.pop(step, None)
        if len(self._pending) > 256:  # steps the sampler never asked for (several per batch)
            self._pending.clear()
        return found


class ProcessFigures:
    """Read the figures of the module docstring; ``read()`` returns ``{name: value}``.

    Example:
        >>> figures = ProcessFigures(local_rank=0).read()
        >>> figures["memory/rss_bytes"] > 0, "memory/cuda_allocated_bytes" in figures
        (True, False)
    """

    def __init__(
        self,
        local_rank: int | None,
        step_peak: bool | None = None,
        modules: dict[str, Any] | None = None,
    ) -> None:
        self.local_rank = local_rank
        self.step_peak = flag(OTEL_TITAN_CUDA_STEP_PEAK, False) if step_peak is None else step_peak
        self._modules = sys.modules if modules is None else modules
        self._has_proc = os.path.exists(_STATUS)
        #: Why CUDA figures stopped (an exception from torch.cuda), or None.
        self.cuda_error: str | None = None

    def read(self) -> dict[str, int | float]:
        """The figures now: a few µs without CUDA (one small /proc read, one ``times()``)."""
        figures: dict[str, int | float] = {}
        status = _status_fields() if self._has_proc else {}
        if "VmRSS" in status:
            figures["memory/rss_bytes"] = status["VmRSS"]
        if "VmHWM" in status:
            figures["memory/rss_peak_bytes"] = status["VmHWM"]
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            figures["memory/rss_peak_bytes"] = peak if sys.platform == "darwin" else peak * 1024
        times = os.times()
        figures["process/cpu_user_s"] = round(times.user, 3)
        figures["process/cpu_system_s"] = round(times.system, 3)
        if "Threads" in status:
            figures["process/threads"] = status["Threads"]
        if self.cuda_error is None:
            self._cuda(figures)
        return figures

    def _cuda(self, figures: dict[str, int | float]) -> None:
        torch = self._modules.get("torch")  # imported by the program, or not at all
        device = cuda_device(torch, self.local_rank)
        if device is None:
            return
        cuda: Any = torch.cuda  # type: ignore[union-attr]  # cuda_device returned a device: torch is there
        try:
            figures["memory/cuda_allocated_bytes"] = int(cuda.memory_allocated(device))
            figures["memory/cuda_reserved_bytes"] = int(cuda.memory_reserved(device))
            figures["memory/cuda_peak_allocated_bytes"] = int(cuda.max_memory_allocated(device))
            figures["memory/cuda_peak_reserved_bytes"] = int(cuda.max_memory_reserved(device))
            if self.step_peak:
                stats = cuda.memory_stats(device)
                figures["memory/cuda_step_peak_allocated_bytes"] = int(
                    stats.get("allocated_bytes.all.peak", 0)
                )
                cuda.reset_peak_memory_stats(device)
        except Exception as error:  # noqa: BLE001 - stop asking, say why once (the sampler logs it)
            self.cuda_error = f"{type(error).__name__}: {error}"

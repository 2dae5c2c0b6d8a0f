"""The host's pressure and throttling figures: why a rank is slow when its own code is not.

Read once per host (local rank 0), by the background thread at each step
boundary (as scalars of the step, beside `process_figures`) and by the metrics
reader (exporters/host_metrics.py). Plain files, no dependency:

* Linux pressure stall information (``/proc/pressure/{cpu,memory,io}``): the
  share of the last 10 s in which some task waited for CPU, memory or I/O
  (``host/cpu_pressure_some_pct``, ``host/memory_pressure_some_pct``,
  ``host/io_pressure_some_pct``, and the ``full`` share for memory and I/O,
  when all non-idle tasks waited). A straggler on a host whose CPU pressure is
  40 % is starved, not slow;
* the process's cgroup CPU throttling (cgroup v2 ``cpu.stat`` or v1
  ``cpu,cpuacct/cpu.stat``): ``host/cgroup_throttled_periods`` (periods in
  which the quota ran out) and ``host/cgroup_throttled_s`` (time spent
  throttled), cumulative: a container with too small a CPU quota shows here.

Missing files (not Linux, an old kernel, PSI disabled) give no figure, never
an error.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["HostFigures", "read_pressure", "cgroup_cpu_stat_path", "FIGURE_NAMES"]

_PSI = ("cpu", "memory", "io")
#: Every name `HostFigures.read` may return (the logger's own figures: the metrics' name cap never
#: drops them).
FIGURE_NAMES = frozenset(
    [f"host/{resource}_pressure_some_pct" for resource in _PSI]
    + [f"host/{resource}_pressure_full_pct" for resource in _PSI if resource != "cpu"]
    + ["host/cgroup_throttled_periods", "host/cgroup_throttled_s"]
)


def read_pressure(resource: str, root: str = "/proc/pressure") -> dict[str, float]:
    """``{"some": avg10, "full": avg10}`` (percent) of one PSI file; empty when there is none.

    Example:
        >>> isinstance(read_pressure("cpu", root="/nonexistent"), dict)
        True
    """
    out: dict[str, float] = {}
    try:
        with open(os.path.join(root, resource), encoding="ascii") as handle:
            for line in handle:
                kind, _, rest = line.partition(" ")
                for field in rest.split():
                    key, _, value = field.partition("=")
                    if key == "avg10":
                        out[kind] = float(value)
    except (OSError, ValueError):
        return {}
    return out


def cgroup_cpu_stat_path(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> str | None:
    """The ``cpu.stat`` of this process's cgroup (v1's cpu controller where mounted, else v2's), or
    None.

    Example:
        >>> cgroup_cpu_stat_path("/nonexistent") is None
        True
    """
    try:
        with open(proc_cgroup, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    v1: list[str] = []
    v2: list[str] = []
    for line in lines:
        _id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if controllers == "":  # cgroup v2 (unified)
            v2 += [
                os.path.join(root, path, "cpu.stat"),
                os.path.join(root, "unified", path, "cpu.stat"),
            ]
        elif "cpu" in controllers.split(","):
            v1 += [
                os.path.join(root, "cpu,cpuacct", path, "cpu.stat"),
                os.path.join(root, "cpu", path, "cpu.stat"),
            ]
    # A hybrid host mounts the cpu controller in v1, and there the quota is enforced.
    for candidate in v1 + v2:
        if os.path.isfile(candidate):
            return candidate
    return None


class HostFigures:
    """Read the figures of the module docstring; ``read()`` returns ``{name: value}``.

    Example:
        >>> figures = HostFigures().read()
        >>> all(name.startswith("host/") for name in figures)
        True
    """

    def __init__(self, pressure_root: str = "/proc/pressure", cpu_stat: Any = "auto") -> None:
        self._pressure_root = pressure_root
        self._cpu_stat = cgroup_cpu_stat_path() if cpu_stat == "auto" else cpu_stat

    def read(self) -> dict[str, int | float]:
        figures: dict[str, int | float] = {}
        for resource in _PSI:
            pressure = read_pressure(resource, self._pressure_root)
            if "some" in pressure:
                figures[f"host/{resource}_pressure_some_pct"] = pressure["some"]
            # cpu "full" is undefined at the system level (always 0)
            if "full" in pressure and resource != "cpu":
                figures[f"host/{resource}_pressure_full_pct"] = pressure["full"]
        if self._cpu_stat:
            stat = self._read_cpu_stat(self._cpu_stat)
            if "nr_throttled" in stat:
                figures["host/cgroup_throttled_periods"] = stat["nr_throttled"]
            if "throttled_usec" in stat:  # v2
                figures["host/cgroup_throttled_s"] = round(stat["throttled_usec"] / 1e6, 6)
            elif "throttled_time" in stat:  # v1, ns
                figures["host/cgroup_throttled_s"] = round(stat["throttled_time"] / 1e9, 6)
        return figures

    @staticmethod
    def _read_cpu_stat(path: str) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with open(path, encoding="ascii") as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if value.strip().isdigit():
                        out[key] = int(value)
        except OSError:
            return {}
        return out

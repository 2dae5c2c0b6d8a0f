"""Host figures as metrics, once per host (local rank 0): what explains a straggler beyond its own
code.

Attached by the metrics handler (metrics.py) to its `MeterProvider` in the
process of local rank 0 only, so a host of 8 ranks sends them once:

* CPU, memory, network and disk from ``opentelemetry-instrumentation-system-metrics``
  (psutil), not code of our own: ``system.cpu.utilization`` (user, system,
  iowait, steal; per core), ``system.memory.usage`` / ``.utilization``,
  ``system.swap.utilization``, ``system.network.io`` / ``.errors`` /
  ``.dropped.packets`` (per interface), ``system.disk.io`` / ``.operations``
  (per device). Read by the SDK's reader, on its thread, at each export;
* pressure stall information and the cgroup's CPU throttling (`HostFigures`)
  as gauges ``host.cpu_pressure_some_pct``, … (the names of docs/schema.md,
  ``/`` replaced by ``.``);
* where NVML is present (``nvidia-ml-py``, import guarded; nothing happens
  without a driver and a GPU, and `nvml_status` says why), per GPU with its
  ``gpu.uuid`` (to join the cluster's DCGM metrics on it) and ``gpu.index``:
  ``gpu.clock.sm`` (MHz), ``gpu.throttle_reasons`` (NVML's bitmask: power,
  thermal, sync boost…) and ``gpu.xid_errors`` (critical XID events seen since
  the logger started, counted from NVML's event set without waiting).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation

from otel_titan.core.host_figures import HostFigures
from otel_titan.distribution import install_hint

__all__ = ["HostMetrics", "SYSTEM_METRICS"]

_log = logging.getLogger("otel_titan")

#: The system-metrics instrumentation's configuration: host-level figures that explain stragglers.
SYSTEM_METRICS: dict[str, list[str] | None] = {
    "system.cpu.utilization": ["user", "system", "iowait", "steal"],
    "system.memory.usage": ["used", "free", "cached"],
    "system.memory.utilization": ["used", "free", "cached"],
    "system.swap.utilization": ["used"],
    "system.network.io": ["transmit", "receive"],
    "system.network.errors": ["transmit", "receive"],
    "system.network.dropped.packets": ["transmit", "receive"],
    "system.disk.io": ["read", "write"],
    "system.disk.operations": ["read", "write"],
}


class HostMetrics:
    """Register the host's instruments on `provider`; `close()` removes what is global (the
    instrumentor)."""

    def __init__(self, provider: Any, host_figures: HostFigures | None = None) -> None:
        self._instrumentor: Any = None
        #: Why the system metrics are off, or None.
        self.system_status: str | None = None
        #: Why there are no GPU figures, or None when NVML answered.
        self.nvml_status: str | None = None
        self._figures = host_figures or HostFigures()
        self._names = sorted(self._figures.read())
        #: The step scalars (``host/…``, core/step_sampler.py) this process already exports as the
        #: host's gauges: the metrics handler leaves them out, so one figure is one series, not two
        #: that Prometheus names alike.
        self.names = frozenset(self._names)
        meter = provider.get_meter("otel_titan.host")
        for name in self._names:
            meter.create_observable_gauge(name.replace("/", "."), callbacks=[self._observer(name)])
        self._start_system_metrics(provider)
        self._nvml: Any = None
        self._gpus: list[tuple[int, str, Any]] = []
        self._xid_set: Any = None
        self._xids: dict[str, int] = {}
        self._start_nvml(meter)

    # -- PSI and cgroup ---------------------------------------------------------------------
    def _observer(self, name: str) -> Any:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            value = self._figures.read().get(name)
            return [] if value is None else [Observation(value)]

        return observe

    # -- the system-metrics instrumentation --------------------------------------------------------
    def _start_system_metrics(self, provider: Any) -> None:
        try:
            from opentelemetry.instrumentation.system_metrics import SystemMetricsInstrumentor
        except ImportError as error:
            self.system_status = f"opentelemetry-instrumentation-system-metrics is not installed ({error}); {install_hint('metrics')}"
            _log.info("otel-titan: no system metrics: %s", self.system_status)
            return
        instrumentor = SystemMetricsInstrumentor(config=SYSTEM_METRICS)
        if instrumentor.is_instrumented_by_opentelemetry:
            self.system_status = (
                "already instrumented in this process (by the program or another logger)"
            )
            return
        try:
            instrumentor.instrument(meter_provider=provider)
        except Exception as error:  # noqa: BLE001 - host figures are a bonus, never a failed init
            self.system_status = f"{type(error).__name__}: {error}"
            _log.warning("otel-titan: the system metrics could not start: %s", self.system_status)
            return
        self._instrumentor = instrumentor

    # -- NVML --------------------------------------------------------------------------------------
    def _start_nvml(self, meter: Any) -> None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            self.nvml_status = "nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                self._gpus.append(
                    (index, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle)
                )
        except Exception as error:  # noqa: BLE001 - no driver, no GPU: NVMLError_LibraryNotFound, _DriverNotLoaded...
            self.nvml_status = f"NVML is not available here ({type(error).__name__}: {error})"
            return
        if not self._gpus:
            self.nvml_status = "NVML sees no GPU"
            return
        self._nvml = pynvml
        try:
            self._xid_set = pynvml.nvmlEventSetCreate()
            for _index, _uuid, handle in self._gpus:
                pynvml.nvmlDeviceRegisterEvents(
                    handle, pynvml.nvmlEventTypeXidCriticalError, self._xid_set
                )
        except Exception:  # noqa: BLE001 - XID events need a supported GPU and driver; clocks still work
            self._xid_set = None
        meter.create_observable_gauge("gpu.clock.sm", unit="MHz", callbacks=[self._observe_clocks])
        meter.create_observable_gauge("gpu.throttle_reasons", callbacks=[self._observe_throttle])
        meter.create_observable_counter("gpu.xid_errors", callbacks=[self._observe_xids])

    def _each_gpu(self, read: Any) -> list[Observation]:
        out = []
        for index, uuid, handle in self._gpus:
            try:
                out.append(Observation(read(handle), {"gpu.uuid": uuid, "gpu.index": index}))
            except Exception:  # noqa: BLE001 - one GPU that fails a query: the others still report
                continue
        return out

    def _observe_clocks(self, _options: CallbackOptions) -> Iterable[Observation]:
        nvml = self._nvml
        return self._each_gpu(
            lambda handle: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        )

    def _observe_throttle(self, _options: CallbackOptions) -> Iterable[Observation]:
        nvml = self._nvml
        return self._each_gpu(nvml.nvmlDeviceGetCurrentClocksThrottleReasons)

    def _observe_xids(self, _options: CallbackOptions) -> Iterable[Observation]:
        nvml = self._nvml
        if self._xid_set is not None:
            while True:
                try:
                    event = nvml.nvmlEventSetWait(self._xid_set, 0)  # never waits
                except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no event pending
                    break
                uuid = nvml.nvmlDeviceGetUUID(event.device)
                uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
                self._xids[uuid] = self._xids.get(uuid, 0) + 1
        return [
            Observation(self._xids.get(uuid, 0), {"gpu.uuid": uuid, "gpu.index": index})
            for index, uuid, _handle in self._gpus
        ]

    # -- shutdown ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Uninstrument (the instrumentor is process-global) and let NVML go."""
        instrumentor, self._instrumentor = self._instrumentor, None
        if instrumentor is not None:
            try:
                instrumentor.uninstrument()
            except Exception:  # noqa: BLE001 - closing: nothing to recover, the others still close
                pass
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            try:
                if self._xid_set is not None:
                    nvml.nvmlEventSetFree(self._xid_set)
                nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - closing: nothing to recover
                pass

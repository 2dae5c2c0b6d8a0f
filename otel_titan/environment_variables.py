"""Every environment variable otel-titan itself reads, each named once with what it does.

As OpenTelemetry's ``opentelemetry.sdk.environment_variables``: a constant per
variable, its value the variable's name, its docstring the variable's meaning,
default and where it is read. The writer, the CLI and the analysis refer to
these constants, never to the spelled-out name, so a variable cannot be read
under two spellings, and `tests/test_environment_variables.py` checks that
every ``OTEL_TITAN_…`` name in the package is defined here and documented in
docs/configuration.md (the page a user reads; this module is its source).

`flag` reads every on/off variable with one vocabulary (``1``/``0``, ``true``/``false``,
``on``/``off``, ``yes``/``no``, any case); another value is warned about once and its default used.

A leaf module, standard library only (it defines strings, and the one reader of on/off values), on
the schema's level: every layer may import it and it imports nothing of otel_titan. An option of
`init_structured_logger` always wins over its variable.

The standard ``OTEL_*`` variables (``OTEL_TRACES_EXPORTER``,
``OTEL_EXPORTER_OTLP_*``, ``OTEL_SDK_DISABLED`` …) are OpenTelemetry's and keep
their specification's meaning; they are read in `otel_titan.exporters.otel_env`
and docs/collectors.md lists them.

Example:
    >>> from otel_titan import environment_variables as ev
    >>> ev.OTEL_TITAN_RUN_ID
    'OTEL_TITAN_RUN_ID'
    >>> ev.OTEL_TITAN_MESH in ev.ALL
    True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

__all__ = [
    "OTEL_TITAN_RUN_ID",
    "OTEL_TITAN_PROCESS_RUN_ID",
    "OTEL_TITAN_HANDLERS",
    "TITAN_STRUCT_LOGGER_HANDLERS",
    "OTEL_TITAN_TRACE_GROUP_SIZE",
    "OTEL_TITAN_MESH",
    "OTEL_TITAN_PROCESS_FIGURES",
    "OTEL_TITAN_CUDA_STEP_PEAK",
    "OTEL_TITAN_STALL_AFTER_S",
    "OTEL_TITAN_STALL_MIN_S",
    "OTEL_TITAN_FAULTHANDLER",
    "OTEL_TITAN_DUMP_SIGNAL",
    "OTEL_TITAN_DUMP_TRIGGER",
    "OTEL_TITAN_METRICS_PER_RANK",
    "OTEL_TITAN_METRICS_MAX_NAMES",
    "OTEL_TITAN_HOST_METRICS",
    "OTEL_TITAN_STEP_ROLLUPS",
    "OTEL_TITAN_OTLP_RECORDS",
    "OTEL_TITAN_OTLP_RECORDS_QUEUE",
    "OTEL_TITAN_OTLP_RECORDS_DELAY_MS",
    "OTEL_TITAN_MCP_TOKEN",
    "OTEL_TITAN_WATCH_TOKEN",
    "ALL",
    "TRUE_VALUES",
    "FALSE_VALUES",
    "flag",
]

# -- who the process is ----------------------------------------------------------------------------

OTEL_TITAN_RUN_ID = "OTEL_TITAN_RUN_ID"
"""The run's id, shared by every process of the run (written as ``run_id`` in every record).

Read after the ``run_id=`` option and before torchrun's ``TORCHELASTIC_RUN_ID``,
``SLURM_JOB_ID`` and ``RAY_JOB_ID``. The user may set it; a running logger sets
it for the processes it starts (subprocesses, multiprocessing workers), so
that they name its run. Default: unset (the launcher's id, else none).
Read in `otel_titan.core.identity`.
"""

OTEL_TITAN_PROCESS_RUN_ID = "OTEL_TITAN_PROCESS_RUN_ID"
"""The process tree's id when no run id is known (``process_run_id``, 32 hex digits).

Set by a running logger that has no run id, for the processes it starts; the
reader groups processes without a run id by it. Not meant to be set by hand.
Default: unset (a new random id). Read in `otel_titan.core.identity`.
"""

# -- which handlers write --------------------------------------------------------------------------

OTEL_TITAN_HANDLERS = "OTEL_TITAN_HANDLERS"
"""Comma-separated import paths of handler factories (``pkg.mod.factory``): exactly these run.

Read after the ``handlers=`` option, before `TITAN_STRUCT_LOGGER_HANDLERS`; when
set it also wins over ``OTEL_TRACES_EXPORTER`` and the other defaults
(docs/handlers.md). Default: unset (the JSONL file, plus what the ``OTEL_*``
exporter variables ask for). Read in `otel_titan.structured_logger.handler_factories`.
"""

TITAN_STRUCT_LOGGER_HANDLERS = "TITAN_STRUCT_LOGGER_HANDLERS"
"""torchtitan's name for `OTEL_TITAN_HANDLERS`, read after it, so that existing job scripts keep working.

Default: unset. Read in `otel_titan.structured_logger.handler_factories`.
"""

# -- what is written -------------------------------------------------------------------------------

OTEL_TITAN_TRACE_GROUP_SIZE = "OTEL_TITAN_TRACE_GROUP_SIZE"
"""Ranks per trace and step (option ``trace_group_size``); ``0`` puts every rank in one trace per step.

Default: 32, which keeps a 1,024-rank step's traces within Jaeger's and Tempo's
limits (docs/collectors.md). Not an integer >= 0: `init_structured_logger`
fails naming it. Read in `otel_titan.core.trace_ids`.
"""

OTEL_TITAN_MESH = "OTEL_TITAN_MESH"
"""The job's device mesh when the program does not declare one (option ``mesh``): ``pp=2,dp=4,tp=2`` or a JSON object.

Each rank's coordinates are written (``mesh``, ``mesh_shape``), and the
straggler analysis compares ranks that differ only in data-parallel dimensions.
Default: unset (no mesh). Sizes that cannot hold the rank or do not multiply to
the world size: `init_structured_logger` fails naming them. Read in `otel_titan.core.mesh`.
"""

OTEL_TITAN_PROCESS_FIGURES = "OTEL_TITAN_PROCESS_FIGURES"
"""``0``, ``false``, ``no`` or ``off``: no memory and CPU scalars at each step (option ``process_figures``).

Default: on (docs/schema.md lists the figures). Read in `otel_titan.core.process_figures`.
"""

OTEL_TITAN_STEP_ROLLUPS = "OTEL_TITAN_STEP_ROLLUPS"
"""``0``, ``false``, ``no`` or ``off``: no ``step_rollup`` record per step in the JSONL file (option ``step_rollups``).

Default: on (one line per rank and step: the step's time, each phase's total
and count, the step-closing span; docs/schema.md "Step rollups").
Read in `otel_titan.exporters.step_rollups`.
"""

OTEL_TITAN_OTLP_RECORDS = "OTEL_TITAN_OTLP_RECORDS"
"""``true``, ``1``, ``yes`` or ``on``: every record of the JSONL file also as an OTLP log record, in order.

For ``otel-titan watch --otlp`` where the files cannot be read (NFS, node-local
folders; docs/watch.md): each span's start, heartbeats and the black box
included. Default: off (it doubles what a rank sends to a collector).
Read in `otel_titan.exporters.otlp_records`.
"""

OTEL_TITAN_OTLP_RECORDS_QUEUE = "OTEL_TITAN_OTLP_RECORDS_QUEUE"
"""How many records the OTLP records stream holds while its receiver is slow or down; more are dropped and counted.

Default: 65536. Read in `otel_titan.exporters.otlp_records`.
"""

OTEL_TITAN_OTLP_RECORDS_DELAY_MS = "OTEL_TITAN_OTLP_RECORDS_DELAY_MS"
"""Milliseconds between two sends of the OTLP records stream (or sooner, at 512 records).

Default: 200. Read in `otel_titan.exporters.otlp_records`.
"""

OTEL_TITAN_WATCH_TOKEN = "OTEL_TITAN_WATCH_TOKEN"
"""The bearer token `otel-titan watch --otlp` asks of every request (401 without it), when ``--otlp-token-file`` is not given.

Read by the watching side only. The ranks (or the collector forwarding to
the watch) send it as OTLP exporters send any header:
``OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>`` (docs/security.md).
Required to listen beyond loopback. Default: unset (no token; loopback only).
Read in `otel_titan.cli`.
"""

OTEL_TITAN_CUDA_STEP_PEAK = "OTEL_TITAN_CUDA_STEP_PEAK"
"""``1``, ``true``, ``on`` or ``yes``: also write each step's peak CUDA memory (``memory/cuda_step_peak_allocated_bytes``).

Off by default: it resets the allocator's peak counter after each reading,
which changes what ``torch.cuda.max_memory_allocated`` returns to the program.
Read in `otel_titan.core.process_figures`.
"""

# -- the hang black box ----------------------------------------------------------------------------

OTEL_TITAN_STALL_AFTER_S = "OTEL_TITAN_STALL_AFTER_S"
"""Seconds without a span ending that make a stall, which writes the black box (option ``stall_after_s``); ``0``: off.

Default: automatic, the larger of `OTEL_TITAN_STALL_MIN_S` (120 s) and 10 × the
longest gap seen so far (docs/hangs.md). Not a number >= 0:
`init_structured_logger` fails naming it. Read in `otel_titan.structured_logger.lifecycle`.
"""

OTEL_TITAN_STALL_MIN_S = "OTEL_TITAN_STALL_MIN_S"
"""The automatic stall threshold's floor in seconds, for short jobs and tests.

Default: 120. Not a number: `init_structured_logger` fails naming it; ``0`` or
less: the default. Read in `otel_titan.core.blackbox`.
"""

OTEL_TITAN_FAULTHANDLER = "OTEL_TITAN_FAULTHANDLER"
"""``0``, ``false``, ``no`` or ``off``: never arm `faulthandler`'s dump of every thread's stack beside a stall.

Set it when the program arms ``faulthandler.dump_traceback_later`` itself before
importing otel-titan (there is one such dump per process). Default: on.
Read in `otel_titan.core.blackbox`.
"""

OTEL_TITAN_DUMP_SIGNAL = "OTEL_TITAN_DUMP_SIGNAL"
"""A signal (``SIGUSR2``, ``USR2`` or its number) that makes the process write its black box, and nothing else.

SIGTERM, SIGINT, SIGKILL and SIGSTOP are refused (a warning; no dump signal).
Default: unset (none). Read in `otel_titan.structured_logger.process_hooks`.
"""

OTEL_TITAN_DUMP_TRIGGER = "OTEL_TITAN_DUMP_TRIGGER"
"""A file path: touching the file makes every process of the run write its black box (checked every 2 s).

`otel-titan watch` touches it on a suspected hang (its ``--trigger`` default).
Default: unset (none). Read in `otel_titan.structured_logger.lifecycle` and
`otel_titan.analysis.watch.loop`.
"""

# -- metrics (OTEL_METRICS_EXPORTER) ---------------------------------------------------------------

OTEL_TITAN_METRICS_PER_RANK = "OTEL_TITAN_METRICS_PER_RANK"
"""Comma-separated `fnmatch` patterns of span names whose durations get bucketed histograms per rank.

Default: ``step,train_step,training_step`` (bucketed histograms of every phase at
1,024 ranks would be 645,000 series; docs/collectors.md). Read in `otel_titan.exporters.metrics`.
"""

OTEL_TITAN_METRICS_MAX_NAMES = "OTEL_TITAN_METRICS_MAX_NAMES"
"""The most distinct scalar names, and span names, recorded as metrics; past it they are counted as overflow.

Default: 1000. Not an integer >= 1: the metrics handler fails naming it.
Read in `otel_titan.exporters.metrics`.
"""

OTEL_TITAN_HOST_METRICS = "OTEL_TITAN_HOST_METRICS"
"""``0``, ``false``, ``no`` or ``off``: no host gauges (CPU, memory, network, disk, GPUs) from local rank 0.

Default: on (local rank 0 of each host only). Read in `otel_titan.exporters.metrics`.
"""

# -- the agents' server ----------------------------------------------------------------------------

OTEL_TITAN_MCP_TOKEN = "OTEL_TITAN_MCP_TOKEN"
"""The bearer token ``otel-titan mcp --http`` requires of every request (``Authorization: Bearer TOKEN``).

Default: unset: a random token is made at start and printed on stderr with the
URL. Never used over stdio. Read in `otel_titan.cli`.
"""

#: Every variable above, in this module's order (docs/configuration.md's table lists the same).
ALL = tuple(globals()[name] for name in __all__ if name.startswith(("OTEL_TITAN_", "TITAN_")))

# -- reading a boolean variable --------------------------------------------------------------------

#: The one vocabulary of every on/off variable above (any case, spaces around ignored).
TRUE_VALUES = frozenset({"1", "true", "on", "yes"})
FALSE_VALUES = frozenset({"0", "false", "off", "no"})
_log = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()


def flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The on/off variable `name` of `environ` (default: ``os.environ``): `default` when unset or
    empty.

    ``1``, ``true``, ``on``, ``yes`` are on; ``0``, ``false``, ``off``, ``no`` off, in any case. Any
    other value is warned about once per variable and value (naming both, and the default used),
    then read as `default`: a typo never silently turns a feature the other way.

    Example:
        >>> flag("OTEL_TITAN_CUDA_STEP_PEAK", False, {"OTEL_TITAN_CUDA_STEP_PEAK": " On "})
        True
        >>> flag("OTEL_TITAN_STEP_ROLLUPS", True, {"OTEL_TITAN_STEP_ROLLUPS": ""})
        True
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE_VALUES:
        return True
    if value in FALSE_VALUES:
        return False
    if not value:
        return default
    if (name, raw) not in _warned:
        _warned.add((name, raw))
        _log.warning(
            "otel-titan: %s=%r is not one of 1/0, true/false, on/off, yes/no: using its default "
            "(%s)",
            name,
            raw,
            "on" if default else "off",
        )
    return default

"""What `otel-titan summarize` reports, as data: `RunSummary` and its parts (`to_dict()` is the
``--json`` form).

Times are µs since the epoch (``*_us``); `to_dict` adds UTC strings.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from otel_titan.analysis.model.clocks import ClockAlignment
from otel_titan.analysis.model.ending import crash_state
from otel_titan.analysis.read.runs import RunInfo

# model.hang imports model.headline, which imports this module: for the annotation alone
if TYPE_CHECKING:
    from otel_titan.analysis.model.hang import HangReport

__all__ = [
    "innermost_open",
    "JobSlowdown",
    "OpenSpanInfo",
    "PhaseStats",
    "ProcessSummary",
    "RankSlowness",
    "RunSummary",
    "StepTimes",
    "StopGroup",
    "StragglerFinding",
    "Stragglers",
    "utc",
]


def innermost_open(spans: list[Any]) -> Any:
    """The innermost span of the most recently opened nest (`OpenSpanInfo`s in file order): the last
    leaf.

    Never chosen by timestamp: a child can start in the same µs as its parent.
    """
    return next(
        (span for span in reversed(spans) if getattr(span, "innermost", True)),
        spans[-1] if spans else None,
    )


def utc(time_us: int | None) -> str | None:
    """ISO-8601 UTC time of a µs timestamp, to the millisecond; None past the calendar's year 9999.

    The reader keeps any timestamp below 2**62 µs (a corrupt or forged one included): it must not
    stop a summary.

    Example:
        >>> utc(1_796_019_011_273_390), utc(253_402_300_799_999_984)
        ('2026-11-30T06:10:11.273Z', None)
    """
    if time_us is None:
        return None
    try:
        moment = _dt.datetime.fromtimestamp(time_us / 1e6, tz=_dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class OpenSpanInfo:
    """A span whose ``_end`` never came: the process died, hung, or is still running."""

    name: str
    path: list[str]
    step: int | None
    start_us: int
    open_s: float
    task_name: str | None = None
    thread: int | None = None
    failed: bool = False
    #: No other open span is nested in it (by parent id, else LIFO on its lane): a leaf of the open
    #: nest.
    innermost: bool = True


@dataclass
class ProcessSummary:
    """Where one process (one chain of files) got to."""

    label: str
    source: str
    rank: int | None
    attempt: int | None
    pid: int | None
    host_name: str | None
    run_id: str | None
    files: list[str]
    records: int = 0
    skipped_lines: int = 0
    first_us: int | None = None
    last_us: int | None = None
    last_step: int | None = None
    last_relative_step: int | None = None
    last_event: str | None = None
    last_event_us: int | None = None
    last_event_step: int | None = None
    behind_s: float = 0.0
    closed_cleanly: bool | None = None
    signal: str | None = None
    records_dropped: int = 0
    records_failed: int = 0
    lost_lines: int = 0
    first_seq_id: int | None = None
    open_span_count: int = 0
    open_spans: list[OpenSpanInfo] = field(default_factory=list)
    #: When the file was created: its ``structured_logger_opened`` record, or an empty file's
    #: modification time.
    created_us: int | None = None
    #: No record but the logger's own since the file was created, and no clean close: hung before
    #: its first record.
    hang_suspect: bool = False
    #: Whether its process is still alive, read from this host's process table when the reader
    #: runs where it ran (`read.processes_here.alive_here`); None: cannot tell (another host). Set
    #: on each read, never kept in the cache.
    alive_here: bool | None = None
    #: The file ends mid-line: the process was killed (SIGKILL, OOM) or crashed while writing (or is
    #: writing now).
    torn_last_line: bool = False
    #: Its host's clock offset, subtracted from every time shown (`model.clocks`); 0 when not
    #: aligned.
    clock_offset_ms: float = 0.0
    #: Its watchdog's ``stall`` record is its latest news (no program record since): stuck, however
    #: fresh its heartbeats keep the file. Set from the hang facts (`model.hang_facts`), so
    #: "running" never stands beside a hang.
    stalled_now: bool = False
    #: How its program ended, when it crashed (`model.ending.crash_of`: type, message, file, line,
    #: function, span, step, time_us): an uncaught exception (even with a closing record after it),
    #: or killed without a word (type ``killed``: no closing, signal or crash record, and its peers
    #: failed after its last record).
    crash: dict[str, Any] | None = None
    #: When its ``signal_received`` record was written (µs), with `signal`.
    signal_us: int | None = None
    #: Uncaught exceptions of its other threads (the program went on): the first few.
    thread_exceptions: list[dict[str, Any]] = field(default_factory=list)

    def state(self, now_us: float, running_s: float = 60.0) -> str:
        """How the process ended: ``crashed``, ``interrupted``, ``closed``, ``hung before first
        record``, ``terminated (SIGTERM)``, ``running``, ``stalled``, ``stopped``.

        docs/hangs.md's table says which record gives which state; an uncaught
        exception decides before the closing record the exit hook writes after it.
        A file with no closing record to expect (torchtitan's, pimm's) is
        ``running`` while fresh, then ``stopped``: its end is unknown.
        """
        if self.crash is not None:
            return crash_state(self.crash)
        if self.closed_cleanly:
            return "closed"
        if self.hang_suspect:
            return "hung before first record"
        if self.signal:
            # Before a torn last line: a process terminated (its ``signal_received`` record), then
            # killed while still writing (torchrun's SIGKILL after its grace period), was stopped
            # by the launcher as its peers were; it did not die first (`watch` says so too).
            return f"terminated ({self.signal})"
        if self.torn_last_line:
            return "crashed"
        last = self.last_us if self.last_us is not None else self.created_us
        if last is not None and now_us - last < running_s * 1e6 and not self.stalled_now:
            return "running"
        # torchtitan's and pimm's files have no closing record: quiet, their process may have
        # finished, hung or died (never "ended": a live hang read from them is one); alive on this
        # host, it is stalled.
        return (
            "stopped" if self.closed_cleanly is None and self.alive_here is not True else "stalled"
        )

    @property
    def last_phase(self) -> str | None:
        """The innermost open span of the most recently started nest, or None when nothing is
        open."""
        span = innermost_open(self.open_spans)
        return span.name if span is not None else None

    @property
    def stop_key(self) -> str:
        """What the process was doing when its records end: its last event."""
        return self.last_event or "(nothing logged)"


@dataclass
class PhaseStats:
    """Durations of one phase's completed spans, over every rank and step."""

    source: str
    name: str
    count: int
    errors: int
    incomplete: int
    total_ms: float
    p50_ms: float
    p95_ms: float
    max_ms: float
    slowest: str
    slowest_rank: int | None
    slowest_attempt: int | None
    slowest_step: int | None


@dataclass
class StepTimes:
    """One step (or one phase in one step) on every rank that completed it.

    `slowest_rank` is None when the slowest time is shared (a tie is nobody's);
    `excess_ms` is the slowest rank's time minus the other ranks' median (0 on a tie).
    """

    step: int
    ms: dict[int, float]
    slowest_rank: int | None
    excess_ms: float


@dataclass
class RankSlowness:
    """One rank against the others: its median, theirs, the difference, the noise, and the verdict.

    `median_excess_ms` = `median_ms` − `others_median_ms` (the median of the
    other ranks' medians), `median_excess_pct` the same relative to
    `others_median_ms` (None when that is 0). `robust_z` = excess / `noise_ms`
    (None when the noise is 0). `slowest_steps`: steps in which it alone was
    the slowest. `differs`: the rule of `model.stragglers.compare_ranks` holds;
    `straggler`: it holds among at least three ranks (with two there is no
    majority to call one of them abnormal).
    """

    rank: int
    compared_steps: int
    slowest_steps: int
    median_ms: float
    others_median_ms: float
    median_excess_ms: float
    median_excess_pct: float | None
    noise_ms: float
    robust_z: float | None
    straggler: bool
    differs: bool = False


@dataclass(frozen=True)
class JobSlowdown:
    """The whole job slower than its own past (`model.job_speed`: the ``job_slow`` rule of `watch`
    and `summarize`): no rank stands out, every rank moved."""

    #: Where the slowdown began (the running median's crossing of the midpoint), the first step
    #: of the slower part as judged (its baseline: the steps before it) and the last step judged.
    since_step: int
    split_step: int
    last_step: int
    #: The step time (ms, per token where the program logs a token count) before and now: the
    #: medians of the baseline's and the window's steps, and the rise in % of the former.
    base_ms: float
    recent_ms: float
    pct: float
    per_token: bool
    #: The phase that grew most on most ranks, and by how much (ms per step).
    phase: str | None
    phase_grown_ms: float | None

    def describe(self) -> str:
        """The finding in words, as `watch` and `summarize` say it.

        Example:
            >>> JobSlowdown(75, 76, 140, 100.0, 140.0, 40.0, False, "data_fetch", 40.0).describe()
            'job slower: step time +40% (100.0 → 140.0 ms) since step 75; data_fetch grew most (+40.0 ms)'
        """
        unit = " per token" if self.per_token else ""
        grew = f"; {self.phase} grew most (+{self.phase_grown_ms:,.1f} ms)" if self.phase else ""
        return (
            f"job slower: step time +{self.pct:.0f}% ({self.base_ms:,.1f} → {self.recent_ms:,.1f} "
            f"ms{unit}) since step {self.since_step}{grew}"
        )


@dataclass
class StragglerFinding:
    """One verdict of the straggler analysis (`model.stragglers`), with what it costs the run.

    `kind`: ``step`` (its step time), ``phase`` (`what` is the phase) or
    ``arrival`` (at the step-closing collective `what`). `verdict`:
    ``straggler`` (slower than a majority of its peers, on evidence),
    ``difference`` (fewer than three peers: shown, nobody blamed) or ``cannot
    tell`` (longer, but whether it waited or worked cannot be known: see
    `Stragglers.withheld`). `peers`: the ranks compared (same mesh `group`).
    `cost_per_step_ms`: what the run would save per step without it (every
    rank pays a straggler's delay at the collective); `cost_run_ms` that over
    the steps compared; `share_of_step` against the median step. `persistent`:
    large in both halves of the run (`first_half_excess_ms`,
    `second_half_excess_ms`); `large_from_step`…`large_to_step`: where it was
    large; `since_step`: large from there to the end (an onset that lasted). `headline`: it reaches
    "Look first at" (else `why_not_headline`).
    """

    source: str
    attempt: int | None
    rank: int
    kind: str
    what: str
    verdict: str
    peers: list[int]
    group: dict[str, int]
    median_ms: float
    others_median_ms: float
    excess_ms: float
    excess_pct: float | None
    noise_ms: float
    robust_z: float | None
    compared_steps: int
    slowest_steps: int
    lateness_ms: float | None
    cost_per_step_ms: float
    cost_run_ms: float
    share_of_step: float | None
    persistent: bool
    first_half_excess_ms: float | None
    second_half_excess_ms: float | None
    large_from_step: int | None
    large_to_step: int | None
    large_steps: int
    headline: bool
    why_not_headline: str | None
    #: Not in both halves, but large from this step to the last one compared (a fail-slow onset that
    #: keeps costing): None otherwise.
    since_step: int | None = None
    #: A slowdown found between change points (`model.stragglers.change_windows`): judged on steps
    #: `window_from_step`… `window_to_step` alone (it started late, or came and went); None for a
    #: finding over every step.
    window_from_step: int | None = None
    window_to_step: int | None = None


@dataclass
class Stragglers:
    """Straggler analysis of one source and restart attempt: step times per rank, straggler ranks
    and phases."""

    source: str
    attempt: int | None
    ranks: list[int]
    median_step_ms: float | None
    steps: list[StepTimes]
    ranks_by_slowness: list[RankSlowness]
    straggler_ranks: list[int]
    phase_stragglers: list[dict[str, Any]]
    #: Arrival at the step-closing collective (aligned clocks): the collective, steps compared,
    #: stragglers, who was last most often.
    arrival_collective: str | None = None
    arrival_steps: int = 0
    arrival_stragglers: list[dict[str, Any]] = field(default_factory=list)
    last_arrivals: list[dict[str, int]] = field(default_factory=list)
    #: Every verdict with its cost (`StragglerFinding`): what "Look first at" and the report show.
    findings: list[StragglerFinding] = field(default_factory=list)
    #: Conclusions not drawn, each with why (clocks that cannot be compared, no collective every
    #: rank leaves together).
    withheld: list[str] = field(default_factory=list)
    #: Ranks compared with each other (same mesh coordinates but data-parallel): ``{"group": {"pp":
    #: 1}, "ranks": [...]}``.
    peer_groups: list[dict[str, Any]] = field(default_factory=list)
    #: The steps compared (``summarize --steps A:B``: ``"A:B"``); None: every step.
    steps_compared: str | None = None
    #: Every rank slower than the job's own earlier steps (`model.job_speed`), at the run's end.
    job_slowdown: JobSlowdown | None = None


@dataclass
class StopGroup:
    """Processes whose records end at the same event."""

    event: str
    count: int
    processes: list[str]
    odd_one_out: bool


@dataclass
class RunSummary:
    """Everything `otel-titan summarize` prints; `to_dict()` is its ``--json`` form."""

    run_dir: str
    log_dir: str
    run_ids: list[str]
    first_us: int | None
    last_us: int | None
    records: int
    skipped_lines: int
    skipped_examples: list[str]
    processes: list[ProcessSummary]
    stopped_at: list[StopGroup]
    phases: list[PhaseStats]
    stragglers: list[Stragglers]
    #: The run analysed (a folder can hold several: the latest unless chosen), how it was chosen,
    #: every run found.
    run_id: str | None = None
    run_selection: str = "only"
    runs: list[RunInfo] = field(default_factory=list)
    #: Processes with no record since their file was created (see `ProcessSummary.hang_suspect`).
    hang_suspects: list[str] = field(default_factory=list)
    #: The thresholds of the straggler rule (`model.stragglers.compare_ranks`).
    straggler_rule: dict[str, float] = field(default_factory=dict)
    #: Lines kept after lone surrogates in their strings were escaped
    #: (`read.lines.SkippedLines.repaired`).
    repaired_lines: int = 0
    #: Clock offsets per host and how they were found (`model.clocks`).
    clock: ClockAlignment | None = None
    #: Built from file tails only (`summarize_tails`): no phases, no stragglers.
    tail_only: bool = False
    #: The Hang section (`model.hang.HangReport`), None when every process closed cleanly and none
    #: stalled.
    hang: HangReport | None = None
    #: Ranks the records' ``world_size`` says exist but that wrote no file
    #: (`model.collect.missing_ranks`).
    missing: list[dict[str, Any]] = field(default_factory=list)
    #: Stalls that progress ended (the process resumed): history, not hangs (`hang.stall_history`).
    stalls_ended: list[dict[str, Any]] = field(default_factory=list)
    #: Slow steps next to a memory peak or a busy host, one line each (analysis/step_figures.py).
    slow_steps: list[str] = field(default_factory=list)
    #: Configurations (``sl.log_run_config``) whose hash differs between ranks, one line each
    #: (analysis/config_drift.py).
    config_drift: list[str] = field(default_factory=list)

    def straggler_findings(self, headline_only: bool = False) -> list[StragglerFinding]:
        """Every straggler finding of the run (or only those for "Look first at"), most costly
        first.

        Example (a run of 3 steps: too few to call anyone a straggler):
            >>> from otel_titan.analysis import summarize_run
            >>> [(f.rank, f.what, f.cost_per_step_ms) for f in summarize_run("outputs").straggler_findings()]
            []
        """
        found = [
            f
            for group in self.stragglers
            for f in group.findings
            if f.headline or not headline_only
        ]
        return sorted(
            found,
            key=lambda f: (not f.headline, f.verdict != "straggler", -f.cost_per_step_ms, f.rank),
        )

    def to_dict(self, now_us: float | None = None) -> dict[str, Any]:
        """The facts as a JSON-ready dict: times as µs and as UTC strings, open spans with their
        path.

        The ``--json`` form puts the diagnosis (`model.headline.headline_data`) first:
        `otel_titan.analysis.summarize.summary_json`. Not here: the headline is
        computed from these facts, so this module sits below it.

        Example:
            >>> import json
            >>> from otel_titan.analysis import summarize_run
            >>> facts = json.loads(json.dumps(summarize_run("outputs").to_dict()))
            >>> [p["label"] for p in facts["processes"]]
            ['training rank 0', 'training rank 1']
        """
        data = asdict(self)
        now_us = time.time() * 1e6 if now_us is None else now_us
        data["first_utc"], data["last_utc"] = utc(self.first_us), utc(self.last_us)
        data["last_record_s_before_now"] = (
            None if self.last_us is None else round(max(now_us - self.last_us, 0) / 1e6, 3)
        )
        data["duration_s"] = (
            None
            if self.first_us is None or self.last_us is None
            else round((self.last_us - self.first_us) / 1e6, 6)
        )
        for process, raw in zip(self.processes, data["processes"]):
            raw["last_utc"] = utc(process.last_us)
            raw["last_event_utc"] = utc(process.last_event_us)
            raw["last_phase"] = process.last_phase
            raw["created_utc"] = utc(process.created_us)
            raw["created_s_before_now"] = (
                None
                if process.created_us is None
                else round(max(now_us - process.created_us, 0) / 1e6, 3)
            )
            raw["state"] = process.state(now_us)
            # The crash wins (docs/hangs.md, "How a process ended"): the exit hook's closing record
            # after an uncaught exception is no clean close. Whether that record was written stays
            # in `closing_record`.
            raw["closing_record"] = process.closed_cleanly
            if process.crash is not None:
                raw["closed_cleanly"] = False
            for span in raw["open_spans"]:
                span["start_utc"] = utc(span["start_us"])
        for info in data["runs"]:
            if info["start_us"] is None and info["selected"] and not self.tail_only:
                # the one run of its folder: its start is its first record
                info["start_us"] = self.first_us
            info["start_utc"] = utc(info["start_us"])
        if self.clock is not None and not self.clock.applied:
            data["clock"]["residual_p95_us"] = None  # nothing applied: no alignment has a residual
        for group in data["stragglers"]:
            for step in group["steps"]:
                step["ms"] = {str(rank): ms for rank, ms in step["ms"].items()}
        return data

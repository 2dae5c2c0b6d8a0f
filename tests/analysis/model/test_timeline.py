"""Pairing rules: by span id, else LIFO per lane and name; orphans, errors, incomplete spans; step
boundaries; lanes."""

from __future__ import annotations

import asyncio
import threading

from otel_titan import structured_logger as sl
from otel_titan.analysis import ProcessExtent, TimelineVisitor, walk_process
from otel_titan.analysis.model.timeline import error_details
from tests.helpers.analysis import T0, titan_record, titan_span


class Recorder(TimelineVisitor):
    """Remembers everything the walker reports, as plain tuples."""

    def __init__(self):
        self.spans, self.errors, self.instants, self.scalars, self.metas, self.steps, self.lanes = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        self._next_track = 0

    def lane_opened(self, lane):
        self._next_track += 1
        self.lanes.append(("open", lane, self._next_track))
        return self._next_track

    def lane_closed(self, lane, track):
        self.lanes.append(("close", lane, track))

    def span(self, span, end, end_us, dur_us, incomplete):
        self.spans.append(
            (
                span.name,
                span.start_us - T0,
                round(dur_us),
                incomplete,
                span.error is not None,
                span.start is None,
                span.track,
            )
        )

    def error(self, record, span, track):
        self.errors.append((record["log_type_name"], None if span is None else span.name))

    def instant(self, record, track):
        self.instants.append((record["log_type_name"], track))

    def scalar(self, record, track):
        self.scalars.append(record["event_name"])

    def meta(self, record):
        self.metas.append(record["log_type_name"])

    def step(self, step, begin_us, end_us, first):
        self.steps.append((step, begin_us - T0, end_us - T0))


def walk(records):
    recorder = Recorder()
    extent = walk_process(records, recorder)
    return recorder, extent


def test_span_ids_pair_interleaved_threads_exactly():
    records = [
        titan_record("work_start", 0, tid=1, span_id="a"),
        titan_record("work_start", 1, tid=2, span_id="b"),
        titan_record("work_end", 5, tid=1, span_id="a", value=5.0),
        titan_record("work_end", 9, tid=2, span_id="b", value=8.0),
    ]
    recorder, extent = walk(records)
    assert [(name, start, dur) for name, start, dur, *_ in recorder.spans] == [
        ("work", 0, 5000),
        ("work", 1000, 8000),
    ]
    assert extent == ProcessExtent(4, T0, T0 + 9000)


def test_without_ids_pairing_is_lifo_per_thread_task_and_name():
    records = [
        titan_record("recurse_start", 0),
        titan_record("recurse_start", 1),
        titan_record("recurse_end", 2, value=1.0),  # the inner one
        titan_record("fetch_start", 3, task_name="Task-1"),
        titan_record("fetch_start", 4, task_name="Task-2"),
        # Task-1's, not the most recent
        titan_record("fetch_end", 6, task_name="Task-1", value=3.0),
        titan_record("recurse_end", 7, value=7.0),
        titan_record("fetch_end", 8, task_name="Task-2", value=4.0),
    ]
    recorder, _ = walk(records)
    assert [(n, s, d) for n, s, d, *_ in recorder.spans] == [
        ("recurse", 1000, 1000),
        ("fetch", 3000, 3000),
        ("recurse", 0, 7000),
        ("fetch", 4000, 4000),
    ]


def test_end_without_start_begins_value_before_the_end_and_is_marked():
    recorder, _ = walk([titan_record("train_end", 100, value=60.0)])
    assert recorder.spans == [("train", 40_000, 60_000, False, False, True, 1)]
    assert recorder.lanes == [("open", (6161, None), 1), ("close", (6161, None), 1)]


def test_missing_or_bad_value_falls_back_to_the_timestamps():
    records = titan_span("a", 0, 4) + titan_span("b", 5, 6)
    del records[1]["value"]
    records[3]["value"] = "fast"
    recorder, _ = walk(records)
    assert [(n, d) for n, _, d, *_ in recorder.spans] == [("a", 4000), ("b", 1000)]


def test_value_wins_over_the_wall_clock_for_the_duration():
    records = titan_span("a", 0, 10)
    records[1]["value"] = 3.0  # the wall clock jumped; the monotonic duration is right
    recorder, _ = walk(records)
    assert recorder.spans[0][:3] == ("a", 0, 3000)


def test_microsecond_rounding_never_lets_a_child_end_after_its_parent():
    # Real numbers from an asyncio run: start + value would put the child 0.2 µs past its parent's
    # end.
    records = [
        titan_record("rollout_start", 0.0, span_id="p"),
        titan_record("generate_start", 2.276, span_id="c", parent_span_id="p"),
        titan_record("generate_end", 3.407, span_id="c", value=1.1312),
        titan_record("rollout_end", 3.407, span_id="p", value=3.407),
    ]
    ends = {}

    class Ends(TimelineVisitor):
        def span(self, span, end, end_us, dur_us, incomplete):
            ends[span.name] = span.start_us + dur_us

    walk_process(records, Ends())
    assert ends["generate"] <= ends["rollout"] == T0 + 3407


def test_a_parent_is_stretched_to_cover_a_child_that_ends_microseconds_after_it():
    # otel-titan's ends are wall-clock start + monotonic duration: a child can come out 2 µs late.
    records = [
        titan_record("step_start", 0.0, span_id="p"),
        titan_record("optimizer_start", 1.0, span_id="c", parent_span_id="p"),
        titan_record("optimizer_end", 5.002, span_id="c", value=4.002),
        titan_record("step_end", 5.0, span_id="p", value=5.0),
    ]
    ends = {}

    class Ends(TimelineVisitor):
        def span(self, span, end, end_us, dur_us, incomplete):
            ends[span.name] = (end_us, span.start_us + dur_us)

    walk_process(records, Ends())
    assert ends["step"] == (T0 + 5002, T0 + 5002) and ends["optimizer"] == (T0 + 5002, T0 + 5002)


def test_error_marks_its_span_failed_and_a_stray_error_is_still_reported():
    records = [
        titan_record("optim_start", 0, span_id="s"),
        titan_record("optim_error", 1, span_id="s", error_type="ValueError", error_message="boom"),
        titan_record("optim_end", 1, span_id="s", value=1.0),
        titan_record("load_error", 2, message="[step 3] load_error: OSError: disk"),
    ]
    recorder, _ = walk(records)
    assert recorder.spans == [("optim", 0, 1000, False, True, False, 1)]
    assert recorder.errors == [("optim_error", "optim"), ("load_error", None)]
    assert error_details(records[3]) == ("OSError", "disk")


def test_open_spans_are_incomplete_to_the_last_timestamp_in_start_order():
    records = [
        titan_record("step_start", 0, span_id="outer"),
        titan_record("fwd_start", 2, span_id="inner", parent_span_id="outer"),
        titan_record("signal_received", 50, log_type="instant", signal="SIGTERM"),
    ]
    recorder, _ = walk(records)
    assert recorder.spans == [
        ("step", 0, 50_000, True, False, False, 1),
        ("fwd", 2000, 48_000, True, False, False, 1),
    ]
    assert recorder.metas == ["signal_received"]
    assert recorder.lanes[-1] == ("close", (6161, None), 1)


def test_a_lane_stays_open_while_any_of_its_spans_is_open():
    records = (
        titan_span("outer", 0, 10, span_id="o")[:1]
        + titan_span("inner", 1, 2, span_id="i")
        + titan_span("outer", 0, 10, span_id="o")[1:]
        + titan_span("next", 11, 12, span_id="n")
    )
    recorder, _ = walk(records)
    assert recorder.lanes == [
        ("open", (6161, None), 1),
        ("close", (6161, None), 1),
        ("open", (6161, None), 2),
        ("close", (6161, None), 2),
    ]
    assert [s[-1] for s in recorder.spans] == [1, 1, 2]


def test_steps_begin_at_their_first_record_and_ends_never_move_them():
    records = [
        titan_record("boot", 0, log_type="instant"),  # no step: before the first
        titan_record("a_start", 10, step=1, span_id="1"),
        titan_record("b_start", 20, step=2, span_id="2"),
        # step 1's span ending during step 2
        titan_record("a_end", 25, step=1, span_id="1", value=15.0),
        # an older step's instant: not a new step
        titan_record("late", 26, log_type="instant", step=1),
        titan_record("b_end", 30, step=2, span_id="2", value=10.0),
        titan_record("metric_value", 40, log_type="instant", event_name="loss", value=1.0, step=3),
        titan_record("structured_logger_closed", 45, log_type="instant"),
    ]
    recorder, _ = walk(records)
    assert recorder.steps == [(1, 10_000, 20_000), (2, 20_000, 40_000), (3, 40_000, 45_000)]
    assert (
        recorder.instants == [("boot", None), ("late", 1)]
        and recorder.scalars == ["loss"]
        and recorder.metas == ["structured_logger_closed"]
    )


def test_instants_inside_an_open_span_get_its_track():
    records = (
        titan_span("fwd", 0, 5, span_id="f")[:1]
        + [titan_record("mark", 1, log_type="instant")]
        + titan_span("fwd", 0, 5, span_id="f")[1:]
        + [titan_record("after", 6, log_type="instant")]
    )
    recorder, _ = walk(records)
    assert recorder.instants == [("mark", 1), ("after", None)]


def test_empty_input_has_no_extent():
    recorder, extent = walk([])
    assert extent == ProcessExtent(0, None, None) and recorder.spans == [] and recorder.steps == []


def test_real_threads_and_tasks_pair_into_the_spans_they_were(logged):
    logged()
    sl.set_step(1)

    def worker():
        for _ in range(3):
            with sl.log_trace_span("io"):
                pass

    async def task(i):
        with sl.log_trace_span("rollout"):
            await asyncio.sleep(0.001 * (i % 3))
            with sl.log_trace_span("generate"):
                await asyncio.sleep(0.001)

    async def main():
        with sl.log_trace_span("gather"):
            await asyncio.gather(*(task(i) for i in range(6)))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    asyncio.run(main())
    for thread in threads:
        thread.join()
    records = logged.finish()
    recorder, _ = walk(records)
    names = sorted(s[0] for s in recorder.spans)
    assert names == sorted(["io"] * 9 + ["rollout"] * 6 + ["generate"] * 6 + ["gather"])
    assert not any(s[3] for s in recorder.spans)  # nothing incomplete, nothing orphaned
    assert not any(s[5] for s in recorder.spans)
    lanes = {lane for kind, lane, _ in recorder.lanes}
    assert len({lane for lane in lanes if lane[1] is None}) == 3  # the three worker threads
    assert len({lane for lane in lanes if lane[1] is not None}) == 7  # main task + 6 tasks


def _mixed_records():
    """Spans with and without ids, nested, failed, orphaned and left open; instants, scalars, steps:
    every rule once."""
    return [
        titan_record("boot", 0, log_type="instant"),
        titan_record("step_start", 1, step=1, span_id="s1"),
        titan_record("fwd_start", 2, step=1, span_id="f1", parent_span_id="s1"),
        titan_record("fwd_end", 4, step=1, span_id="f1", value=2.0),
        titan_record("old_end", 5, step=1, value=3.0),  # orphan: its start was rotated away
        titan_record("io_start", 5, step=1, tid=7),  # no ids: LIFO per lane
        titan_record("io_error", 6, step=1, tid=7),
        titan_record("io_end", 7, step=1, tid=7, value=2.0),
        titan_record("step_end", 8, step=1, span_id="s1", value=7.0),
        titan_record("metric_value", 9, log_type="instant", event_name="loss", value=1.0, step=2),
        titan_record("step_start", 10, step=2, span_id="s2"),
        titan_record("mark", 11, log_type="instant"),
        titan_record("bwd_start", 12, step=2, span_id="b2", parent_span_id="s2"),
        titan_record("signal_received", 20, log_type="instant", signal="SIGTERM"),
    ]


def test_a_walk_stopped_after_any_record_and_pickled_goes_on_as_one_walk():
    """The analysis cache stops a walk at the end of what is written and goes on with what is
    appended later (`WalkState`)."""
    import pickle

    from otel_titan.analysis.model.timeline import WalkState, finish_walk

    records = _mixed_records()
    whole, extent = walk(records)
    for cut in range(len(records) + 1):
        recorder, state = Recorder(), WalkState()
        walk_process(records[:cut], recorder, state=state, finish=False)
        state = pickle.loads(pickle.dumps(state))  # as the cache keeps it
        walk_process(records[cut:], recorder, state=state, finish=False)
        assert finish_walk(state, recorder) == extent
        assert (
            recorder.spans,
            recorder.errors,
            recorder.instants,
            recorder.scalars,
            recorder.metas,
            recorder.steps,
        ) == (whole.spans, whole.errors, whole.instants, whole.scalars, whole.metas, whole.steps), (
            cut
        )

"""The sl.* calls, as a user makes them, checked record by record in the JSONL file."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from otel_titan import structured_logger as sl

THIS_FILE = "tests/core/test_capture.py"


def by_name(records, name):
    return [r for r in records if r["log_type_name"] == name]


def test_span_writes_start_then_end_with_monotonic_duration(logged):
    logged()
    sl.set_step(5, relative_step=1)
    with sl.log_trace_span("fwd_bwd"):
        time.sleep(0.02)
    records = logged.finish()
    assert [r["log_type_name"] for r in records] == ["fwd_bwd_start", "fwd_bwd_end"]
    start, end = records
    assert start["log_type"] == end["log_type"] == "event"
    assert start["event_name"] is None and "value" not in start
    assert 20 <= end["value"] < 1000  # ms, slept 20 ms
    assert end["time_us"] >= start["time_us"] + 20_000
    assert start["span_id"] == end["span_id"] and start["trace_id"] == end["trace_id"]
    assert start["step"] == end["step"] == 5 and start["relative_step"] == 1
    assert "step_tags" not in start  # omitted when empty
    assert start["message"] == "[step 5] fwd_bwd fwd_bwd_start"
    assert end["message"].startswith("[step 5] fwd_bwd fwd_bwd_end took ")


def test_every_record_carries_torchtitan_fields_and_identity(logged):
    logged(world_size=4, local_rank=1, run_id="r-1", attempt=2, job_id="j-9", rank=3)
    sl.log_trace_instant("marker")
    records = logged.finish()
    (record,) = records
    for field in (
        "time",
        "time_ms",
        "time_us",
        "delta_ms",
        "tid",
        "pid",
        "caller",
        "log_file",
        "log_function",
        "log_level",
        "logger_name",
        "seq_id",
        "message",
    ):
        assert field in record, field
    assert record["rank"] == record["global_rank"] == 3
    assert (
        record["local_rank"],
        record["world_size"],
        record["run_id"],
        record["attempt"],
        record["job_id"],
    ) == (1, 4, "r-1", 2, "j-9")
    assert record["source"] == "training" and record["schema_version"] == 1
    assert (
        record["time_ms"] == record["time_us"] // 1000
        and record["time"] == record["time_us"] // 1_000_000
    )
    assert record["host_name"]


def test_caller_is_the_with_statement_line(logged):
    logged()
    with sl.log_trace_span("phase"):  # the caller line
        pass
    line = test_caller_is_the_with_statement_line.__code__.co_firstlineno + 2
    start, end = logged.finish()
    assert (
        start["caller"]
        == end["caller"]
        == f"{THIS_FILE}:{line}:test_caller_is_the_with_statement_line"
    )
    assert (
        start["log_file"] == THIS_FILE
        and start["log_function"] == "test_caller_is_the_with_statement_line"
    )


def _library_helper():
    # A helper that emits on behalf of its caller: stacklevel=3 names the caller.
    sl.log_trace_instant("helper_instant", stacklevel=3)


def test_stacklevel_points_further_up(logged):
    logged()
    _library_helper()
    line = test_stacklevel_points_further_up.__code__.co_firstlineno + 2
    (record,) = logged.finish()
    assert record["caller"] == f"{THIS_FILE}:{line}:test_stacklevel_points_further_up"


@sl.log_trace_span("decorated_sync")
def decorated_sync(x):
    return x * 2


@sl.log_trace_span("decorated_async")
async def decorated_async(x):
    await asyncio.sleep(0.001)
    return x + 1


def _line_of(marker: str) -> int:
    """The line of this file that carries `marker` (a comment), however the file is laid out."""
    with open(__file__, encoding="utf-8") as handle:
        return next(
            n for n, line in enumerate(handle, 1) if marker in line and "_line_of" not in line
        )


def test_decorators_report_the_call_site_and_keep_results(logged):
    # The call site, as torchtitan's sync decorator (its
    # test_sync_decorator_caller_points_at_user_site); before, the decorated function's definition.
    # A coroutine the event loop started has no call site of user code: its definition, never
    # asyncio's internals.
    async def awaits_it():
        return await decorated_async(5)  # the awaiting line

    logged()
    assert decorated_sync(21) == 42  # the calling line
    call_line = _line_of("# the calling line")
    assert asyncio.run(decorated_async(1)) == 2
    assert asyncio.run(awaits_it()) == 6
    records = logged.finish()
    names = [r["log_type_name"] for r in records]
    assert names == [
        "decorated_sync_start",
        "decorated_sync_end",
        "decorated_async_start",
        "decorated_async_end",
    ] + ["decorated_async_start", "decorated_async_end"]
    async_line = decorated_async.__wrapped__.__code__.co_firstlineno
    awaiting_line = awaits_it.__code__.co_firstlineno + 1
    assert (
        records[0]["caller"]
        == records[1]["caller"]
        == f"{THIS_FILE}:{call_line}:test_decorators_report_the_call_site_and_keep_results"
    )
    assert records[2]["caller"] == f"{THIS_FILE}:{async_line}:decorated_async"
    assert records[4]["caller"] == f"{THIS_FILE}:{awaiting_line}:awaits_it"
    assert records[2]["task_name"] == records[3]["task_name"] and records[2][
        "task_name"
    ].startswith("Task-")
    assert asyncio.iscoroutinefunction(decorated_async)
    assert decorated_sync.__name__ == "decorated_sync"


def test_decorator_recorded_even_if_applied_before_init(logged):
    # decorated_sync was decorated at import, long before this init.
    logged()
    decorated_sync(1)
    assert [r["log_type_name"] for r in logged.finish()] == [
        "decorated_sync_start",
        "decorated_sync_end",
    ]


def test_decorating_a_generator_is_refused():
    with pytest.raises(TypeError, match="generator"):

        @sl.log_trace_span("gen")
        def gen():
            yield 1


def test_error_writes_error_before_end_and_propagates(logged):
    logged()
    sl.set_step(3)
    with pytest.raises(ValueError, match="boom"):
        with sl.log_trace_span("optim"):
            raise ValueError("boom")
    records = logged.finish()
    assert [r["log_type_name"] for r in records] == ["optim_start", "optim_error", "optim_end"]
    error = records[1]
    assert error["log_type"] == "event" and "value" not in error
    assert error["error_type"] == "ValueError" and error["error_message"] == "boom"
    assert error["message"] == "[step 3] optim_error: ValueError: boom"
    assert error["log_level"] == "ERROR"
    assert error["span_id"] == records[0]["span_id"]
    assert records[2]["value"] >= 0


def test_error_types_outside_builtins_are_qualified_and_decorators_propagate(logged):
    class CustomError(RuntimeError):
        pass

    @sl.log_trace_span("step_fn")
    def failing():
        raise CustomError("nope")

    logged()
    with pytest.raises(CustomError):
        failing()
    records = logged.finish()
    assert records[1]["error_type"].endswith("CustomError") and "." in records[1]["error_type"]


def test_async_decorator_error_and_cancellation_are_recorded(logged):
    @sl.log_trace_span("remote_call")
    async def remote(fail):
        await asyncio.sleep(0.001)
        if fail:
            raise KeyError("missing")
        await asyncio.sleep(10)

    async def main():
        with pytest.raises(KeyError):
            await remote(True)
        task = asyncio.ensure_future(remote(False))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    logged()
    asyncio.run(main())
    errors = [r for r in logged.finish() if r["log_type_name"] == "remote_call_error"]
    assert [e["error_type"] for e in errors] == ["KeyError", "asyncio.exceptions.CancelledError"]


def test_spans_nest_with_parent_ids_and_share_the_trace(logged):
    logged()
    sl.set_step(1)
    with sl.log_trace_span("outer"):
        with sl.log_trace_span("inner"):
            sl.log_trace_instant("mark")
            sl.log_trace_scalar({"x": 1.0})
    records = logged.finish()
    outer = by_name(records, "outer_start")[0]
    inner = by_name(records, "inner_start")[0]
    mark = by_name(records, "mark")[0]
    scalar = by_name(records, "metric_value")[0]
    assert outer["parent_span_id"] is None
    assert inner["parent_span_id"] == outer["span_id"]
    assert (
        mark["parent_span_id"] == inner["span_id"] and scalar["parent_span_id"] == inner["span_id"]
    )
    assert len({r["trace_id"] for r in records}) == 1
    assert [r["log_type_name"] for r in records] == [
        "outer_start",
        "inner_start",
        "mark",
        "metric_value",
        "inner_end",
        "outer_end",
    ]


def test_one_trace_per_step_and_children_keep_their_parents_trace(logged):
    logged()
    with sl.log_trace_span("before_first_step"):
        pass
    sl.set_step(1)
    with sl.log_trace_span("a"):
        sl.set_step(2)  # the step moves while the parent is open
        with sl.log_trace_span("child"):
            pass
    with sl.log_trace_span("b"):
        pass
    records = logged.finish()
    trace = {r["log_type_name"]: r["trace_id"] for r in records}
    assert trace["a_start"] == trace["child_start"]  # inherits the parent's trace (step 1)
    assert trace["b_start"] != trace["a_start"]  # step 2 is another trace
    assert trace["before_first_step_start"] not in (trace["a_start"], trace["b_start"])
    child = by_name(records, "child_start")[0]
    assert child["step"] == 2  # but carries the step current when it started


def test_step_trace_ids_are_shared_across_processes_of_a_run(run_dir):
    from otel_titan.core.trace_ids import DEFAULT_TRACE_GROUP_SIZE, StepTraceIds, trace_group_of

    sl.init_structured_logger("training", run_dir, rank=1, world_size=2, run_id="shared")
    sl.set_step(7)
    with sl.log_trace_span("x"):
        pass
    sl.shutdown_structured_logger()
    from tests.conftest import data_records, jsonl_files, read_records

    (start, _end) = data_records(read_records(jsonl_files(run_dir)[0]))
    # Every process of the run computes the same id for step 7 of its trace group (rank // 32 by
    # default).
    assert (
        start["trace_id"]
        == f"{StepTraceIds('shared', 0, trace_group_of(1, DEFAULT_TRACE_GROUP_SIZE)).for_step(7):032x}"
    )


def test_instant_record(logged):
    logged()
    sl.set_step(2)
    sl.add_step_tag("eval")
    sl.log_trace_instant("training_start")
    (record,) = logged.finish()
    assert record["log_type"] == "instant" and record["log_type_name"] == "training_start"
    assert record["event_name"] is None and "value" not in record
    assert record["step_tags"] == ["eval"] and record["message"] == "[step 2] training_start"


def test_scalars_one_record_per_name_with_special_floats_as_json(logged):
    logged()
    sl.log_trace_scalar(
        {
            "loss": 2.5,
            "tokens": 4096,
            "nan": float("nan"),
            "inf": math.inf,
            "ninf": -math.inf,
            "flag": True,
        }
    )
    records = logged.finish()
    assert all(r["log_type"] == "instant" and r["log_type_name"] == "metric_value" for r in records)
    values = {r["event_name"]: r["value"] for r in records}
    assert values == {
        "loss": 2.5,
        "tokens": 4096,
        "nan": "NaN",
        "inf": "Infinity",
        "ninf": "-Infinity",
        "flag": 1,
    }
    assert len({r["span_id"] for r in records}) == 6


def test_scalar_accepts_numpy_scalars(logged):
    np = pytest.importorskip("numpy")
    logged()
    sl.log_trace_scalar({"f32": np.float32(0.5), "i64": np.int64(7)})
    values = {r["event_name"]: r["value"] for r in logged.finish()}
    assert values == {"f32": 0.5, "i64": 7}


def test_every_numpy_number_kind_is_written_and_none_is_called_a_tensor(logged, run_dir, caplog):
    # `(arr > 0).all()` returns np.bool_, registered as no kind of number; 0-d arrays come from
    # np.asarray(x) and reductions with keepdims. All are host values: written, like bool and float.
    np = pytest.importorskip("numpy")
    arr = np.array([1.0, 2.0])
    logged()
    with caplog.at_level("WARNING", logger="otel_titan"):
        sl.log_trace_scalar(
            {
                "all_pos": (arr > 0).all(),
                "any_neg": np.bool_(False),
                "f16": np.float16(1.5),
                "ld": np.longdouble(2.5),
                "u64": np.uint64(2**63 - 1),
                "i8": np.int8(-3),
                "zero_d": np.array(0.25),
                "zero_d_bool": np.array(True),
                "zero_d_int": np.array(7, dtype=np.uint16),
                # not numbers: skipped, and named for what they are
                "u64_big": np.uint64(2**64 - 1),
                "vector": arr,
                "cplx": np.complex64(1 + 2j),
            }
        )
    records = logged.finish()
    values = {r["event_name"]: r["value"] for r in records}
    assert values == {
        "all_pos": 1,
        "any_neg": 0,
        "f16": 1.5,
        "ld": 2.5,
        "u64": 2**63 - 1,
        "i8": -3,
        "zero_d": 0.25,
        "zero_d_bool": 1,
        "zero_d_int": 7,
    }
    assert all(type(v) in (int, float) for v in values.values())
    warnings = {
        r.getMessage().split("%r")[0] for r in caplog.records if "skipped" in r.getMessage()
    }
    assert len(warnings) == 3 and not any("tensor" in w for w in warnings), warnings
    text = " ".join(warnings)
    assert (
        "beyond the signed 64-bit range" in text
        and "numpy array of shape (2,)" in text
        and "complex64 is not a real number" in text
    )
    assert closing_record(run_dir)["skipped_values"] == 3


def closing_record(run_dir):
    from tests.conftest import jsonl_files, read_records

    (path,) = jsonl_files(run_dir)
    record = read_records(path)[-1]
    assert record["log_type_name"] == "structured_logger_closed"
    return record


def test_scalar_values_that_are_not_numbers_are_skipped_warned_once_per_key_and_counted(
    logged, run_dir, caplog
):
    # torchtitan skips such values with a warning; a logger must never stop training over a value.
    logged()
    bad_values = ["1.0", None, [1], {"a": 1}, b"1", complex(1, 2), 2**64, -(2**63) - 1]
    with caplog.at_level("WARNING", logger="otel_titan"):
        for bad in bad_values:
            sl.log_trace_scalar({"ok": 1, "loss": bad})  # no exception
        sl.log_trace_scalar({"grad_norm": None})  # only skipped values: nothing to write
        sl.log_trace_scalar({"grad_norm": None, "loss": None})
    records = logged.finish()
    # the good value of each call is kept
    assert [r["event_name"] for r in records] == ["ok"] * len(bad_values)
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    # once per key
    assert len(warnings) == 2 and "'loss'" in warnings[0] and "'grad_norm'" in warnings[1]
    assert "None is not a number" in warnings[0] + warnings[1]
    assert closing_record(run_dir)["skipped_values"] == len(bad_values) + 3


def test_scalar_tensors_are_skipped_without_ever_being_read(logged, run_dir, caplog):
    torch = pytest.importorskip("torch")
    reads = []

    class Watched(torch.Tensor):
        """A real tensor that notes every way of reading its value (each can force a device
        sync)."""

        def item(self):
            reads.append("item")
            return super().item()

        def __float__(self):
            reads.append("float")
            return super().__float__()

        def __int__(self):
            reads.append("int")
            return super().__int__()

        def __index__(self):
            reads.append("index")
            return super().__index__()

        def __bool__(self):
            reads.append("bool")
            return super().__bool__()

    logged()
    loss = torch.tensor(2.5).as_subclass(Watched)
    with caplog.at_level("WARNING", logger="otel_titan"):
        sl.log_trace_scalar(
            {"loss": loss, "tokens": torch.tensor(7).as_subclass(Watched), "lr": 0.1}
        )
        sl.log_trace_scalar({"loss": loss})
    records = logged.finish()
    assert reads == []
    assert [(r["event_name"], r["value"]) for r in records] == [("lr", 0.1)]
    (warning,) = [r.getMessage() for r in caplog.records if "'loss'" in r.getMessage()]
    assert "a tensor" in warning and ".item()" in warning
    assert closing_record(run_dir)["skipped_values"] == 3


def test_scalar_rejects_a_non_mapping_and_bad_keys(logged):
    logged()
    with pytest.raises(TypeError):
        sl.log_trace_scalar([("loss", 1.0)])  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        sl.log_trace_scalar({"": 1.0})
    assert logged.finish() == []


@pytest.mark.parametrize("name", ["", None, 3, b"x"])
def test_bad_event_names_raise(name):
    with pytest.raises((TypeError, ValueError)):
        sl.log_trace_span(name)
    with pytest.raises((TypeError, ValueError)):
        sl.log_trace_instant(name)


def test_description_is_recorded(logged):
    logged()
    with sl.log_trace_span("ckpt", "save to s3"):
        pass
    start, end = logged.finish()
    assert start["description"] == end["description"] == "save to s3"
    assert start["message"] == "save to s3 ckpt_start"


def test_threads_get_their_own_nesting_and_tids(logged):
    logged()
    barrier = threading.Barrier(4)

    def work(i):
        barrier.wait()
        with sl.log_trace_span(f"outer{i}"):
            time.sleep(0.005)
            with sl.log_trace_span(f"inner{i}"):
                time.sleep(0.005)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = logged.finish()
    for i in range(4):
        outer = by_name(records, f"outer{i}_start")[0]
        inner = by_name(records, f"inner{i}_start")[0]
        assert inner["parent_span_id"] == outer["span_id"]
        assert inner["tid"] == outer["tid"]
    assert len({by_name(records, f"outer{i}_start")[0]["tid"] for i in range(4)}) == 4


def test_asyncio_tasks_nest_per_task_with_task_names_and_their_own_steps(logged):
    async def actor(i):
        sl.set_step(100 + i)  # each task has its own step
        sl.add_step_tag(f"actor{i}")
        with sl.log_trace_span("rollout"):
            await asyncio.sleep(0.01)
            with sl.log_trace_span("generate"):
                await asyncio.sleep(0.01)

    async def main():
        sl.set_step(1)
        await asyncio.gather(*(asyncio.create_task(actor(i), name=f"actor-{i}") for i in range(5)))
        assert sl.get_step() == 1 and sl.get_step_tags() == ()  # the controller's step is untouched

    logged()
    asyncio.run(main())
    records = logged.finish()
    for i in range(5):
        mine = [r for r in records if r.get("task_name") == f"actor-{i}"]
        assert len(mine) == 4
        assert {r["step"] for r in mine} == {100 + i} and all(
            r["step_tags"] == [f"actor{i}"] for r in mine
        )
        rollout = [r for r in mine if r["log_type_name"] == "rollout_start"][0]
        generate = [r for r in mine if r["log_type_name"] == "generate_start"][0]
        assert generate["parent_span_id"] == rollout["span_id"]


def test_delta_ms_is_per_thread(logged):
    logged()
    sl.log_trace_instant("a")
    time.sleep(0.01)
    sl.log_trace_instant("b")
    a, b = logged.finish()
    assert a["delta_ms"] == 0.0
    assert b["delta_ms"] == pytest.approx((b["time_us"] - a["time_us"]) / 1000)


def test_seq_id_counts_every_line_of_the_file_from_one(logged, run_dir):
    logged()
    for _ in range(10):
        with sl.log_trace_span("s"):
            pass
    logged.finish()
    from tests.conftest import jsonl_files, read_records

    all_records = read_records(jsonl_files(run_dir)[0])
    assert [r["seq_id"] for r in all_records] == list(range(1, len(all_records) + 1))


def test_calls_before_init_after_shutdown_and_disabled_are_no_ops(run_dir, tmp_path):
    def everything():
        with sl.log_trace_span("x"):
            sl.log_trace_instant("y")
            sl.log_trace_scalar({"z": 1})
        decorated_sync(1)

    everything()  # before init
    assert not sl.is_initialized()
    assert sl.flush_structured_logger() is True and sl.shutdown_structured_logger() is True
    disabled_dir = tmp_path / "disabled"
    sl.init_structured_logger("training", disabled_dir, enable=False)
    assert not sl.is_initialized()
    everything()
    assert not disabled_dir.exists()  # enable=False creates nothing
    sl.init_structured_logger("training", run_dir, world_size=1)
    sl.shutdown_structured_logger()
    everything()  # after shutdown
    from tests.conftest import data_records, jsonl_files, read_records

    assert data_records(read_records(jsonl_files(run_dir)[0])) == []


def test_span_left_open_at_shutdown_is_not_ended_twice_or_lost(logged):
    logged()
    scope = sl.log_trace_span("outlives")
    scope.__enter__()
    records = logged.finish()
    scope.__exit__(None, None, None)  # after shutdown: a no-op, not an error
    assert [r["log_type_name"] for r in records] == ["outlives_start"]


def test_span_open_across_shutdown_and_reinit_stays_incomplete_in_its_own_file(tmp_path):
    from tests.conftest import jsonl_files, read_records

    first, second = tmp_path / "first", tmp_path / "second"
    sl.init_structured_logger("training", first, world_size=1, run_id="r")
    with sl.log_trace_span("outer"):
        sl.shutdown_structured_logger()
        sl.init_structured_logger("training", second, world_size=1, run_id="r")
        with sl.log_trace_span("inner"):
            pass
        sl.log_trace_instant("in_outer")
    with sl.log_trace_span("after"):
        pass
    assert sl.shutdown_structured_logger()
    old = {r["log_type_name"]: r for r in read_records(jsonl_files(first)[0])}
    new = read_records(jsonl_files(second)[0])
    names = [r["log_type_name"] for r in new]
    # The old file keeps the start and no end: visibly incomplete, as a crash would leave it.
    assert "outer_start" in old and "outer_end" not in old and "structured_logger_closed" in old
    # The new file never gets an end that belongs to the old one.
    assert names == [
        "structured_logger_opened",
        "inner_start",
        "inner_end",
        "in_outer",
        "after_start",
        "after_end",
        "structured_logger_closed",
    ]
    by_name = {r["log_type_name"]: r for r in new}
    outer = old["outer_start"]
    # Records inside the old span name it by the id the old file records.
    assert (
        by_name["inner_start"]["parent_span_id"]
        == by_name["in_outer"]["parent_span_id"]
        == outer["span_id"]
    )
    assert by_name["inner_start"]["trace_id"] == outer["trace_id"]
    assert by_name["after_start"]["parent_span_id"] is None  # the current span was restored on exit


@sl.log_trace_span("recurse")
def recurse(depth):
    return recurse(depth + 1)


def test_recursion_error_in_a_decorated_function_ends_every_span_and_propagates_unchanged(logged):
    logged()
    with pytest.raises(RecursionError) as caught:
        recurse(0)
    # The user's own RecursionError, not one raised inside the logger while describing it.
    assert caught.value.__context__ is None and "in comparison" not in str(caught.value)
    # where the stack ran out, not in __exit__
    assert caught.traceback[-1].name in (
        "recurse",
        "wrapper",
    )
    with sl.log_trace_span("after"):
        pass
    records = logged.finish()
    starts = [r for r in records if r["log_type_name"] == "recurse_start"]
    ends = [r for r in records if r["log_type_name"] == "recurse_end"]
    errors = [r for r in records if r["log_type_name"] == "recurse_error"]
    assert len(starts) > 100
    assert (
        sorted(r["span_id"] for r in ends)
        == sorted(r["span_id"] for r in starts)
        == sorted(r["span_id"] for r in errors)
    )
    assert all(r["error_type"] == "RecursionError" for r in errors)
    (after,) = [r for r in records if r["log_type_name"] == "after_start"]
    assert after["parent_span_id"] is None  # no span left current


def test_an_interrupt_while_yielding_to_the_writer_still_ends_the_span():
    # Above half the queue the caller yields the GIL to the writer after queueing a
    # start; a KeyboardInterrupt delivered there escapes __enter__, so the `with`
    # body never runs and __exit__ is never called: the span must be ended anyway.
    from otel_titan.core import capture
    from otel_titan.core.event_queue import EventQueue

    def ctrl_c_while_yielding():
        raise KeyboardInterrupt

    queue = EventQueue(4)
    capture.attach(queue, wake_writer=ctrl_c_while_yielding)
    try:
        queue.items.extend([("filler",)] * 2)  # half full: the crowded path
        with pytest.raises(KeyboardInterrupt):
            with sl.log_trace_span("interrupted"):
                pytest.fail("the body must not run")
        events = [e for e in queue.items if e[0] in (capture.START, capture.END)]
    finally:
        capture.detach()
    assert [e[0] for e in events] == [capture.START, capture.END] and events[1][1] is events[0]
    assert events[1][3][0] == "KeyboardInterrupt"
    assert capture._current_span.get() is None


def test_decorating_a_callable_without_code_names_the_call_site(logged):
    import functools

    summed = sl.log_trace_span("builtin_sum")(sum)
    partial = sl.log_trace_span("partial")(functools.partial(decorated_sync.__wrapped__, 2))
    logged()
    assert summed([1, 2]) == 3
    assert partial() == 4
    line = test_decorating_a_callable_without_code_names_the_call_site.__code__.co_firstlineno + 6
    records = logged.finish()
    assert (
        records[0]["caller"]
        == f"{THIS_FILE}:{line}:test_decorating_a_callable_without_code_names_the_call_site"
    )
    # a partial: its call site too
    assert (
        records[2]["caller"]
        == f"{THIS_FILE}:{line + 1}:test_decorating_a_callable_without_code_names_the_call_site"
    )


def test_children_never_start_before_or_end_after_their_parent(logged):
    # Every timestamp comes from one clock (the monotonic one, mapped to wall time by one
    # offset), so nesting is exact even at nanosecond scale.
    logged(handlers=["tests.helpers.factories.register_memory"])
    for _ in range(500):
        with sl.log_trace_span("parent"):
            with sl.log_trace_span("child"):
                pass
    sl.shutdown_structured_logger()
    from tests.helpers import factories

    spans = factories.LAST["exporter"].get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    children = [s for s in spans if s.name == "child"]
    assert len(children) == 500
    for child in children:
        parent = by_id[child.parent.span_id]
        assert parent.start_time <= child.start_time <= child.end_time <= parent.end_time


def test_wall_clock_follows_a_step_but_not_jitter():
    from otel_titan.core.clock import WallClock

    clock = WallClock()
    original = clock.offset
    clock._next_check = 0
    clock.refresh()
    # re-measuring gives (nearly) the same offset: kept
    assert clock.offset == original and clock.steps == 0
    clock.offset -= 5_000_000_000  # as if the wall clock had stepped by 5 s since
    clock._next_check = 0
    clock.refresh()
    assert abs(clock.offset - original) < 1_000_000 and clock.steps == 1

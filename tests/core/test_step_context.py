"""Step and tags: the training loop moves the process-wide default; every other thread or task that
writes gets its own view."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from otel_titan import structured_logger as sl


def seen_by_a_fresh_thread():
    """(step, relative step, tags) as a thread that never wrote a step sees them."""
    out = []
    thread = threading.Thread(
        target=lambda: out.append((sl.get_step(), sl.get_relative_step(), sl.get_step_tags()))
    )
    thread.start()
    thread.join()
    return out[0]


def test_set_step_clears_tags_and_tags_are_unique_and_ordered():
    sl.set_step(1, relative_step=1)
    sl.add_step_tag("gc")
    sl.add_step_tag("eval")
    sl.add_step_tag("gc")
    assert sl.get_step_tags() == ("gc", "eval")
    sl.set_step(2, relative_step=7)
    assert sl.get_step() == 2 and sl.get_relative_step() == 7 and sl.get_step_tags() == ()
    sl.add_step_tag("x")
    sl.clear_step_tags()
    assert sl.get_step_tags() == () and sl.get_step() == 2


def test_relative_step_defaults_to_the_step_as_in_torchtitan(logged):
    logged()
    sl.set_step(7)
    assert (sl.get_step(), sl.get_relative_step()) == (7, 7)
    sl.log_trace_instant("plain")
    sl.set_step(8, relative_step=2)  # a resumed run says so
    sl.log_trace_instant("resumed")
    sl.set_step(None)
    assert sl.get_relative_step() is None
    sl.log_trace_instant("unset")
    plain, resumed, unset = logged.finish()
    assert (plain["step"], plain["relative_step"]) == (7, 7)
    assert (resumed["step"], resumed["relative_step"]) == (8, 2)
    assert "step" not in unset and "relative_step" not in unset


def test_threads_that_never_set_a_step_follow_the_main_loop():
    seen = []
    go, done = threading.Event(), threading.Event()

    def helper():
        go.wait()
        seen.append((sl.get_step(), sl.get_step_tags()))
        done.set()

    thread = threading.Thread(target=helper)
    thread.start()
    sl.set_step(41)
    sl.set_step(42)
    sl.add_step_tag("ckpt")
    go.set()
    done.wait(5)
    thread.join()
    assert seen == [(42, ("ckpt",))]


def test_a_plain_thread_that_tags_a_step_keeps_the_tag_to_itself():
    sl.set_step(1)
    helper_view = []

    def helper():
        sl.add_step_tag("ckpt")
        helper_view.append((sl.get_step(), sl.get_step_tags()))

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert helper_view == [(1, ("ckpt",))]
    assert seen_by_a_fresh_thread() == (1, 1, ())  # the tag never reached the default
    sl.set_step(2)
    sl.set_step(3)
    assert seen_by_a_fresh_thread() == (3, 3, ())
    assert (sl.get_step(), sl.get_step_tags()) == (3, ())
    sl.add_step_tag("gc")  # the loop's own tag does reach everyone following it
    assert seen_by_a_fresh_thread() == (3, 3, ("gc",))


def test_executor_workers_that_tag_or_set_a_step_do_not_pin_the_others():
    sl.set_step(1)
    with (
        ThreadPoolExecutor(1, thread_name_prefix="ckpt") as tagger,
        ThreadPoolExecutor(2, thread_name_prefix="other") as others,
    ):
        tagger.submit(sl.add_step_tag, "ckpt").result()
        assert tagger.submit(lambda: (sl.get_step(), sl.get_step_tags())).result() == (1, ("ckpt",))
        sl.set_step(2)
        assert others.submit(lambda: (sl.get_step(), sl.get_step_tags())).result() == (2, ())
        tagger.submit(sl.set_step, 500).result()  # a worker's own step: its view only
        sl.set_step(3)
        assert others.submit(lambda: (sl.get_step(), sl.get_step_tags())).result() == (3, ())
        assert tagger.submit(sl.get_step).result() == 500
    assert seen_by_a_fresh_thread() == (3, 3, ())


def test_an_asyncio_task_that_tags_a_step_keeps_the_tag_to_itself():
    async def checkpoint():
        sl.add_step_tag("ckpt")
        return sl.get_step(), sl.get_step_tags()

    sl.set_step(1)
    assert asyncio.run(checkpoint()) == (1, ("ckpt",))  # a task on the main thread
    sl.set_step(2)
    sl.set_step(3)
    assert (sl.get_step(), sl.get_step_tags()) == (3, ())
    assert seen_by_a_fresh_thread() == (3, 3, ())

    # Tasks of an event loop running in another thread (an actor, a rollout server).
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        assert asyncio.run_coroutine_threadsafe(checkpoint(), loop).result(10) == (3, ("ckpt",))
        sl.set_step(4)
        assert seen_by_a_fresh_thread() == (4, 4, ())

        async def view():
            return sl.get_step(), sl.get_step_tags()

        assert asyncio.run_coroutine_threadsafe(view(), loop).result(10) == (4, ())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def test_dataloader_style_worker_threads_follow_the_loop_and_keep_their_own_tags(logged):
    # Long-lived worker threads (a prefetcher, pin-memory or decoding threads) that
    # serve the training loop one batch at a time; one of them tags a slow batch.
    logged()
    requests: list[queue.Queue] = [queue.Queue(), queue.Queue()]
    replies: queue.Queue = queue.Queue()

    def worker(index: int) -> None:
        while (step := requests[index].get()) is not None:
            if index == 1 and step == 2:
                sl.add_step_tag("slow_batch")
            with sl.log_trace_span(f"load{index}"):
                pass
            replies.put(step)

    workers = [threading.Thread(target=worker, args=(i,), name=f"loader{i}") for i in range(2)]
    for thread in workers:
        thread.start()
    for step in range(1, 6):
        sl.set_step(step)
        for index in range(2):
            requests[index].put(step)
            assert replies.get(timeout=10) == step
        with sl.log_trace_span("fwd_bwd"):
            pass
    for index in range(2):
        requests[index].put(None)
    for thread in workers:
        thread.join()
    ends = [r for r in logged.finish() if r["log_type_name"].endswith("_end")]

    def steps(name):
        return [(r["step"], r.get("step_tags", [])) for r in ends if r["log_type_name"] == name]

    assert steps("fwd_bwd_end") == [(s, []) for s in range(1, 6)]
    assert steps("load0_end") == [(s, []) for s in range(1, 6)]
    # The tagging worker has its own view from then on; nobody else ever sees its tag.
    assert steps("load1_end") == [(1, [])] + [(2, ["slow_batch"])] * 4


def test_a_thread_with_its_own_step_does_not_move_the_others_off_theirs():
    sl.set_step(10)
    own = []

    def worker():
        sl.set_step(500)
        sl.set_step(501)
        own.append(sl.get_step())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert own == [501]
    assert sl.get_step() == 10 and seen_by_a_fresh_thread() == (10, 10, ())


def test_a_trainer_thread_owns_the_default_until_it_ends_and_the_main_thread_always_does():
    def trainer(first: int) -> None:
        for step in range(first, first + 3):
            sl.set_step(step)

    for first in (1, 10):  # the second trainer takes over once the first has ended
        thread = threading.Thread(target=trainer, args=(first,))
        thread.start()
        thread.join()
        assert seen_by_a_fresh_thread()[0] == first + 2
    sl.set_step(100)  # the main thread's loop wins over any other
    assert seen_by_a_fresh_thread()[0] == 100


def test_concurrent_asyncio_tasks_that_tag_see_only_their_own_tags_not_the_loops(logged):
    # torchtitan's test_add_step_tag_concurrent_async_tasks_are_isolated: before, each task saw the
    # loop's tag as well.
    logged()
    sl.set_step(7)
    sl.add_step_tag("loop_tag")

    async def actor(tag, delay):
        before = sl.get_step_tags()  # until it tags, a task sees the loop's tags (torchtitan too)
        await asyncio.sleep(delay)
        sl.add_step_tag(tag)
        sl.add_step_tag(tag)
        with sl.log_trace_span(f"{tag}_work"):
            pass
        return before, sl.get_step_tags()

    async def both():
        return await asyncio.gather(actor("gc", 0.01), actor("eval", 0.02))

    (gc_before, gc_view), (eval_before, eval_view) = asyncio.run(both())
    assert gc_before == eval_before == ("loop_tag",)
    assert (gc_view, eval_view) == (("gc",), ("eval",))
    # the loop's own, untouched
    assert sl.get_step_tags() == ("loop_tag",) and seen_by_a_fresh_thread() == (
        7,
        7,
        ("loop_tag",),
    )
    tags = {r["log_type_name"]: r.get("step_tags") for r in logged.finish()}
    assert tags == {
        "gc_work_start": ["gc"],
        "gc_work_end": ["gc"],
        "eval_work_start": ["eval"],
        "eval_work_end": ["eval"],
    }


def test_an_asyncio_controller_owns_the_default_and_its_tasks_keep_their_step():
    async def rollout(out):
        await asyncio.sleep(0.01)  # the controller moves on meanwhile
        out.append(sl.get_step())
        sl.add_step_tag("mine")
        out.append(sl.get_step_tags())

    async def controller():
        out: list = []
        sl.set_step(1)
        task = asyncio.create_task(rollout(out))
        sl.set_step(2)
        helper_sees = await asyncio.to_thread(lambda: seen_by_a_fresh_thread())
        await task
        return out, sl.get_step(), sl.get_step_tags(), helper_sees

    out, step, tags, helper_sees = asyncio.run(controller())
    assert out == [1, ("mine",)]
    assert (step, tags) == (2, ())
    # the controller moved the default; the task's tag stayed in the task
    assert helper_sees == (
        2,
        2,
        (),
    )


@pytest.mark.parametrize("bad", [1.5, "3", True, [1]])
def test_non_integer_steps_raise_type_error(bad):
    with pytest.raises(TypeError):
        sl.set_step(bad)
    with pytest.raises(TypeError):
        sl.set_step(1, relative_step=bad)


def test_out_of_range_steps_raise_value_error_and_none_unsets():
    with pytest.raises(ValueError, match="64-bit"):
        sl.set_step(2**63)
    sl.set_step(-5)
    assert sl.get_step() == -5
    sl.set_step(None)
    assert sl.get_step() is None


def test_numpy_integers_are_steps():
    np = pytest.importorskip("numpy")
    sl.set_step(np.int64(12))
    assert (
        sl.get_step() == 12 and type(sl.get_step()) is int and type(sl.get_relative_step()) is int
    )


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_tags_raise(bad):
    with pytest.raises((TypeError, ValueError)):
        sl.add_step_tag(bad)


# -- the boundary hooks: one list, the training loop's boundaries only (issue 31 item 6) -----------


def test_boundary_hooks_run_in_order_at_the_loops_boundaries_only():
    from otel_titan.core import step_context

    sl.set_step(None)
    calls = []
    remove_first = step_context.add_boundary_hook(lambda ended: calls.append(("first", ended)))
    remove_second = step_context.add_boundary_hook(lambda ended: calls.append(("second", ended)))
    try:
        sl.set_step(1)  # from no step: no boundary
        sl.set_step(1)  # the same step: none
        sl.set_step(2)
        # a helper's step of its own: not the loop's boundary
        helper = threading.Thread(target=lambda: sl.set_step(50))
        helper.start()
        helper.join()
        sl.set_step(3)
        assert calls == [("first", 1), ("second", 1), ("first", 2), ("second", 2)]
        remove_first()
        remove_first()  # twice: harmless
        sl.set_step(4)
        assert calls[-1] == ("second", 3) and len(calls) == 5
    finally:
        remove_first()
        remove_second()
    sl.set_step(5)
    assert len(calls) == 5


def test_a_failing_boundary_hook_costs_neither_the_step_nor_the_other_hooks_and_a_hook_may_remove_itself():
    from otel_titan.core import step_context

    sl.set_step(10)
    seen = []

    def broken(ended: int) -> None:
        raise RuntimeError("a figure that cannot be read")

    def once(ended: int) -> None:
        seen.append(ended)
        remove_once()

    remove_broken = step_context.add_boundary_hook(broken)
    remove_once = step_context.add_boundary_hook(once)
    try:
        sl.set_step(11)
        sl.set_step(12)
        assert sl.get_step() == 12 and seen == [10]
    finally:
        remove_broken()
        remove_once()


def test_clear_boundary_hooks_removes_every_hook_and_the_logger_leaves_none_behind(logged):
    from otel_titan.core import step_context

    logged(process_figures=True)  # a running logger: its per-step figures and its look for a mesh
    assert len(step_context._boundary_hooks) == 2
    sl.shutdown_structured_logger()
    assert step_context._boundary_hooks == []
    step_context.add_boundary_hook(lambda ended: None)
    step_context.clear_boundary_hooks()
    assert step_context._boundary_hooks == []

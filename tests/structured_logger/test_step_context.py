"""Step and tags: ContextVar per task/thread with a process-wide default."""

from __future__ import annotations

import asyncio
import threading

import pytest

from otel_titan import structured_logger as sl


def test_set_step_clears_tags_and_tags_are_unique_and_ordered():
    sl.set_step(1, relative_step=1)
    sl.add_step_tag("gc")
    sl.add_step_tag("eval")
    sl.add_step_tag("gc")
    assert sl.get_step_tags() == ("gc", "eval")
    sl.set_step(2)
    assert sl.get_step() == 2 and sl.get_relative_step() is None and sl.get_step_tags() == ()
    sl.add_step_tag("x")
    sl.clear_step_tags()
    assert sl.get_step_tags() == () and sl.get_step() == 2


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


def test_a_thread_with_its_own_step_does_not_move_the_others_off_theirs():
    sl.set_step(10)
    own = []

    def worker():
        sl.set_step(500)  # follows the default until now, so it moves it...
        sl.set_step(501)
        own.append(sl.get_step())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert own == [501]
    # ...while the main context, which had diverged (its own value 10), keeps its step.
    assert sl.get_step() == 10


def test_tasks_keep_the_step_of_their_creation_and_own_their_tags():
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
        await task
        return out, sl.get_step(), sl.get_step_tags()

    out, step, tags = asyncio.run(controller())
    assert out == [1, ("mine",)]
    assert (step, tags) == (2, ())


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
    assert sl.get_step() == 12 and type(sl.get_step()) is int


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_tags_raise(bad):
    with pytest.raises((TypeError, ValueError)):
        sl.add_step_tag(bad)

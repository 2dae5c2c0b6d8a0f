"""`sl.*` calls inside a `torch.compile`d model: no-ops Dynamo traces, so compilation succeeds
(issue 28).

torchtitan compiles every transformer block with ``fullgraph=True`` and its
own calls return early under ``torch.compiler.is_compiling()``. Ours must too:
before the fix, Dynamo stopped at ``sys._getframe`` ("Attempted to call
function marked as skipped"). The backend is ``aot_eager``: Dynamo and
AOTAutograd (forward and backward graphs) as in a real compile, without a C
compiler's minutes; the failure was Dynamo's, which every backend shares.
"""

from __future__ import annotations

import pytest

from otel_titan import structured_logger as sl
from tests.conftest import run_python

torch = pytest.importorskip("torch")


class _Block(torch.nn.Module):
    """A block whose forward calls every kind of sl.* call, as an instrumented model does."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        with sl.log_trace_span("block_forward"):
            sl.log_trace_instant("block_marker")
            y = torch.relu(self.linear(x))
        sl.log_trace_scalar({"inside_compiled": 1.0})
        return y


@sl.log_trace_span("decorated_inner")
def _decorated(x):
    return x * 2


def _compiled_step(fullgraph: bool):
    torch.manual_seed(0)
    block = _Block()
    compiled = torch.compile(block, fullgraph=fullgraph, backend="aot_eager")
    x = torch.randn(4, 8)
    out = compiled(x)
    out.sum().backward()
    eager = block(x)  # the same module run eagerly: its calls are recorded
    return out, eager


@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "default"])
def test_a_compiled_model_with_sl_calls_inside_compiles_runs_and_records_nothing_of_the_compiled_region(
    logged, fullgraph
):
    torch._dynamo.reset()
    logged()
    sl.set_step(1)
    with sl.log_trace_span("train_step"):
        out, eager = _compiled_step(fullgraph)
    assert torch.allclose(out, eager)
    if not fullgraph:  # the default allows graph breaks: there must be none either
        explanation = torch._dynamo.explain(_Block())(torch.randn(4, 8))
        assert explanation.graph_break_count == 0, explanation.break_reasons
    names = [r["log_type_name"] for r in logged.finish()]
    # The eager call of the same block is recorded once; the compiled call left nothing behind.
    assert names.count("block_forward_start") == 1 and names.count("block_marker") == 1
    assert names.count("metric_value") == 1
    assert names[0] == "train_step_start" and names[-1] == "train_step_end"


def test_a_decorated_function_compiles_with_fullgraph(logged):
    torch._dynamo.reset()
    logged()
    compiled = torch.compile(_decorated, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
    assert [r["log_type_name"] for r in logged.finish()] == []


def test_calls_before_init_compile_too():
    torch._dynamo.reset()
    assert not sl.is_initialized()
    out, eager = _compiled_step(fullgraph=True)
    assert torch.allclose(out, eager)


def test_torch_imported_after_init_is_noticed_before_a_compile(tmp_path):
    # The check is looked up at init; a program that imports torch later gets it from the writer
    # thread.
    result = run_python(
        f"""
        import sys, time
        from otel_titan import structured_logger as sl
        sl.init_structured_logger("training", {str(tmp_path)!r}, rank=0, world_size=1)
        assert "torch" not in sys.modules
        import torch
        time.sleep(0.5)  # ten writer periods; importing torch alone takes longer

        def f(x):
            with sl.log_trace_span("inside"):
                return x + 1

        print(torch.compile(f, fullgraph=True, backend="eager")(torch.zeros(2)).tolist())
        sl.shutdown_structured_logger()
        """,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[1.0, 1.0]"


def test_compiling_while_other_threads_log_never_trips_a_dynamo_guard(logged):
    """Dynamo guarded on the capture queue it saw in `sl.*` calls (``len(_state.items) == 5``):
    another thread's records changed it while a frame was traced, and torch raised "Guard failed on
    the same frame it was created" (seen once in a whole-suite run, as the default compile's
    explain). The check for compilation comes first now, so a traced call never reads the queue.
    Here other threads log all the while the block is traced: each record changes the queue's
    length, a thousand times a second per thread. Not flat out: two threads flat out for the four
    compiles filled CI's 128 MB file, which rotated away the eager calls' records (857 of the other
    threads' records and one block_forward_start were left in the active file)."""
    import threading
    import time

    logged(max_file_size_mb=1024)
    stop = threading.Event()

    def log_until_stopped() -> None:
        while not stop.is_set():
            sl.log_trace_instant("from_another_thread")
            time.sleep(0.001)

    threads = [threading.Thread(target=log_until_stopped, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for fullgraph in (False, True, False, True):
            torch._dynamo.reset()
            explanation = torch._dynamo.explain(_Block())(torch.randn(4, 8))
            assert explanation.graph_break_count == 0, explanation.break_reasons
            out, eager = _compiled_step(fullgraph)
            assert torch.allclose(out, eager)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    names = [r["log_type_name"] for r in logged.finish()]
    assert names.count("from_another_thread") > 100 and names.count("block_forward_start") == 4

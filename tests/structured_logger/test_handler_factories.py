"""Handler factories: which run, what they receive, and what exporters get."""

from __future__ import annotations

import pytest
from opentelemetry.trace import StatusCode

from otel_titan import structured_logger as sl
from otel_titan.structured_logger.handler_factories import JSONL_HANDLER, resolve_handler_specs
from tests.conftest import jsonl_files
from tests.helpers import factories

MEMORY = "tests.helpers.factories.register_memory"


def test_default_is_the_jsonl_handler():
    assert resolve_handler_specs(None, {}) == ([JSONL_HANDLER], "default")


def test_project_variable_wins_over_torchtitans_and_the_option_wins_over_both():
    env = {"OTEL_TITAN_HANDLERS": "a.b.c", "TITAN_STRUCT_LOGGER_HANDLERS": "d.e.f"}
    assert resolve_handler_specs(None, env) == (["a.b.c"], "OTEL_TITAN_HANDLERS")
    assert resolve_handler_specs(["x.y.z"], env) == (["x.y.z"], "handlers= option")
    assert resolve_handler_specs(None, {"TITAN_STRUCT_LOGGER_HANDLERS": " d.e.f , g.h.i ,"}) == (
        ["d.e.f", "g.h.i"],
        "TITAN_STRUCT_LOGGER_HANDLERS",
    )


def test_only_listed_factories_run(run_dir, monkeypatch):
    monkeypatch.setenv("TITAN_STRUCT_LOGGER_HANDLERS", MEMORY)
    sl.init_structured_logger("training", run_dir, rank=1, world_size=2, run_id="r")
    with sl.log_trace_span("x"):
        pass
    sl.shutdown_structured_logger()
    assert jsonl_files(run_dir) == []  # no JSONL: it was not listed
    assert [s.name for s in factories.LAST["exporter"].get_finished_spans()] == ["x"]


def test_factory_receives_the_documented_arguments(run_dir):
    sl.init_structured_logger(
        "reward", run_dir, rank=1, world_size=2, run_id="r", job_id="j", handlers=[MEMORY]
    )
    got = factories.LAST
    for name in (
        "structured_logger",
        "rank",
        "local_rank",
        "world_size",
        "source",
        "output_dir",
        "run_id",
        "attempt",
        "job_id",
        "trace_id",
        "identity",
        "resource",
        "options",
        "stats",
    ):
        assert name in got, name
    assert (
        got["rank"],
        got["world_size"],
        got["source"],
        got["run_id"],
        got["job_id"],
        got["trace_id"],
    ) == (1, 2, "reward", "r", "j", "r")
    assert got["output_dir"] == str(run_dir)
    assert got["resource"].attributes["titan.rank"] == 1


def test_sdk_exporters_receive_readable_spans_with_resource_attributes_and_events(run_dir):
    sl.init_structured_logger(
        "training", run_dir, world_size=1, run_id="r", handlers=[MEMORY, JSONL_HANDLER]
    )
    sl.set_step(4, relative_step=2)
    sl.add_step_tag("gc")
    with sl.log_trace_span("outer", "the outer one"):
        sl.log_trace_instant("mark")
        sl.log_trace_scalar({"loss": 0.5})
        with pytest.raises(ZeroDivisionError):
            with sl.log_trace_span("inner"):
                1 / 0  # noqa: B018 - the expression raises: that is the test
    sl.log_trace_instant("top_level")
    sl.shutdown_structured_logger()
    spans = {s.name: s for s in factories.LAST["exporter"].get_finished_spans()}
    assert set(spans) == {"outer", "inner", "mark", "loss", "top_level"}
    outer, inner = spans["outer"], spans["inner"]
    assert inner.parent.span_id == outer.context.span_id and outer.parent is None
    assert inner.context.trace_id == outer.context.trace_id == spans["mark"].context.trace_id
    attrs = outer.attributes
    assert (
        attrs["titan.step"] == 4
        and attrs["titan.relative_step"] == 2
        and attrs["titan.step_tags"] == ("gc",)
    )
    assert attrs["titan.description"] == "the outer one" and attrs["titan.record_kind"] == "span"
    assert (
        attrs["code.function.name"]
        == "test_sdk_exporters_receive_readable_spans_with_resource_attributes_and_events"
    )
    assert (
        attrs["code.file.path"].endswith("test_handler_factories.py")
        and attrs["code.line.number"] > 0
    )
    assert attrs["thread.id"] > 0
    assert outer.end_time > outer.start_time
    assert (
        outer.resource.attributes["titan.run_id"] == "r"
        and outer.resource.attributes["service.name"] == "training"
    )
    assert outer.instrumentation_scope.name == "otel_titan"
    assert [e.name for e in outer.events] == ["mark", "loss"]  # instants and scalars as events
    assert outer.events[1].attributes["titan.metric.value"] == 0.5
    assert (
        inner.status.status_code is StatusCode.ERROR
        and inner.attributes["error.type"] == "ZeroDivisionError"
    )
    (exception,) = inner.events
    assert (
        exception.name == "exception"
        and exception.attributes["exception.type"] == "ZeroDivisionError"
    )
    assert "1 / 0" in exception.attributes["exception.stacktrace"]
    assert (
        spans["loss"].attributes["titan.metric.value"] == 0.5
        and spans["loss"].start_time == spans["loss"].end_time
    )
    assert spans["top_level"].parent is None
    assert spans["mark"].parent.span_id == outer.context.span_id


def test_events_on_a_long_span_are_bounded(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1, handlers=[MEMORY])
    with sl.log_trace_span("whole_run"):
        for i in range(1000):
            sl.log_trace_scalar({"loss": float(i)})
    sl.shutdown_structured_logger()
    whole = [s for s in factories.LAST["exporter"].get_finished_spans() if s.name == "whole_run"][0]
    assert len(whole.events) == 128 and whole.dropped_events == 872
    assert whole.events[-1].attributes["titan.metric.value"] == 999.0  # the most recent are kept


def test_a_failing_exporter_is_isolated_and_reported_once(run_dir, caplog):
    from opentelemetry.sdk.trace.export import SpanExporter

    class Broken(SpanExporter):
        calls = 0

        def export(self, spans):
            Broken.calls += 1
            raise OSError("backend down")

        def shutdown(self):
            pass

    def register_broken(*, add_span_exporter, **_):
        add_span_exporter(Broken())

    sl.init_structured_logger(
        "training", run_dir, world_size=1, handlers=[register_broken, JSONL_HANDLER]
    )
    for _ in range(3):
        with sl.log_trace_span("x"):
            pass
        sl.flush_structured_logger()
    sl.shutdown_structured_logger()
    assert Broken.calls == 3
    assert caplog.text.count("Broken raised in export") == 1
    from tests.conftest import data_records, read_records

    assert len(data_records(read_records(jsonl_files(run_dir)[0]))) == 6  # JSONL unaffected


def test_add_span_exporter_rejects_non_exporters(run_dir):
    def register_wrong(*, add_span_exporter, **_):
        add_span_exporter(object())

    with pytest.raises(sl.HandlerFactoryError, match="SpanExporter"):
        sl.init_structured_logger("training", run_dir, world_size=1, handlers=[register_wrong])


def test_spans_open_at_shutdown_reach_finished_span_exporters_marked_incomplete(run_dir):
    sl.init_structured_logger("training", run_dir, world_size=1, handlers=[MEMORY, JSONL_HANDLER])
    sl.set_step(9)
    hung = sl.log_trace_span("data_fetch")
    hung.__enter__()  # never exits: the phase a hung rank is stuck in
    with sl.log_trace_span("done"):
        pass
    sl.shutdown_structured_logger()
    spans = {s.name: s for s in factories.LAST["exporter"].get_finished_spans()}
    assert spans["data_fetch"].attributes["titan.incomplete"] is True
    assert spans["data_fetch"].end_time >= spans["done"].end_time
    assert "titan.incomplete" not in spans["done"].attributes
    from tests.conftest import data_records, read_records

    names = [r["log_type_name"] for r in data_records(read_records(jsonl_files(run_dir)[0]))]
    # the file keeps the truth: no _end
    assert names == [
        "data_fetch_start",
        "done_start",
        "done_end",
    ]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_factory_that_attaches_on_rank_zero_only_is_accepted_on_every_rank(
    run_dir, monkeypatch, caplog, rank
):
    # torchtitan accepts it (its test_custom_env_replaces_default); before, every rank but 0 raised
    # HandlerFactoryError.
    monkeypatch.setenv(
        "TITAN_STRUCT_LOGGER_HANDLERS",
        f"{JSONL_HANDLER},tests.helpers.factories.register_on_rank_zero",
    )
    with caplog.at_level("INFO", logger="otel_titan"):
        sl.init_structured_logger("training", run_dir, rank=rank, world_size=2)
    assert sl.is_initialized()
    said = [r.getMessage() for r in caplog.records if "registered no exporter" in r.getMessage()]
    assert said == ([] if rank == 0 else [said[0]]) and (rank == 0 or f"on rank {rank}" in said[0])
    sl.log_trace_instant("recorded")
    sl.shutdown_structured_logger()
    (path,) = jsonl_files(run_dir)
    assert '"recorded"' in open(path).read()

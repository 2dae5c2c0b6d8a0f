"""One code path, two executors (`executors`): serial, ``--jobs 2`` and a real Dask cluster give the
same answers.

The cluster is a real ``dask.distributed.LocalCluster``: a scheduler and two
worker processes on loopback (no dashboard), reached by address exactly as
``--scheduler tcp://...`` reaches a SLURM job's. The run is generated with a
straggler, a hung rank, host clock offsets, a file whose name holds a
terminal escape and a torn last line. Checked: summarize (every field but
the ages relative to now), export (every event, the metadata), sql (the
views, ordered), warnings from the cluster's workers by the one escaping
path, a clear error for an unreachable scheduler and for a missing Dask,
and no process left once the cluster is closed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from benchmarks.generate_run import RunSpec, generate_run  # noqa: E402 - after importorskip: without distributed the module is skipped
from otel_titan.analysis import generate_gantt_trace, summarize_run  # noqa: E402 - after importorskip: without distributed the module is skipped
from otel_titan.analysis.query.sql import open_run  # noqa: E402 - after importorskip: without distributed the module is skipped
from otel_titan.analysis.workers import executors  # noqa: E402 - after importorskip: without distributed the module is skipped
from otel_titan.cli import main  # noqa: E402 - after importorskip: without distributed the module is skipped
from tests.conftest import REPO  # noqa: E402 - after importorskip: without distributed the module is skipped
from tests.helpers import processes  # noqa: E402 - after importorskip: without distributed the module is skipped
from tests.helpers.analysis import load_trace  # noqa: E402 - after importorskip: without distributed the module is skipped

RED = "\x1b[31m"


def _start_cluster() -> Any:
    return distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        host="127.0.0.1",
        silence_logs=logging.ERROR,
        scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"},
    )


def _worker_pids(address: str) -> list[int]:
    with distributed.Client(address, set_as_default=False) as client:
        return sorted(client.run(os.getpid).values())


def _gone(pids: list[int], within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{pid}") for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def cluster() -> Any:
    with _start_cluster() as local:
        pids = _worker_pids(local.scheduler_address)
        # worker processes, not threads of this one
        assert len(pids) == 2 and os.getpid() not in pids
        yield local.scheduler_address
    assert _gone(pids)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dask-run")
    generate_run(
        str(out),
        RunSpec(
            ranks=8,
            steps=12,
            seed=5,
            straggler=(3, "fwd", 40.0),
            hung=(6, 10),
            ranks_per_host=4,
            host_offsets_us=[0.0, 2500.0],
            start_us=1_796_000_000_000_000,
        ),
    )
    victim = sorted((out / "structured_logs").glob("*.jsonl"))[1]
    renamed = victim.with_name(victim.name.replace("global_rank_1", f"global_rank_1{RED}RED"))
    victim.rename(renamed)
    with open(renamed, "a") as handle:
        handle.write('{"time_us": 17960000')  # torn: the process died mid-write
    return out


def _timeless(value: Any) -> Any:
    """The summary without its ages relative to now (``*_s_before_now``), which differ between two
    calls by the time between them."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if not k.endswith("_before_now")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def test_summarize_on_the_cluster_is_the_serial_summary(run, cluster) -> None:
    serial = _timeless(summarize_run(run, log_skipped=False, cache=False).to_dict())
    assert serial["stragglers"] and serial["skipped_lines"] == 1  # the run has something to find
    assert _timeless(summarize_run(run, jobs=2, log_skipped=False, cache=False).to_dict()) == serial
    assert (
        _timeless(summarize_run(run, scheduler=cluster, log_skipped=False, cache=False).to_dict())
        == serial
    )


def test_reads_cached_on_the_cluster_and_resumed_there_give_the_serial_summary(
    run, cluster, tmp_path
) -> None:
    """The cluster's workers send back each process's read, which is cached; a grown run is read on
    from there, on the cluster too."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("analysis"))
    files = sorted((copy / "structured_logs").glob("*.jsonl"))
    whole = {path: path.read_bytes() for path in files}
    for path, data in whole.items():  # the run as it was halfway: every file cut after a line
        path.write_bytes(data[: data.rindex(b"\n", 0, len(data) // 2) + 1])
    half = _timeless(summarize_run(copy, log_skipped=False, cache=False).to_dict())
    # read there, cached here
    assert _timeless(summarize_run(copy, scheduler=cluster, log_skipped=False).to_dict()) == half
    assert (copy / "analysis" / "cache" / "reads.pack").is_file()
    for path, data in whole.items():  # it grew
        path.write_bytes(data)
    serial = _timeless(summarize_run(copy, log_skipped=False, cache=False).to_dict())
    # the appended bytes read there
    assert _timeless(summarize_run(copy, scheduler=cluster, log_skipped=False).to_dict()) == serial
    # all cached now
    assert _timeless(summarize_run(copy, jobs=2, log_skipped=False).to_dict()) == serial
    assert _timeless(summarize_run(copy, log_skipped=False).to_dict()) == serial


def _canonical(trace: dict) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in trace["traceEvents"])


def test_export_on_the_cluster_is_the_serial_trace(run, cluster, tmp_path) -> None:
    outputs = {}
    for name, options in {
        "serial": {"jobs": 1},
        "jobs": {"jobs": 2},
        "dask": {"scheduler": cluster},
    }.items():
        stats = generate_gantt_trace(run, tmp_path / f"{name}.json", log_skipped=False, **options)
        outputs[name] = (load_trace(tmp_path / f"{name}.json"), stats)
    serial, _ = outputs["serial"]
    for name in ("jobs", "dask"):
        trace, stats = outputs[name]
        assert _canonical(trace) == _canonical(serial), name
        other = {k: v for k, v in trace["otherData"].items()}
        assert other == serial["otherData"], name
        assert stats.skipped_lines == 1 and stats.spans == outputs["serial"][1].spans > 0
    # no part file left
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dask.json",
        "jobs.json",
        "serial.json",
    ]


def test_native_export_on_the_cluster_matches_jobs(run, cluster, tmp_path) -> None:
    local = generate_gantt_trace(run, tmp_path / "jobs.pftrace", jobs=2, log_skipped=False)
    dask = generate_gantt_trace(
        run, tmp_path / "dask.pftrace", scheduler=cluster, log_skipped=False
    )
    assert (tmp_path / "jobs.pftrace").read_bytes() == (tmp_path / "dask.pftrace").read_bytes()
    assert (local.spans, local.instants, local.counters, local.events) == (
        dask.spans,
        dask.instants,
        dask.counters,
        dask.events,
    )


QUERIES = [
    "SELECT * FROM spans ORDER BY process_id, span_id",
    "SELECT * FROM processes ORDER BY process_id",
    "SELECT * FROM steps ORDER BY process_id, step",
    "SELECT * FROM scalars ORDER BY process_id, time_us, name",
    "SELECT * FROM instants ORDER BY process_id, time_us, name",
    "SELECT * FROM clock_offsets ORDER BY host_name",
    "SELECT count(*), count(*) FILTER (WHERE log_type_name IS NULL) FROM records",
]


def test_sql_loaded_on_the_cluster_answers_as_the_local_load(run, cluster) -> None:
    local, dask = open_run(run, cache=False), open_run(run, scheduler=cluster, cache=False)
    local.load()
    dask.load()
    assert not dask.from_cache  # loaded there
    assert local.clock == dask.clock and "aligned" in local.clock
    for query in QUERIES:
        assert dask.con.execute(query).fetchall() == local.con.execute(query).fetchall(), query
    # the torn line, a row of NULLs in both
    assert local.con.execute(QUERIES[-1]).fetchall()[0][1] == 1


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    return processes.run(
        [sys.executable, "-m", "otel_titan.cli", *args],
        capture_output=True,
        env={**base, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=180,
        cwd=cwd,
    )


def test_a_relative_run_path_reaches_workers_whose_working_directory_differs(
    run, cluster, tmp_path
) -> None:
    """``summarize run --scheduler …`` typed in the job's folder: a dask-jobqueue worker runs
    elsewhere and must be sent absolute paths."""
    elsewhere = tmp_path / "worker-home"
    elsewhere.mkdir()
    with distributed.Client(cluster, set_as_default=False) as client:
        before = client.run(os.getcwd)
        # the workers' own working directory, as on another node
        client.run(os.chdir, str(elsewhere))
        try:
            assert set(client.run(os.getcwd).values()) == {str(elsewhere)}
            here, name = run.parent, run.name
            local = _cli("summarize", name, "--no-cache", "--json", cwd=here)
            dask = _cli("summarize", name, "--no-cache", "--json", "--scheduler", cluster, cwd=here)
            assert local.returncode == dask.returncode == 0, dask.stderr.decode(errors="replace")
            assert b"No such file" not in dask.stderr, dask.stderr
            assert _timeless(json.loads(dask.stdout)) == _timeless(json.loads(local.stdout))
            exported = _cli(
                "export", name, "-o", str(tmp_path / "dask.json"), "--scheduler", cluster, cwd=here
            )
            assert exported.returncode == 0, exported.stderr.decode(errors="replace")
            assert _canonical(load_trace(tmp_path / "dask.json"))
            query = "SELECT rank, count(*) FROM spans GROUP BY ALL ORDER BY ALL"
            local = _cli("sql", name, query, "--format", "csv", "--no-cache", cwd=here)
            dask = _cli(
                "sql",
                name,
                query,
                "--format",
                "csv",
                "--no-cache",
                "--scheduler",
                cluster,
                cwd=here,
            )
            assert local.returncode == dask.returncode == 0, dask.stderr.decode(errors="replace")
            assert dask.stdout == local.stdout and dask.stdout.count(b"\n") > 4
        finally:
            for address, folder in before.items():
                client.run(os.chdir, folder, workers=[address])


@pytest.mark.parametrize("how", ["--scheduler", "DASK_SCHEDULER_ADDRESS"])
def test_a_cluster_workers_warning_reaches_the_terminal_once_escaped(run, cluster, how) -> None:
    """The torn line is seen on a Dask worker; its warning comes back with the result to the
    command's one path."""
    if how == "--scheduler":
        done = _cli("summarize", str(run), "--no-cache", "--scheduler", cluster)
    else:
        done = _cli("summarize", str(run), "--no-cache", env={"DASK_SCHEDULER_ADDRESS": cluster})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"\x1b" not in done.stderr and b"\x1b" not in done.stdout
    warnings = [line for line in done.stderr.decode().splitlines() if "truncated last line" in line]
    assert (
        len(warnings) == 1
        and warnings[0].startswith("otel-titan: warning: ")
        and "global_rank_1\\x1b[31mRED" in warnings[0]
    ), done.stderr
    assert "Stragglers" in done.stdout.decode() or "straggler" in done.stdout.decode().lower()


def test_an_unreachable_scheduler_is_a_clear_error(run, monkeypatch, capsys) -> None:
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    # ExitCode.UNAVAILABLE
    assert main(["summarize", str(run), "--no-cache", "--scheduler", "tcp://127.0.0.1:9"]) == 5
    err = capsys.readouterr().err
    assert (
        "otel-titan: error: cannot reach the Dask scheduler at tcp://127.0.0.1:9" in err
        and "Traceback" not in err
    )


def test_without_dask_the_error_says_what_to_install(run) -> None:
    code = (
        "import sys; sys.modules['distributed'] = None; from otel_titan.cli import main; "
        f"sys.exit(main(['export', {str(run)!r}, '--scheduler', 'tcp://127.0.0.1:9', '-o', "
        "'/dev/null']))"
    )
    done = processes.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 5, done.stderr  # ExitCode.UNAVAILABLE
    assert (
        f"pip install '{REPO}[cluster]'" in done.stderr.decode()
        and "Traceback" not in done.stderr.decode()
    )


def test_without_a_scheduler_dask_is_never_imported(run) -> None:
    code = (
        "import sys; from otel_titan.cli import main; rc = main(['summarize', "
        + repr(str(run))
        + ", '--jobs', '2']); "
        "sys.exit(rc if 'distributed' not in sys.modules and 'dask' not in sys.modules else 99)"
    )
    done = processes.run(
        [sys.executable, "-c", code],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_closed_cluster_leaves_no_process(run) -> None:
    token = os.environ[processes.SESSION_VARIABLE]
    before = set(processes.started_by(os.getpid(), token))
    with _start_cluster() as local:
        pids = _worker_pids(local.scheduler_address)
        started = set(processes.started_by(os.getpid(), token)) - before
        # the workers are this test's processes, and the check can see them
        assert set(pids) <= started
        summarize_run(run, scheduler=local.scheduler_address, log_skipped=False, cache=False)
    assert _gone(pids)
    deadline = time.monotonic() + 20
    while (
        left := set(processes.started_by(os.getpid(), token)) - before
    ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


def test_a_file_the_cluster_cannot_read_is_an_error_naming_the_cluster(
    run, cluster, tmp_path
) -> None:
    """As when the workers do not see the run's folder: the error says where it failed and what the
    workers need."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    db = open_run(copy, scheduler=cluster, cache=False)
    # listed here, gone for the workers
    next((copy / "structured_logs").glob("*rank_3*.jsonl")).unlink()
    with pytest.raises(
        executors.ClusterError,
        match=f"(?s)a sql worker on the Dask cluster at {cluster} failed: IOException.*at the same paths",
    ):
        db.load()


def test_export_and_sql_commands_on_the_cluster_print_what_they_print_locally(
    run, cluster, tmp_path
) -> None:
    local = _cli("export", str(run), "-o", str(tmp_path / "local.json"), "--jobs", "1")
    dask = _cli("export", str(run), "-o", str(tmp_path / "dask.json"), "--scheduler", cluster)
    assert local.returncode == dask.returncode == 0, dask.stderr
    assert _canonical(load_trace(tmp_path / "dask.json")) == _canonical(
        load_trace(tmp_path / "local.json")
    )
    query = "SELECT rank, name, count(*), sum(duration_ms::DECIMAL(18, 6)) FROM spans GROUP BY ALL ORDER BY ALL"  # exact: a float sum's order (DuckDB's threads) moves round(…, 3) across .0005
    local = _cli("sql", str(run), query, "--format", "csv")
    dask = _cli(
        "sql",
        str(run),
        query,
        "--format",
        "csv",
        "--no-cache",
        env={"DASK_SCHEDULER_ADDRESS": cluster},
    )
    assert local.returncode == dask.returncode == 0, dask.stderr
    assert dask.stdout == local.stdout and dask.stdout.count(b"\n") > 8


def test_an_explicit_jobs_runs_here_whatever_dask_scheduler_address_says(run) -> None:
    """``--jobs N`` asks for this machine: an unreachable DASK_SCHEDULER_ADDRESS is not even
    tried."""
    done = _cli(
        "summarize", str(run), "--jobs", "1", env={"DASK_SCHEDULER_ADDRESS": "tcp://127.0.0.1:9"}
    )
    assert done.returncode == 0, done.stderr
    assert b"Dask" not in done.stderr


def log_many(name: str, count: int, on_bytes) -> str:
    """A task for `run_task`: logs `count` warnings naming itself, slowly, so that two tasks on two
    threads interleave."""
    for index in range(count):
        logging.getLogger("otel_titan.analysis").warning("%s %d%s", name, index, RED)
        on_bytes(10)
        time.sleep(0.001)
    return name


def test_tasks_on_threads_of_one_worker_get_their_own_warnings_only(caplog) -> None:
    """A Dask worker runs several tasks at once, on threads: each task's result carries its own
    warnings, escaped, and nothing leaks to this logger."""
    from concurrent.futures import ThreadPoolExecutor

    from otel_titan.analysis.workers.interpreters import run_task

    with caplog.at_level(logging.WARNING, logger="otel_titan.analysis"):
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(
                lambda name: run_task("tests.analysis.workers.test_executors:log_many", name, 50),
                ["a", "b"],
            )
    for name, (value, warnings, total, live) in (("a", a), ("b", b)):
        assert value == name and total == 500 and live == 0
        assert warnings == [f"{name} {i}\\x1b[31m" for i in range(50)]
    assert not [r for r in caplog.records if r.name == "otel_titan.analysis"]


def test_an_undecodable_file_name_survives_the_trip_to_the_cluster(run, cluster, tmp_path) -> None:
    """A file name with bytes that are not UTF-8 (surrogates in Python) is sent to the workers and
    back exactly."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    logs = os.fsencode(copy / "structured_logs")
    victim = sorted(os.listdir(logs))[2]
    os.rename(
        os.path.join(logs, victim),
        os.path.join(logs, victim.replace(b"global_rank_2", b"global_rank_2\xff\xfe")),
    )
    serial = _timeless(summarize_run(copy, log_skipped=False).to_dict())
    # the summary names the file, surrogates and all
    assert "global_rank_2\\udcff\\udcfe" in json.dumps(serial)
    assert (
        _timeless(summarize_run(copy, scheduler=cluster, log_skipped=False, cache=False).to_dict())
        == serial
    )
    local = generate_gantt_trace(copy, tmp_path / "local.json", jobs=1, log_skipped=False)
    dask = generate_gantt_trace(copy, tmp_path / "dask.json", scheduler=cluster, log_skipped=False)
    assert (
        _canonical(load_trace(tmp_path / "dask.json"))
        == _canonical(load_trace(tmp_path / "local.json"))
        and local.spans == dask.spans
    )

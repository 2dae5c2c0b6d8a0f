# The two commands of the README work on a fresh machine:
#   make train   set up .venv (scripts/setup.sh: what the training and the analysis need, nothing more),
#                then run the toy training on 2 ranks (JSONL under outputs/)
#   make test    set up .venv, then the tests' own tools (scripts/setup-tests.sh: Chromium, puppeteer-core,
#                scripts/setup-prometheus.sh where it exists; each step says what it installs), then run
#                the whole test suite
# and, for the performance figures of docs/performance.md:
#   make bench         set up, then run the benchmark against the alternatives and against the write path of
#                      BENCH_BASELINE_REF (default 93dec39; about 11 minutes), then metrics on against off on a
#                      step that competes for the interpreter lock (under a minute)
#   make bench-export  set up, then benchmark `otel-titan export` on a generated 1 GB run (about 10 minutes, 3 GB of /tmp)
#   make bench-summarize  set up, then measure summarize at 64, 256 and 1,024 ranks against the export and the
#                      summarize before issue 12 (about 15 minutes, 2 GB of /tmp, deleted after)
#   make bench-sql     set up, then time `otel-titan sql` (per-phase, per-rank p50/p99) against summarize on a
#                      generated 2 GB 1,024-rank run (about 15 minutes, 2 GB of /tmp, deleted after)
#   make bench-steps   set up, then the step table (RunAnalysis.steps) from rollups against from the spans on a
#                      generated 256-rank run (about 3 minutes on 2 cores, 500 MB of /tmp, deleted after)
#   make bench-analysis  set up, then summarize, --jobs 2, export, report and sql against DuckDB's read_ndjson
#                      at 64, 256 and 1,024 ranks, with peak memory (under 10 minutes on 2 cores; docs/performance.md)
#   make bench-start   set up, then measure how soon a span's _start record reaches its file, idle and
#                      with 4 threads spinning for the interpreter lock (under a minute; also part of make bench)
#   make bench-perfetto  set up, then compare the native Perfetto trace with the JSON trace of one run
#                      (size, size gzipped, time per span; a few minutes)
#   make bench-stall   set up, then measure stall detection on against off, per span (a few minutes)
#   make bench-watch   set up, then measure `otel-titan watch`: detection latency, false alarms, CPU per refresh (3 to 5 minutes);
#                      WATCH_LIVE_S=600 WATCH_LIVE_RANKS=64 WATCH_ONLY=live-healthy: the 10 minutes of a healthy run watched live
#   make bench-watch-day  set up, then count false alarms over one long healthy 1,024-rank job replayed in chunks
#                      (a job-day is hours of CPU: WATCH_DAY_BUDGET_S, default 1800, stops it and says how far it got)
.PHONY: setup setup-tests train test bench bench-export bench-summarize bench-analysis bench-steps bench-sql bench-start bench-stall bench-perfetto bench-watch bench-watch-day clean

setup:
	bash scripts/setup.sh

setup-tests: setup
	bash scripts/setup-tests.sh

train: setup
	bash scripts/train.sh

test: setup-tests
	.venv/bin/python -m pytest

# make bench BENCH_BASELINE_REF=<git ref>: the revision whose write path is measured side by side (a row and two ratios of the table).
BENCH_BASELINE_REF ?= 93dec39

bench: setup
	.venv/bin/python -m benchmarks.run --baseline-ref "$(BENCH_BASELINE_REF)"
	.venv/bin/python -m benchmarks.metrics_cost --rounds 5

bench-stall: setup
	.venv/bin/python -m benchmarks.stall_watchdog

bench-export: setup
	.venv/bin/python benchmarks/export_throughput.py

bench-summarize: setup
	.venv/bin/python benchmarks/summarize_scale.py

bench-analysis: setup
	.venv/bin/python benchmarks/analysis_scale.py

bench-steps: setup
	.venv/bin/python benchmarks/step_table.py

bench-sql: setup
	.venv/bin/python benchmarks/sql_scale.py /tmp/otel-titan-sql-bench --ranks 1024 --steps 200

bench-start: setup
	.venv/bin/python -m benchmarks.start_latency --rounds 20

bench-perfetto: setup
	.venv/bin/python benchmarks/perfetto_size.py

# make bench-watch WATCH_LIVE_S=600 WATCH_LIVE_RANKS=64 WATCH_ONLY=live-healthy: the issue's 10 minutes of a healthy run watched live, alone.
WATCH_LIVE_S ?= 30
WATCH_LIVE_RANKS ?= 32
WATCH_ONLY ?= latency,false-alarms,cpu,live
bench-watch: setup
	.venv/bin/python benchmarks/watch_live.py --live-healthy-s $(WATCH_LIVE_S) --live-ranks $(WATCH_LIVE_RANKS) --only $(WATCH_ONLY)

# make bench-watch-day: false alarms over one long healthy 1,024-rank job replayed (toward a job-day; hours of CPU, WATCH_DAY_BUDGET_S caps it).
WATCH_DAY_BUDGET_S ?= 1800
bench-watch-day: setup
	.venv/bin/python benchmarks/watch_false_alarms.py --ranks 1024 --hours 24 --budget-s $(WATCH_DAY_BUDGET_S)

clean:
	rm -rf .venv .venv-minimum outputs .pytest_cache .hypothesis

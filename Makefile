# The two commands of the README work on a fresh machine:
#   make train   set up, then run the toy training on 2 ranks (JSONL under outputs/)
#   make test    set up, then run the whole test suite
# and, for the performance figures of docs/performance.md:
#   make bench         set up, then run the benchmark against the alternatives (about 10 minutes)
#   make bench-export  set up, then benchmark `otel-titan export` on a generated 1 GB run (about 10 minutes, 3 GB of /tmp)
#   make bench-stall   set up, then measure stall detection on against off, per span (a few minutes)
#   make bench-start   set up, then measure how soon a span's _start record reaches its file, idle and
#                      with 4 threads spinning for the interpreter lock (under a minute; also part of make bench)
.PHONY: setup train test bench bench-export bench-start bench-stall clean

setup:
	bash scripts/setup.sh

train: setup
	bash scripts/train.sh

test: setup
	.venv/bin/python -m pytest

bench: setup
	.venv/bin/python -m benchmarks.run

bench-stall: setup
	.venv/bin/python -m benchmarks.stall_watchdog

bench-export: setup
	.venv/bin/python benchmarks/export_throughput.py

bench-start: setup
	.venv/bin/python -m benchmarks.start_latency --rounds 20

clean:
	rm -rf .venv outputs .pytest_cache .hypothesis

#!/usr/bin/env bash
# The main job: a real instrumented training run on 2 ranks (torchrun, gloo, CPU).
# Leaves one JSONL file per rank under outputs/structured_logs/, then writes the
# run's Chrome trace (outputs/analysis/trace.json) and prints its summary.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-outputs}
STEPS=${STEPS:-50}
# Each run starts from an empty log folder, so the analysis sees this run only.
rm -rf "$OUT/structured_logs" "$OUT/analysis"
echo "train: 2 ranks, $STEPS steps, logs in $OUT/structured_logs/"
OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node=2 examples/train_toy.py --output-dir "$OUT" --steps "$STEPS" "$@"
echo
ls -l "$OUT/structured_logs/"
echo
# The run's Chrome trace (open it in https://ui.perfetto.dev) and its summary.
.venv/bin/otel-titan export "$OUT"
echo
.venv/bin/otel-titan summarize "$OUT"
echo
echo "train: next, .venv/bin/otel-titan report $OUT (the run's pictures, one HTML file) or .venv/bin/otel-titan sql $OUT (any question);"
echo "       'source .venv/bin/activate' once per shell puts otel-titan on the PATH (README: After the run)"

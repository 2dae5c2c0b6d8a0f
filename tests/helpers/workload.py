"""An instrumented workload run as a real process by the OTLP tests.

    python -m tests.helpers.workload OUTPUT_DIR [--steps N] [--sleep-ms MS] [--ready-file F]

Each step: a top-level ``step`` span holding ``data_fetch`` (sleeps), ``fwd_bwd``
with an instant and a scalar inside, a top-level scalar; step 3 raises inside
``optimizer`` (caught). Prints one JSON line with the loop's wall time.
"""

from __future__ import annotations

import argparse
import json
import time

from otel_titan import structured_logger as sl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sleep-ms", type=float, default=2.0)
    parser.add_argument("--ready-file", default=None, help="touched after the first step")
    args = parser.parse_args()

    sl.init_structured_logger("training", args.output_dir)
    sl.log_trace_instant("training_start")  # top level: a zero-length span
    started = time.perf_counter()
    for step in range(1, args.steps + 1):
        sl.set_step(step, relative_step=step)
        if step % 2 == 0:
            sl.add_step_tag("gc")
        with sl.log_trace_span("step"):
            with sl.log_trace_span("data_fetch"):
                time.sleep(args.sleep_ms / 1000)
            with sl.log_trace_span("fwd_bwd"):
                sl.log_trace_instant("grads_ready")
                sl.log_trace_scalar({"grad_norm": 1.5})
            try:
                with sl.log_trace_span("optimizer"):
                    if step == 3:
                        raise RuntimeError("nan in optimizer state")
            except RuntimeError:
                pass
        sl.log_trace_scalar({"loss": 1.0 / step})
        if step == 1 and args.ready_file:
            open(args.ready_file, "w").close()
    loop_s = time.perf_counter() - started
    print(json.dumps({"loop_s": loop_s, "steps": args.steps}), flush=True)


if __name__ == "__main__":
    main()

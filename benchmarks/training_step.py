"""Training-step overhead: a small torch model, 20 spans and a scalar dict per step.

    python -m benchmarks.training_step MODE [--steps N] [--reps R]

MODE is ``bare`` (no sl calls at all), ``disabled`` (the same calls with the
logger never initialised: no-ops), ``jsonl`` (logging to JSONL) or
``jsonl_otlp`` (JSONL and OTLP, to the endpoint of the standard variables). Torch uses
one thread, so the logger's writer thread has the second core, as a rank of a
multi-GPU job would have spare host cores. The step is sized to take about
10 ms on the development machine. Prints one JSON line with the median step
time of each repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time

import torch
from torch import nn

from otel_titan import structured_logger as sl

PHASES_PER_STEP = 20


def build(hidden: int) -> tuple[nn.Module, torch.optim.Optimizer, list[nn.Module]]:
    layers = [
        nn.Linear(256, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 256),
    ]
    model = nn.Sequential(*layers)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), layers


def run(mode: str, steps: int, reps: int, hidden: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, optimizer, layers = build(hidden)
    inputs = torch.randn(64, 256)
    target = torch.randn(64, 256)
    directory = tempfile.TemporaryDirectory(prefix="bench-step-")
    if mode.startswith("jsonl"):
        handlers = ["otel_titan.exporters.jsonl.register_jsonl_handler"] + (
            ["otel_titan.exporters.otlp.register_otlp_handler"] if mode == "jsonl_otlp" else []
        )
        sl.init_structured_logger(
            "training", directory.name, world_size=1, run_id="bench", handlers=handlers
        )
    span = sl.log_trace_span if mode != "bare" else (lambda name: contextlib.nullcontext())
    scalar = sl.log_trace_scalar if mode != "bare" else (lambda values: None)
    set_step = sl.set_step if mode != "bare" else (lambda step, relative_step=None: None)

    def step(n: int) -> None:
        # 20 spans: step, data_fetch, zero_grad, fwd_bwd, forward, 7 layers, loss,
        # backward, clip_grad, optimizer, 3 bookkeeping phases.
        set_step(n, relative_step=n)
        with span("step"):
            with span("data_fetch"):
                batch = inputs + 0.0
            with span("zero_grad"):
                optimizer.zero_grad(set_to_none=True)
            with span("fwd_bwd"):
                with span("forward"):
                    out = batch
                    for layer in layers:
                        with span("layer"):
                            out = layer(out)
                with span("loss"):
                    loss = nn.functional.mse_loss(out, target)
                with span("backward"):
                    loss.backward()
            with span("clip_grad"):
                norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with span("optimizer"):
                optimizer.step()
            with span("metrics"):
                loss_value = loss.item()
            with span("bookkeeping"):
                pass
            with span("checkpoint_check"):
                pass
        scalar({"loss": loss_value, "grad_norm": float(norm), "lr": 1e-3, "num_tokens": 64 * 256})

    for n in range(20):  # warm-up
        step(n)
    medians = []
    for _ in range(reps):
        times = []
        for n in range(steps):
            start = time.perf_counter()
            step(n)
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times) * 1000)
    if mode.startswith("jsonl"):
        sl.shutdown_structured_logger()
    directory.cleanup()
    return {"mode": mode, "steps": steps, "step_ms": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("bare", "disabled", "jsonl", "jsonl_otlp"))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=640, help="layer width (sets the step time)")
    args = parser.parse_args()
    print(json.dumps(run(args.mode, args.steps, args.reps, args.hidden)))


if __name__ == "__main__":
    main()

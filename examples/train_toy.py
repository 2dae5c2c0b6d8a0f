"""A small, real, instrumented training run: `torchrun --nproc_per_node=2 examples/train_toy.py`.

A two-layer MLP learns a random linear map on random data with
DistributedDataParallel over gloo (CPU). Every phase is traced with the
``sl.*`` API exactly as a real trainer would be: ``data_fetch``,
``fwd_bwd`` (with ``forward`` and ``backward`` inside), ``optimizer``, a
``gc`` step tag (and a ``gc_collect`` span) every few steps, instants at
start/end and after checkpoints, and scalars every step.

Each rank writes ``<output-dir>/structured_logs/training.global_rank_<r>.<stamp>-<rand>.jsonl``.

Options worth knowing for trying the analysis tools:
``--slow-rank R --slow-ms M`` makes rank R's data loading M ms slower (a straggler),
``--hang-rank R --hang-step S`` makes rank R hang in ``data_fetch`` at step S
(kill the run, then run ``otel-titan summarize``; the hung rank also ends by
itself once its launcher is gone).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from otel_titan import structured_logger as sl
from otel_titan.logging import init_logger, logger


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output-dir", default="outputs", help="run directory (default: outputs)")
    parser.add_argument("--steps", type=int, default=30, help="training steps (default: 30)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument(
        "--gc-every", type=int, default=10, help="tag a step 'gc' and collect garbage every N steps"
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, help="save a checkpoint every N steps (0: never)"
    )
    parser.add_argument(
        "--slow-rank", type=int, default=-1, help="make this rank's data_fetch slower (a straggler)"
    )
    parser.add_argument(
        "--slow-ms", type=float, default=20.0, help="extra data_fetch time on --slow-rank, in ms"
    )
    parser.add_argument(
        "--hang-rank", type=int, default=-1, help="make this rank hang in data_fetch ..."
    )
    parser.add_argument("--hang-step", type=int, default=-1, help="... at this step")
    return parser.parse_args()


def make_batch(
    step: int, rank: int, batch_size: int, dim: int, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(batch_size, dim, generator=generator)
    return inputs, inputs @ target


def main() -> None:
    args = parse_args()
    init_logger()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    sl.init_structured_logger(source="training", output_dir=args.output_dir)
    sl.log_trace_instant("training_start")

    dim = 32
    target = torch.randn(dim, 1, generator=torch.Generator().manual_seed(42))
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(dim, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaded_step = 0

    @sl.log_trace_span("data_fetch")
    def fetch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)
        if rank == args.hang_rank and step == args.hang_step:
            logger.warning("rank %d: hanging in data_fetch at step %d (as asked)", rank, step)
            # Hang until the launcher is gone. torchrun starts every worker in its own session, so a
            # launcher killed on its own (SIGKILL, or `kill` of its process group) leaves the
            # workers running: a hung toy rank then ends itself instead of living forever.
            launcher = os.getppid()
            while os.getppid() == launcher:
                time.sleep(1)
            raise SystemExit(f"rank {rank}: the launcher is gone, ending the hang")
        return make_batch(step, rank, args.batch_size, dim, target)

    for step in range(loaded_step + 1, args.steps + 1):
        sl.set_step(step, relative_step=step - loaded_step)
        if args.gc_every and step % args.gc_every == 0:
            sl.add_step_tag("gc")
            with sl.log_trace_span("gc_collect"):
                gc.collect()

        inputs, labels = fetch(step)
        with sl.log_trace_span("fwd_bwd"):
            with sl.log_trace_span("forward"):
                loss = nn.functional.mse_loss(model(inputs), labels)
            with sl.log_trace_span("backward"):
                loss.backward()
        with sl.log_trace_span("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        loss_value = loss.item()
        sl.log_trace_scalar(
            {
                "loss": loss_value,
                "num_tokens": args.batch_size * dim,
                "lr": optimizer.param_groups[0]["lr"],
            }
        )
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            with sl.log_trace_span("checkpoint"):
                if rank == 0:
                    torch.save(model.state_dict(), os.path.join(args.output_dir, "checkpoint.pt"))
                    # inside the span: an OTLP log carries its trace id
                    logger.info("step %d: checkpoint saved", step)
                dist.barrier()
            sl.log_trace_instant("checkpoint_saved")
        if rank == 0 and (step % 10 == 0 or step == args.steps):
            logger.info("step %d/%d loss %.4f", step, args.steps, loss_value)

    sl.log_trace_instant("training_end")
    sl.shutdown_structured_logger()
    dist.destroy_process_group()
    if rank == 0:
        logger.info(
            "done: %d ranks, structured logs in %s",
            world,
            os.path.join(args.output_dir, "structured_logs"),
        )


if __name__ == "__main__":
    main()

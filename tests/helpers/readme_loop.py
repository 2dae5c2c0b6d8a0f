"""The README's own training loop under torchrun (gloo, DDP): ``fwd_bwd`` then ``optimizer``, no
span around the collective.

``python readme_loop.py OUTPUT_DIR STEPS SLOW_RANK SLOW_PCT``: every rank runs
the Quickstart's loop; DDP's all-reduce runs inside ``loss.backward()``, so
the step's collective has no span of its own and the last span of each step
is ``optimizer``, a local one. Rank SLOW_RANK's optimizer takes SLOW_PCT %
longer than the others' (``OPTIMIZER_MS``): in the next step's backward every
other rank waits for it inside ``fwd_bwd``. Sleeps make the phases' lengths
(not the machine's load) what the analysis sees.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from otel_titan import structured_logger as sl

#: The forward's and the optimizer's lengths (ms) on a healthy rank.
FORWARD_MS = 40.0
OPTIMIZER_MS = 10.0


def main() -> None:
    out, steps, slow_rank, slow_pct = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]),
    )
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    optimizer_s = OPTIMIZER_MS / 1000.0 * (1.0 + slow_pct / 100.0 if rank == slow_rank else 1.0)
    batch = torch.randn(8, 16)
    sl.init_structured_logger(source="training", output_dir=out)
    sl.log_trace_instant("training_start")
    for step in range(1, steps + 1):
        sl.set_step(step)
        with sl.log_trace_span("fwd_bwd"):
            time.sleep(FORWARD_MS / 1000.0)
            loss = model(batch).pow(2).mean()
            loss.backward()  # DDP's all-reduce: the ranks wait for each other here, in no span of its own
        with sl.log_trace_span("optimizer"):
            optimizer.step()
            optimizer.zero_grad()
            time.sleep(optimizer_s)
        sl.log_trace_scalar({"loss": loss.item()})
    sl.log_trace_instant("training_end")
    sl.shutdown_structured_logger()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

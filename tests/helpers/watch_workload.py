"""A gloo training loop for `otel-titan watch` (tests/analysis/watch/test_watch_torchrun.py): one
fault at a time.

``python watch_workload.py FAULT BAD_RANK OUTPUT_DIR`` under torchrun. Every
rank runs steps of ``data_fetch`` (``STEP_S`` seconds) then ``all_reduce``,
until killed; from step ``FAULT_STEP`` (default 4) rank BAD_RANK injects FAULT:

* ``peer_phase``: sleeps in `read_shard` inside ``data_fetch`` (the others wait in all_reduce);
* ``between_spans``: sleeps in `load_batch` after `set_step`, before its ``data_fetch`` span opens;
* ``slow``: its ``data_fetch`` takes ``SLOW_FACTOR`` (default 1.5) times as long, from then on;
* ``hiccup``: at that step only, its ``data_fetch`` waits ``HICCUP_S`` (default 11) in
  `read_shard_slowly` (a storage hiccup), then the job runs on;
* ``checkpoint``: after that step's ``all_reduce``, rank 0 alone saves a checkpoint (a
  ``checkpoint`` span of ``CHECKPOINT_S``, default 45) and every rank then waits in
  ``dist.barrier()`` (in a ``barrier`` span, or in none with ``WATCH_BARRIER_SPAN=0``): rank-0 work
  the others wait for, no hang; the job runs on (BAD_RANK is unused);
* ``lone_barrier``: at that step, in place of its ``all_reduce``, it enters a ``barrier`` span (a
  span never seen to finish) and calls ``dist.barrier()``, which no other rank joins (they wait in
  all_reduce): a desync that the flight recorder (``TORCH_FR_BUFFER_SIZE``) shows in the black
  boxes;
* ``healthy``: no fault.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from otel_titan import structured_logger as sl

FAULT, BAD, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
STEP_S = float(os.environ.get("WATCH_STEP_S", "0.2"))
FAULT_STEP = int(os.environ.get("WATCH_FAULT_STEP", "4"))
SLOW_FACTOR = float(os.environ.get("WATCH_SLOW_FACTOR", "1.5"))
HICCUP_S = float(os.environ.get("WATCH_HICCUP_S", "11"))
CHECKPOINT_S = float(os.environ.get("WATCH_CHECKPOINT_S", "45"))
BARRIER_SPAN = os.environ.get("WATCH_BARRIER_SPAN", "1") != "0"


def read_shard() -> None:
    time.sleep(3600)  # watch: the culprit line of the peer_phase fault


def read_shard_slowly() -> None:
    time.sleep(HICCUP_S)  # watch: the storage hiccup of the hiccup fault


def load_batch() -> None:
    time.sleep(3600)  # watch: the culprit line of the between_spans fault


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sl.init_structured_logger("training", OUT)
    tensor = torch.ones(16)
    step = 0
    while True:
        step += 1
        sl.set_step(step)
        faulty = rank == BAD and step >= FAULT_STEP
        if faulty and FAULT == "between_spans":
            load_batch()
        with sl.log_trace_span("data_fetch"):
            time.sleep(STEP_S * (SLOW_FACTOR if faulty and FAULT == "slow" else 1.0))
            if faulty and FAULT == "peer_phase":
                read_shard()
            if faulty and FAULT == "hiccup" and step == FAULT_STEP:
                read_shard_slowly()
        if faulty and FAULT == "lone_barrier":
            with sl.log_trace_span("barrier"):
                dist.barrier()  # watch: the culprit line of the lone_barrier fault
        with sl.log_trace_span("all_reduce"):
            dist.all_reduce(tensor)
        if FAULT == "checkpoint" and step == FAULT_STEP:
            save_and_wait(rank)


def save_checkpoint() -> None:
    time.sleep(CHECKPOINT_S)  # watch: rank 0's checkpoint write


def save_and_wait(rank: int) -> None:
    """``if rank == 0: save(); dist.barrier()``: the usual rank-0-only checkpoint."""
    if rank == 0:
        with sl.log_trace_span("checkpoint"):
            save_checkpoint()
    if BARRIER_SPAN:
        with sl.log_trace_span("barrier"):
            dist.barrier()
    else:
        dist.barrier()


if __name__ == "__main__":
    main()

"""A gloo training loop whose rank BAD ends the way real ranks end
(tests/analysis/model/test_crash_states.py).

``python crash_workload.py FAULT BAD OUTPUT_DIR`` under torchrun. Every rank
runs steps of ``data_fetch``, ``fwd_bwd`` (a scalar ``loss`` after it) then ``all_reduce``
(a real gloo all_reduce), then a ``training_end`` instant, with the logger's
per-step process figures on; at
step ``CRASH_STEP`` (8) rank BAD:

* ``raise``: raises ``RuntimeError("CUDA out of memory ...")`` inside ``fwd_bwd``
  (in `allocate`), the most common crash; with ``NO_COLLECTIVE=1`` the ranks
  never all_reduce, so the others run all ``STEPS`` (20) and close;
* ``raise_wait``: the same, and the others then wait in ``all_reduce`` for
  the peer that is gone, as NCCL's collectives do (emulated: gloo would fail
  them at once), until torchrun terminates them;
* ``sigkill``: SIGKILLs itself inside ``fwd_bwd`` (the kernel's OOM killer);
  gloo fails the others' all_reduce and they die of that exception;
* ``sigkill_wait``: the same kill, and the others wait in ``all_reduce`` as in
  ``raise_wait`` until torchrun's SIGTERM: signal records after the killed
  rank's last record, and no exception;
* ``hang``: sleeps in `read_shard` inside the ``data_fetch`` span every rank
  opens before ``fwd_bwd`` (the others wait in gloo's all_reduce) until the
  test presses Ctrl-C (SIGINT to the job's process group).

With ``WRITER=torchtitan`` torchtitan 0.3.0's own logger writes the files.
With ``ONLY_ATTEMPT=0`` the fault is injected in the first attempt only (a
torchrun ``--max-restarts`` restart then runs clean).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

# torchtitan's own logger writes the files (no closing record, no black box)
if os.environ.get("WRITER") == "torchtitan":
    from torchtitan.observability import structured_logger as sl
else:
    from otel_titan import structured_logger as sl

FAULT, BAD, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
STEPS = int(os.environ.get("STEPS", "20"))
CRASH_STEP = int(os.environ.get("CRASH_STEP", "8"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))
COLLECTIVE = os.environ.get("NO_COLLECTIVE") != "1"
ONLY_ATTEMPT = os.environ.get("ONLY_ATTEMPT")
#: Seconds rank BAD works in its faulty fwd_bwd before it fails (with NO_COLLECTIVE: the others
#: finish first, torchrun would otherwise terminate them as soon as it fails).
CRASH_DELAY_S = float(os.environ.get("CRASH_DELAY_S", "0"))


OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 79.15 GiB total capacity)"


def allocate() -> None:
    raise RuntimeError(OOM)  # the crash line


def read_shard() -> None:
    time.sleep(3600)  # the culprit line of the `hang` fault


def wait_for_peer() -> None:
    time.sleep(3600)  # NCCL's wait for a peer that is gone


def faulty(rank: int, step: int) -> bool:
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return rank == BAD and step == CRASH_STEP and (ONLY_ATTEMPT is None or attempt == ONLY_ATTEMPT)


def main() -> None:
    if COLLECTIVE:  # (gloo's connect after a torchrun restart fails on this machine: the restart test runs without one)
        dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    sl.init_structured_logger("training", OUT)
    tensor = torch.ones(16)
    peer_gone = FAULT in ("raise_wait", "sigkill_wait") and (
        ONLY_ATTEMPT is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == ONLY_ATTEMPT
    )
    for step in range(1, STEPS + 1):
        sl.set_step(step)
        with sl.log_trace_span("data_fetch"):
            if FAULT == "hang" and faulty(rank, step):
                read_shard()
        with sl.log_trace_span("fwd_bwd"):
            time.sleep(STEP_S)
            if faulty(rank, step):
                time.sleep(CRASH_DELAY_S)
                if FAULT in ("raise", "raise_wait"):
                    allocate()
                elif FAULT in ("sigkill", "sigkill_wait"):
                    os.kill(os.getpid(), signal.SIGKILL)
        sl.log_trace_scalar({"loss": 1.0 / step})
        if COLLECTIVE:
            with sl.log_trace_span("all_reduce"):
                if peer_gone and step == CRASH_STEP and rank != BAD:
                    wait_for_peer()
                dist.all_reduce(tensor)
    sl.log_trace_instant("training_end")
    if hasattr(sl, "shutdown_structured_logger"):
        sl.shutdown_structured_logger()
    if COLLECTIVE:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

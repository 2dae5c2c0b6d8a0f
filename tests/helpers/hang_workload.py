"""A 4-rank gloo training loop that hangs on purpose, one fault at a time
(tests/analysis/model/test_hang.py).

``python hang_workload.py FAULT BAD_RANK OUTPUT_DIR`` under torchrun. Every
rank runs steps of ``data_fetch`` then ``all_reduce``; at step 3 rank
BAD_RANK injects FAULT:

* ``sleep``: sleeps in `read_shard` inside ``data_fetch`` (the others wait in all_reduce);
* ``between``: sleeps in `load_batch` *before* ``data_fetch`` opens, with no span open (a data
  loader outside any span); the others wait in all_reduce;
* ``gil``: a C call that holds the interpreter lock (``ctypes.PyDLL(None).sleep``);
* ``mismatch``: calls broadcast where the others call all_reduce;
* ``deadlock``: its main thread and a ``ckpt-writer`` thread take two locks in opposite orders;
* ``subgroup``: every step's all_reduce is on ``dist.new_group([0, 1])`` (as a device mesh's groups
  are); rank BAD sleeps in `read_shard` inside ``data_fetch``;
* ``sleep2``: ranks BAD and BAD + 1 sleep in `read_shard` (two culprits);
* ``before_init``: rank BAD blocks in `load_checkpoint` before ``init_structured_logger`` (it writes
  no file);
* ``recover``: every rank pauses `PAUSE_S` in ``all_reduce`` at step 2 (longer than the stall
  threshold), then goes on and closes;
* ``frdump``: the `sleep` fault, with torch's flight recorder kept out of the black boxes (its
  variable unset after the process group is made) and, as torch's watchdog does on a timeout
  (``TORCH_NCCL_DUMP_ON_TIMEOUT``), each rank's recorder dumped by torch (``_dump_fr_trace``) to
  ``OUTPUT_DIR/flight_recorder/rank_<rank>`` after `DUMP_AFTER_S`;
* ``healthy``: no fault, steps of ``STEP_S`` seconds each (slower than the stall floor), then a
  clean end;
* ``live``: no fault, runs until killed (the dump trigger is tried on it).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from otel_titan import structured_logger as sl

FAULT, BAD, OUT = sys.argv[1], int(sys.argv[2]), sys.argv[3]
STEPS = int(os.environ.get("HANG_STEPS", "3"))
STEP_S = float(os.environ.get("HANG_STEP_S", "0.05"))


def read_shard() -> None:
    time.sleep(3600)  # the culprit line of the `sleep` fault


def load_batch() -> None:
    time.sleep(3600)  # the culprit line of the `between` fault


def load_checkpoint() -> None:
    time.sleep(3600)  # the culprit line of the `before_init` fault


def sub_group() -> object:
    """The group every step's all_reduce runs on: a sub-group for the `subgroup` fault, else the
    default one."""
    return dist.new_group([0, 1]) if FAULT == "subgroup" else None


def before_init(rank: int) -> None:
    if FAULT == "before_init" and rank == BAD:
        load_checkpoint()


def is_bad(rank: int) -> bool:
    return rank == BAD or (FAULT == "sleep2" and rank == BAD + 1)


def pause(step: int) -> None:
    """A healthy pause longer than the stall threshold (a checkpoint, an eval): the run then
    recovers."""
    if FAULT == "recover" and step == 2:
        time.sleep(float(os.environ.get("PAUSE_S", "4.5")))


def dump_like_torch_on_timeout(rank: int) -> None:
    """For `frdump`: torch's own dump file, written from a thread while the main thread hangs (gloo
    has no dump on timeout)."""
    if FAULT != "frdump":
        return
    # torch read it when the group was made; the black box now skips the recorder
    os.environ.pop("TORCH_FR_BUFFER_SIZE", None)

    def dump() -> None:
        time.sleep(float(os.environ.get("DUMP_AFTER_S", "4")))
        folder = os.path.join(OUT, "flight_recorder")
        os.makedirs(folder, exist_ok=True)
        data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True, onlyActive=False)
        with open(os.path.join(folder, f"rank_{rank}"), "wb") as handle:
            handle.write(data)

    threading.Thread(target=dump, name="fr-dump", daemon=True).start()


def hold_the_gil() -> None:
    ctypes.PyDLL(None).sleep(3600)  # the culprit line of the `gil` fault


def deadlock() -> None:
    a, b = threading.Lock(), threading.Lock()
    both = threading.Barrier(2)

    def writer() -> None:
        with b:
            both.wait()
            with a:  # the helper's side of the deadlock
                pass

    threading.Thread(target=writer, name="ckpt-writer", daemon=True).start()
    with a:
        both.wait()
        with b:  # the culprit line of the `deadlock` fault
            pass


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = sub_group()
    dump_like_torch_on_timeout(rank)
    before_init(rank)
    sl.init_structured_logger("training", OUT)
    tensor = torch.ones(16)
    step = 0
    while FAULT == "live" or step < STEPS:
        step += 1
        sl.set_step(step)
        if step == 3 and rank == BAD and FAULT == "between":
            load_batch()
        with sl.log_trace_span("data_fetch"):
            time.sleep(STEP_S)
            if step == 3 and is_bad(rank):
                if FAULT in ("sleep", "subgroup", "sleep2", "frdump"):
                    read_shard()
                elif FAULT == "gil":
                    hold_the_gil()
                elif FAULT == "deadlock":
                    deadlock()
        with sl.log_trace_span("all_reduce"):
            pause(step)
            if step == 3 and rank == BAD and FAULT == "mismatch":
                dist.broadcast(tensor, src=BAD)
            else:
                dist.all_reduce(tensor, group=group)
    sl.shutdown_structured_logger()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

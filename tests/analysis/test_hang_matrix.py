"""The hang rules over a generated matrix: never a wrong rank; how often "cannot tell" (printed, not
gated).

Every case is a simulated hang (tests/analysis/hang_runs.py) with one known
culprit: where it is stuck (in a span, between spans, before init, before
its sub-group's collective, before its send), the process-group layout
(default group only; tensor-parallel sub-groups; pipeline pairs), 2, 3, 8
and 64 ranks, the flight recorder on, as older writers left it (``legacy``)
or off, black boxes from every rank, from all but the culprit, or from none,
each read in full and with ``--tail``'s reader. The gate: no
suspect is ever a rank other than the culprit. The share of cases where
the analysis names no one is reported beside it.
"""

from __future__ import annotations

import itertools
import shutil
from collections import Counter
from pathlib import Path

from otel_titan.analysis import summarize_run
from otel_titan.analysis.model.collect import summarize_tails
from tests.analysis.hang_runs import FAULTS, LAYOUT_OF_FAULT, write_hang_run

WORLDS = (2, 3, 8, 64)
LAYOUTS = ("world", "tp", "pp")
RECORDERS = ("on", "legacy", "off")


#: Who wrote a black box: every rank; every rank but the culprit (its watchdog killed, its budget
#: spent); nobody (killed before any watchdog fired: the records alone cannot tell a hang from a
#: healthy job killed mid-step).
BOXES = ("all", "not the culprit", "none")


def cases():
    for fault, world, recorder, boxes in itertools.product(FAULTS, WORLDS, RECORDERS, BOXES):
        for layout in LAYOUT_OF_FAULT.get(fault, LAYOUTS):
            if fault == "before_init" and boxes == "not the culprit":
                continue
            if boxes == "none" and recorder != "on":
                continue  # without black boxes there is no recorder to vary
            yield fault, layout, world, recorder, boxes


def test_the_hang_rules_never_name_a_wrong_rank_over_the_matrix(tmp_path: Path):
    rules: Counter[str] = Counter()
    wrong: list[str] = []
    silent: list[str] = []
    total = 0
    for index, (fault, layout, world, recorder, boxes) in enumerate(cases()):
        run = tmp_path / f"case{index}"
        culprit = write_hang_run(
            run,
            layout,
            world,
            fault,
            recorder,
            seed=index,
            boxes=boxes != "none",
            culprit_box=boxes == "all",
        )
        for reader in (summarize_run, summarize_tails):
            total += 1
            report = reader(run).hang
            case = f"{fault}/{layout}/{world} ranks/fr {recorder}/boxes: {boxes}/{reader.__name__}: culprit {culprit}"
            assert report is not None, case
            named = {s.rank for s in report.suspects}
            rules.update(s.rule for s in report.suspects)
            if named - {culprit}:
                wrong.append(
                    f"{case}: named {sorted(named)}: "
                    + " | ".join(s.why for s in report.suspects if s.rank != culprit)
                )
            elif not named:
                assert report.verdict == "cannot tell", case
                silent.append(f"{case}: {report.notes[:1]}")
        shutil.rmtree(run)
    print(
        f"\n{total} cases: {len(wrong)} wrong-rank verdicts; cannot tell in {len(silent)} "
        f"({100 * len(silent) / total:.1f} %)"
    )
    print("  rules that named the culprit:", dict(rules.most_common()))
    for line in silent[:20]:
        print("  cannot tell:", line)
    assert not wrong, "\n".join(wrong[:20])
    # Where the others' black boxes show them waiting, the evidence is there: only the cases without
    # any black box are silent (a rank missing its file is still named: "missing" needs no black
    # box).
    assert all("boxes: none" in line for line in silent), "\n".join(
        line for line in silent if "boxes: none" not in line
    )

"""What stall detection costs: otel-titan with the watchdog and faulthandler on (the default)
against off, in one run.

The watchdog lives on the processor thread, which already sees every span's
end: the training thread does nothing more. This measures that claim the way
`make bench` measures everything: each measurement is a fresh process
(`benchmarks.span_cost`, case ``otel_titan``), the two settings interleaved
round by round, medians of the caller's time per span and of the whole
process's CPU per span (writer thread included), and their ratio.

    python -m benchmarks.stall_watchdog [--rounds 7] [--spans 20000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from benchmarks.run import _progress, _python

SETTINGS = {"on": {"OTEL_TITAN_STALL_AFTER_S": "120"}, "off": {"OTEL_TITAN_STALL_AFTER_S": "0"}}


def measure(rounds: int, spans: int) -> dict:
    """Interleaved rounds of both settings; medians and on/off ratios."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {"caller_us": [], "cpu_us": []} for name in SETTINGS
    }
    for index in range(rounds):
        for name, env in SETTINGS.items():
            if sys.stderr.isatty():
                _progress(f"stall watchdog: round {index + 1}/{rounds}, {name}")
            result = _python(
                "benchmarks.span_cost", "otel_titan", "--spans", str(spans), "--reps", "3", env=env
            )
            for metric in ("caller_us", "cpu_us"):
                samples[name][metric].extend(result[metric])
    medians = {
        name: {metric: statistics.median(values) for metric, values in metrics.items()}
        for name, metrics in samples.items()
    }
    return {
        "rounds": rounds,
        "spans": spans,
        "median": medians,
        "ratio_on_off": {
            metric: medians["on"][metric] / medians["off"][metric]
            for metric in ("caller_us", "cpu_us")
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=7, help="interleaved rounds of both settings (default 7)"
    )
    parser.add_argument(
        "--spans", type=int, default=20000, help="spans per measurement (default 20000)"
    )
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    results = measure(args.rounds, args.spans)
    m, r = results["median"], results["ratio_on_off"]
    print("| stall detection | caller µs/span | CPU µs/span (all threads) |\n| --- | --- | --- |")
    for name in ("off", "on"):
        print(f"| {name} | {m[name]['caller_us']:.2f} | {m[name]['cpu_us']:.2f} |")
    print(f"| on / off | {r['caller_us']:.3f} | {r['cpu_us']:.3f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()

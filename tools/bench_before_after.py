#!/usr/bin/env python3
"""Before/after table of two builds of the `spconv` tool, measured side by side.

    tools/bench_before_after.py --before OLD/spconv --after build/tools/spconv \\
        [--net basic] [--input ../shared/data] [--threads 2] [--rounds 5] [--repeat 3] \\
        [--backward [--input-grad]] [--peak-every-run]

Each round runs `spconv bench --json` once with each tool, alternating which goes first, so that
both see the same machine; every timed pass of every round is kept. The table gives, per phase and
per layer kind, the median over all passes of the per-pass sum, for both builds and their ratio,
plus the wall time and, once, the sgemm peak of the machine measured by the after-build in the
same session (its GEMM floor: the pass's GFLOP over that peak). On a machine whose speed drifts
that one peak may come from a faster or slower minute than the passes: --peak-every-run has every
run measure the peak right before its passes, and adds each build's median over its passes of
wall / (GFLOP / that run's peak). Python 3 standard library only.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

PHASES = ["rulebook", "gather", "gemm", "scatter", "other", "total"]


def run_bench(tool, args, json_path, peak_size):
    cmd = [tool, "bench", "--net", args.net, "--repeat", str(args.repeat), "--warmup",
           str(args.warmup), "--threads", str(args.threads), "--peak-size", str(peak_size),
           "--json", json_path]
    if args.input:
        cmd += ["--input", args.input]
    if args.backward:
        cmd += ["--backward"]
    if args.input_grad:
        cmd += ["--input-grad"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(json_path) as f:
        return json.load(f)


def collect(results, direction):
    """Per-pass sums per phase, per layer kind and phase, and wall times, over all runs."""
    phases = {p: [] for p in PHASES}
    kinds = {}
    walls = []
    for r in results:
        passes = r["passes"][direction]["per_pass"]
        for rep, p in enumerate(passes):
            walls.append(p["wall_ms"])
            for ph in PHASES:
                phases[ph].append(p["phases_ms"][ph])
        key = "forward_ms_per_pass" if direction == "forward" else "backward_ms_per_pass"
        reps = len(passes)
        per_kind = {}
        for layer in r["layers"]:
            per_kind.setdefault(layer["kind"], [[0.0] * reps for _ in PHASES])
            for i, ph in enumerate(PHASES):
                for rep, v in enumerate(layer[key][ph]):
                    per_kind[layer["kind"]][i][rep] += v
        for kind, sums in per_kind.items():
            slot = kinds.setdefault(kind, {p: [] for p in PHASES})
            for i, ph in enumerate(PHASES):
                slot[ph].extend(sums[i])
    return phases, kinds, walls


def own_floor_ratios(results, direction, gflop):
    """Every pass's wall time over the GEMM floor at its own run's sgemm peak, and the peaks."""
    ratios, peaks = [], []
    for r in results:
        peak = r.get("sgemm_peak_gflops")
        if not peak:
            continue
        peaks.append(peak)
        floor = gflop / peak * 1e3
        ratios.extend(p["wall_ms"] / floor for p in r["passes"][direction]["per_pass"])
    return ratios, peaks


def med(values):
    return statistics.median(values) if values else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--net", default="basic")
    ap.add_argument("--input", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--backward", action="store_true")
    ap.add_argument("--input-grad", action="store_true",
                    help="with --backward, the first layer's input gradient too (both tools must "
                         "have the option)")
    ap.add_argument("--peak-size", type=int, default=2048)
    ap.add_argument("--peak-every-run", action="store_true",
                    help="measure the sgemm peak in every run and set each pass against its own "
                         "run's peak")
    args = ap.parse_args()

    before, after = [], []
    peak = None
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            order = [("before", args.before), ("after", args.after)]
            if rnd % 2:
                order.reverse()
            for name, tool in order:
                want_peak = args.peak_every_run or (name == "after" and peak is None)
                r = run_bench(tool, args, os.path.join(tmp, f"{name}{rnd}.json"),
                              args.peak_size if want_peak else 0)
                if want_peak and name == "after" and peak is None:
                    peak = r.get("sgemm_peak_gflops")
                (before if name == "before" else after).append(r)
            print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr)

    directions = ["forward"] + (["backward"] if args.backward else [])
    cfg = after[0]["config"]
    print(f"# {args.net} on {cfg['input']} ({cfg['sites']} sites), {args.threads} threads, "
          f"{args.rounds} interleaved rounds x {args.repeat} passes; medians over all passes, ms")
    if peak:
        print(f"sgemm peak (after-build, this session): {peak:.1f} GFLOP/s")
    for d in directions:
        pb, kb, wb = collect(before, d)
        pa, ka, wa = collect(after, d)
        gflop = after[0]["passes"][d]["gflop"]
        print(f"\n## {d}: {gflop:.2f} GFLOP per pass")
        print("| | before | after | after / before |")
        print("|---|---|---|---|")
        print(f"| wall | {med(wb):.1f} | {med(wa):.1f} | {med(wa) / med(wb):.2f} |")
        for ph in PHASES:
            print(f"| phase {ph} | {med(pb[ph]):.1f} | {med(pa[ph]):.1f} | "
                  f"{med(pa[ph]) / med(pb[ph]) if med(pb[ph]) > 0 else float('nan'):.2f} |")
        for kind in sorted(set(kb) | set(ka)):
            for ph in ["total", "rulebook", "gemm", "other"]:
                b = med(kb.get(kind, {}).get(ph, []))
                a = med(ka.get(kind, {}).get(ph, []))
                ratio = a / b if b and b > 0 else float("nan")
                print(f"| {kind} {ph} | {b:.1f} | {a:.1f} | {ratio:.2f} |")
        if peak:
            floor = gflop / peak * 1e3
            print(f"| GEMM floor ({gflop:.2f} GFLOP / peak) | {floor:.1f} | {floor:.1f} | |")
            print(f"| wall / floor | {med(wb) / floor:.2f} | {med(wa) / floor:.2f} | |")
        if args.peak_every_run:
            rb, peaks_b = own_floor_ratios(before, d, gflop)
            ra, peaks_a = own_floor_ratios(after, d, gflop)
            print(f"| wall / its run's floor (median of passes) | {med(rb):.2f} | {med(ra):.2f} | "
                  f"{med(ra) / med(rb):.2f} |")
            print(f"| sgemm peak of the runs, GFLOP/s (min-max) | {min(peaks_b):.1f}-"
                  f"{max(peaks_b):.1f} | {min(peaks_a):.1f}-{max(peaks_a):.1f} | |")


if __name__ == "__main__":
    main()

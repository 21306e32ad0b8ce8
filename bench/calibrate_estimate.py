#!/usr/bin/env python3
"""Calibrate `labctl estimate` on the lab: ring and hierarchical collectives at 8 to 64 ranks.

Each lab below is built from templates/leaf-spine, each workload run with the kernel's ECMP
choices traced (so the model predicts the run, not a draw), and the model then fitted on all the
runs. The fit and every sample's leave-one-out error are printed and written to
labctl/estimate/calibration.json, which `labctl estimate` reads. About 8 minutes. Run as root:

    sudo .venv/bin/python bench/calibrate_estimate.py [--out labctl/estimate/calibration.json]
    .venv/bin/python bench/calibrate_estimate.py --refit DIR    # fit again on the runs a previous one kept in DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl import lifecycle as labmod  # noqa: E402
from labctl.estimate import calibration, labrun  # noqa: E402
from labctl.traffic.run import run_workload  # noqa: E402
from labctl.traffic.workload import load_workload  # noqa: E402

# (label, template variables, [(collective, size, options)]). Every lab is network-bound: its dilation
# keeps all agents together below this machine's packet rate (about 800 Mbit/s of lab traffic on 2
# cores), and where NVLink would be 9x the NIC, the lab's nvlink_rate is lowered for the same reason.
LABS = [
    ("8 ranks, NVLink, D=4000", [], [("all_reduce", "16MB", ""), ("reduce_scatter", "16MB", ""),
                                     ("all_gather", "16MB", ""), ("all_reduce", "64MB", "")]),
    ("8 ranks, no NVLink, D=4000", ["scale_up=false"],
     [("all_reduce", "16MB", "{qps: 1, sport: fixed}"), ("all_reduce", "16MB", "{qps: 4}"),
      ("all_reduce", "16MB", "{qps: 8}")]),
    ("8 ranks, NVLink at 400G, D=8000", ["nvlink_rate=400G", "dilation=8000"],
     [("hier_all_reduce", "16MB", ""), ("all_reduce", "16MB", "")]),
    ("16 ranks, D=8000", ["servers=4", "spines=4", "dilation=8000"], [("all_reduce", "16MB", "")]),
    ("32 ranks, D=16000", ["servers=32", "gpus_per_server=1", "spines=8", "scale_up=false", "dilation=16000"],
     [("all_reduce", "4MB", "")]),
    ("64 ranks, D=32000", ["servers=64", "gpus_per_server=1", "spines=16", "scale_up=false", "dilation=32000"],
     [("all_reduce", "4MB", ""), ("reduce_scatter", "4MB", "")]),
    ("64 ranks, 8 servers x 8, NVLink at 800G, D=128000",
     ["servers=8", "gpus_per_server=8", "leaves=8", "spines=4", "nvlink_rate=800G", "dilation=128000"],
     [("hier_all_reduce", "4MB", ""), ("all_reduce", "1MB", "")]),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(calibration.BUNDLED))
    ap.add_argument("--refit", metavar="DIR", help="no lab: fit on the runs a previous calibration kept in DIR")
    args = ap.parse_args()
    if args.refit:
        labels = json.loads((Path(args.refit) / "labels.json").read_text())
        samples = [dict(s, run=label) for run, label in labels.items() for s in labrun.samples(Path(args.refit) / run)]
        report(samples, Path(args.out), f"bench/calibrate_estimate.py --refit {args.refit}, {time.strftime('%Y-%m-%d')}")
        return
    if os.geteuid() != 0:
        sys.exit("bench/calibrate_estimate.py builds namespaces: run it as root")
    os.environ["LABCTL_STATE_DIR"] = tempfile.mkdtemp(prefix="labctl-bench-")
    tmp = Path(tempfile.mkdtemp(prefix="labctl-bench-runs-"))
    print(f"# runs kept in {tmp} (--refit {tmp} fits on them again)")
    samples, labels = [], {}
    for label, sets, runs in LABS:
        t0 = time.perf_counter()
        plan, lab, _ = labmod.up(str(ROOT / "topologies" / "leaf-spine.yml"), sets, name="bcal")
        print(f"# {label}: up in {time.perf_counter() - t0:.1f} s", flush=True)
        try:
            for k, (coll, size, opts) in enumerate(runs):
                wf = tmp / f"w{len(samples)}-{k}.yml"
                wf.write_text(f"name: {coll}-{size.lower()}\ncollective: {coll}\nsizes: [{size}]\nparticipants: all\n"
                              + (f"options: {opts}\n" if opts else ""))
                out = tmp / f"run{len(samples):02d}"
                doc = run_workload(plan, lab, load_workload(wf), out, trace=labmod.trace_path)
                wrong = sum(r["wrong"] for r in doc["results"])
                labels[out.name] = f"{label}: {coll} {size} {opts}".strip()
                (tmp / "labels.json").write_text(json.dumps(labels, indent=1))
                for s in labrun.samples(out):
                    s["run"] = labels[out.name]
                    samples.append(s)
                    print(f"  {coll:>15} {size:>5} {opts or '':<24} measured {s['measured_s']:7.2f} s, bound "
                          f"{s['lab_ideal_s']:6.2f} s, #wrong {wrong}", flush=True)
        finally:
            labmod.down("bcal")
    report(samples, Path(args.out), f"bench/calibrate_estimate.py, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs")


def report(samples: list[dict], out: Path, provenance: str) -> None:
    result = calibration.evaluate(samples)
    for r in result["rows"]:
        print(f"{r['run']:<70} measured {r['measured_s']:7.2f} s  model {r['predicted_s']:7.2f} s  "
              f"fit {r['fit_error']:+6.1%}  leave-one-out {r['loo_error']:+6.1%}")
    p = result["params"]
    print(f"eta {p['eta']:.3f}, kappa {p['kappa_s'] * 1e3:.3f} ms per step per agent; leave-one-out error max "
          f"{result['max_error']:.1%}, mean {result['mean_error']:.1%}")
    calibration.save(result, samples, out, provenance)
    print(f"written: {out}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One machine vs three: the bundled BGP leaf-spine on this host, and the same lab spread over
three machines emulated here (labctl cluster emulate), side by side in one run.

Both copies are up at once, both with a switch agent in each node (LABCTL_SWITCH_AGENTS=node on
one machine; a placed lab always has them), so the difference is the placement alone: on three
machines every node is a Swarm service's container and each GPU uplink a VXLAN between machines.
The runs interleave, so whatever else the machine does falls on both alike. Per run: the
collective's time and ratio to the α-β bound, what was wrong or lost, the agents' reaction, and
the kernel's CE marks, pauses and drops. Once per variant: the time `up` took. Prints the medians
and the three/one ratios. Starts the emulated machines if none run, and stops them again. As root:

    sudo .venv/bin/python bench/cluster_placement.py [--runs 5] [--workload workloads/incast.yml]
"""
from __future__ import annotations

import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labctl.traffic.workload import load_workload  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from sidebyside import arguments, measured_run, print_medians  # noqa: E402

VARIANTS = ("three", "one")     # printed as three / one
LAB = ROOT / "topologies" / "leaf-spine-bgp.yml"


def main() -> None:
    args = arguments(__doc__)
    from labctl import backends, state
    from labctl import lifecycle as labmod
    from labctl.cluster import emulate
    from labctl.dataplane import agents
    os.environ.setdefault("LABCTL_STATE_DIR", tempfile.mkdtemp(prefix="labctl-bench-"))
    started = not emulate.status()
    if started:
        emulate.start(3)
    from labctl.cluster import images, machines
    src, engine_started = images.default_images_client(["labctl/host", "labctl/frr"])
    try:
        for m in machines.load().values():
            images.ensure_images(m, ["labctl/host", "labctl/frr"], src)
    finally:
        src.close()
    names = {v: f"lb{v[0]}{uuid.uuid4().hex[:5]}" for v in VARIANTS}
    hosts = {"three": ["m1", "m2", "m3"], "one": None}
    workload = load_workload(Path(args.workload))
    plans, once = {}, {}
    try:
        os.environ[agents.ENV] = "node"
        for v in VARIANTS:
            plans[v], _, up_s = labmod.up(str(LAB), (), names[v], hosts=hosts[v])
            once[v] = {"up_s": up_s}
        rows = {v: [] for v in VARIANTS}
        with tempfile.TemporaryDirectory() as tmp:
            for k in range(args.runs):
                for v in VARIANTS:
                    row = measured_run(plans[v], state.lab_dir(names[v]), workload, Path(tmp) / f"{v}{k}")
                    rows[v].append(row)
                    print(v, k, {f: round(x, 3) if isinstance(x, float) else x for f, x in row.items()}, flush=True)
        print_medians(rows, once, VARIANTS, f"median of {args.runs} runs each ({Path(args.workload).name} on the "
                      "BGP leaf-spine: over three emulated machines / on this one)")
    finally:
        for name in names.values():
            if state.lab_dir(name).path.exists():
                backends.get("netns").destroy(state.lab_dir(name))
        images.release_default(engine_started)
        if started:
            emulate.stop()


if __name__ == "__main__":
    main()

"""Plan every containerlab file under a directory (e.g. a checkout of containerlab's lab-examples)
as a user would: as written first, then adding the `--kind-map KIND=frr` that each error suggests,
until the file plans or fails for another reason. Prints one line per file (and whether `up` would
ask for --trust) and a tally.

    python bench/clab_examples.py PATH/TO/containerlab/lab-examples

No root and no lab is built: this is `labctl plan` in a loop.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from labctl.errors import InputError
from labctl.plan import trust
from labctl.plan.compile import compile_plan
from labctl.topology.clabmaps import parse
from labctl.topology.load import load_topology

SUGGESTED = re.compile(r"--kind-map ([a-z0-9_-]+)=frr")


def plan_with_suggestions(path: Path) -> tuple[str, list[str], str]:
    """('as written' | 'with kind map' | 'refused', the kind maps used, what happened)."""
    kinds: list[str] = []
    while True:
        try:
            loaded = load_topology(path, maps=parse(kinds))
            p = compile_plan(loaded)
            how = "with kind map" if kinds else "as written"
            # `up` also asks for --trust where the file has powerful lines (binds, foreign images)
            # and is not root's alone, as a checkout often is not
            powerful = trust.powerful(loaded)
            trusted = f"; up needs --trust ({len(powerful)} powerful lines)" if powerful and trust.untrusted(loaded) \
                else ""
            return how, kinds, f"{len(p.nodes)} nodes, {len(p.links)} links{trusted}"
        except InputError as exc:
            m = SUGGESTED.search(exc.fix or "")
            if not m or f"{m.group(1)}=frr" in kinds:
                return "refused", kinds, str(exc).splitlines()[0][:160]
            kinds.append(f"{m.group(1)}=frr")


def main(root: str) -> int:
    files = sorted(p for p in Path(root).rglob("*.clab.y*ml"))
    tally: dict[str, int] = {}
    for f in files:
        how, kinds, what = plan_with_suggestions(f)
        tally[how] = tally.get(how, 0) + 1
        maps = " ".join(f"--kind-map {k}" for k in kinds)
        print(f"{how:14} {f.relative_to(root)}  {maps}  -> {what}")
    print(", ".join(f"{n} {how}" for how, n in tally.items()), f"of {len(files)} files")
    return 0 if "refused" not in tally else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))

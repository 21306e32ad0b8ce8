#!/usr/bin/python3
"""Read a Mininet topology (the `topos = {'name': MyTopo}` of `mn --custom`, or one of Mininet's
own: single,N  linear,K[,N]  tree,DEPTH[,FANOUT]) and print it as JSON for labctl.

It runs under the system Python (Debian's mininet imports only there) and imports nothing of
labctl. Loading a custom file runs its Python, so labctl runs this only when asked to with
`--topo` (never for a .yml), in a process of its own:

    python3 mininet_topo.py FILE.py|- NAME[,ARGS]
    {"hosts": ["h1", ...], "switches": ["s1", ...],
     "links": [{"a": "h1", "b": "s1", "bw": 10, "delay": "5ms", "loss": 1}, ...]}
"""
import json
import runpy
import sys


def topo_class(source, name):
    """`topos[name]` as `mn --custom` finds it, else a Topo subclass of that name in the file (so that
    Mininet's examples, which define classes without a `topos`, load too), else one of Mininet's own."""
    from mininet.topo import LinearTopo, SingleSwitchTopo, Topo
    from mininet.topolib import TreeTopo
    known = {"single": SingleSwitchTopo, "linear": LinearTopo, "tree": TreeTopo}
    if source != "-":
        module = runpy.run_path(source)
        known.update({k: v for k, v in module.items()
                      if isinstance(v, type) and issubclass(v, Topo) and v.__module__ == "<run_path>"})
        topos = module.get("topos")
        if isinstance(topos, dict):
            known.update(topos)
    if name not in known:
        raise SystemExit(f"no topology {name!r} in {source}: there are {', '.join(sorted(known))}")
    return known[name]


def main():
    source, spec = sys.argv[1], sys.argv[2]
    from mininet.util import splitArgs
    name, args, kwargs = splitArgs(spec)          # as `mn --topo NAME,ARG,KEY=VALUE` reads it
    topo = topo_class(source, name)(*args, **kwargs)
    links = []
    for a, b, info in topo.links(sort=True, withInfo=True):
        link = {"a": a, "b": b}
        for key in ("bw", "delay", "loss", "jitter"):
            if info.get(key) is not None:
                link[key] = info[key]
        links.append(link)
    print(json.dumps({"hosts": topo.hosts(sort=True), "switches": topo.switches(sort=True), "links": links}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Read a Mininet topology (the `topos = {'name': MyTopo}` of `mn --custom`, or one of Mininet's
own: single,N  linear,K[,N]  tree,DEPTH[,FANOUT]) and print it as JSON for labctl.

It runs under the system Python (Debian's mininet imports only there) and imports nothing of
labctl. A custom file's source comes on stdin (labctl opened and checked the file once: nothing
here opens the path again), and running it runs its Python, so labctl does this only when asked
to with `--topo` (never for a .yml), in a process of its own:

    python3 mininet_topo.py PATH|- NAME[,ARGS] < SOURCE
    {"hosts": ["h1", ...], "switches": ["s1", ...],
     "links": [{"a": "h1", "b": "s1", "bw": 10, "delay": "5ms", "loss": 1}, ...],
     "ignored": {"r0": ["cls", "ip"], ...}}
    or {"error": "ValueError: ...", "line": 12}, or {"mininet": "ModuleNotFoundError: ..."}

PATH only names the file in tracebacks. The file's own output (print, logging to stdout) goes to
stderr, so that it reaches the user as `mn --custom` would show it, and the JSON alone, written
by this process and not by any it forked, is on stdout.
"""
import importlib
import json
import os
import sys
import traceback

# what labctl carries over from a link's options; a node's options it does not (their names are reported)
LINK_KEYS = ("bw", "delay", "loss", "jitter")
CARRIED_LINK_CLASSES = ("Link", "TCLink", "TCULink")      # what LINK_KEYS (and a veth) carry whole
NODE_KEYS_READ = ("isSwitch",)


def topo_class(path, source, name):
    """`topos[name]` as `mn --custom` finds it, else a Topo subclass of that name in the file (so that
    Mininet's examples, which define classes without a `topos`, load too), else one of Mininet's own."""
    from mininet.topo import LinearTopo, SingleSwitchTopo, Topo
    from mininet.topolib import TreeTopo
    known = {"single": SingleSwitchTopo, "linear": LinearTopo, "tree": TreeTopo}
    if path != "-":
        # as runpy.run_path would: __name__ is not "__main__", so a script's main part does not run
        module = {"__name__": "<run_path>", "__file__": path, "__builtins__": __builtins__}
        exec(compile(source, path, "exec"), module)
        known.update({k: v for k, v in module.items()
                      if isinstance(v, type) and issubclass(v, Topo) and v.__module__ == "<run_path>"})
        topos = module.get("topos")
        if isinstance(topos, dict):
            known.update(topos)
    if name not in known:
        raise LookupError(f"no topology {name!r} in {'Mininet' if path == '-' else path}: there are "
                          f"{', '.join(sorted(map(str, known)))}")
    return known[name]


def read(path, source, spec):
    from mininet.util import splitArgs
    name, args, kwargs = splitArgs(spec)          # as `mn --topo NAME,ARG,KEY=VALUE` reads it
    topo = topo_class(path, source, name)(*args, **kwargs)
    links = []
    for a, b, info in topo.links(sort=True, withInfo=True):
        link = {"a": a, "b": b}
        for key in LINK_KEYS:
            if info.get(key) is not None:
                link[key] = info[key]
        # a TCLink's bw, delay and loss are what LINK_KEYS carry: its class is no loss
        dropped = sorted(str(k) for k, v in info.items()
                         if k not in LINK_KEYS + ("node1", "node2", "port1", "port2") and v is not None
                         and not (k == "cls" and getattr(v, "__name__", "") in CARRIED_LINK_CLASSES))
        if dropped:
            link["ignored"] = dropped
        links.append(link)
    ignored = {}
    for node in topo.nodes(sort=True):
        keys = sorted(str(k) for k, v in topo.nodeInfo(node).items() if k not in NODE_KEYS_READ and v is not None)
        if keys:
            ignored[node] = keys
    return {"hosts": topo.hosts(sort=True), "switches": topo.switches(sort=True), "links": links,
            "ignored": ignored}


def main():
    path, spec = sys.argv[1], sys.argv[2]
    source = sys.stdin.buffer.read() if path != "-" else b""
    me = os.getpid()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                 # the file's own prints go to stderr; the JSON alone to `out`
    sys.stdout = sys.stderr
    sys.stdin = open(os.devnull)  # an input() in the file reads nothing
    try:
        for module in ("mininet.topo", "mininet.topolib", "mininet.util"):   # before the file: not its fault
            importlib.import_module(module)
    except BaseException as exc:
        doc = {"mininet": f"{type(exc).__name__}: {exc}"}
    else:
        try:
            doc = read(path, source, spec)
        except SystemExit as exc:     # a file that calls exit() while labctl reads it
            doc = {"error": f"the file called exit({exc.code!r}) while it was read"}
        except BaseException as exc:  # the file's own error: its deepest line in the file, for a located message
            line = None
            if isinstance(exc, SyntaxError) and exc.filename == path:
                line = exc.lineno
            for frame in traceback.extract_tb(exc.__traceback__):
                if frame.filename == path:
                    line = frame.lineno
            doc = {"error": f"{type(exc).__name__}: {exc}", "line": line}
    if os.getpid() != me:
        os._exit(0)               # a child the file forked, leaving through here: the answer is not its
    try:
        text = json.dumps(doc)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"error": f"the topology holds what labctl cannot read: {exc}"})
    out.write(text)
    out.flush()


if __name__ == "__main__":
    main()

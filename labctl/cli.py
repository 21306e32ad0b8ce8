"""The labctl command line: a thin layer over lab.py, topology/ and plan/."""
from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console
from rich.table import Table

from labctl import __version__
from labctl.errors import LabError

out = Console()
err = Console(stderr=True)

SET_HELP = "override a template variable (or a dotted key of a plain lab), e.g. --set spines=4; repeatable"
TEMPLATES_HELP = "a directory of your own templates, searched before the bundled ones; repeatable"


class LabctlGroup(click.Group):
    """Prints LabError as a one-line message with its fix, and exits with its code (2 for bad input)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LabError as exc:
            print(f"error: {exc}", file=sys.stderr)
            ctx.exit(exc.exit_code)


@click.group(cls=LabctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="labctl")
def cli():
    """Build a miniature AI-training network from Linux namespaces and watch traffic on it.

    \b
    Quick start (as root):
      labctl up topologies/leaf-spine.yml      # 2 spines, 4 leaves, 8 GPU hosts
      labctl status ls                         # nodes, ports, addresses, link state
      labctl exec srv1-gpu0 -- ping -c1 10.1.0.29
      labctl route srv1-gpu0 srv2-gpu1 --sport 49152   # which spine this flow takes
      labctl down ls
    """


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
def render(file, sets, template_dirs):
    """Print the full lab YAML a file expands to (its template rendered with its vars).

    \b
    Example:
      labctl render topologies/leaf-spine.yml --set spines=4 --set rail_optimised=false
    """
    from labctl.topology.load import render_topology
    text, _, _ = render_topology(file, sets, template_dirs)
    click.echo(text, nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--name", help="the lab name (default: the file's name:)")
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the whole plan as JSON (what `up` would build)")
def plan(file, sets, name, template_dirs, as_json):
    """Compile a lab into its concrete plan without building it (no root needed).

    Shows every namespace, port, address and route; --json prints everything, including MACs,
    ifindexes, sysctls and per-port shaping.

    \b
    Example:
      labctl plan topologies/leaf-spine.yml
      labctl plan topologies/leaf-spine.yml --json | jq '.nodes[] | select(.name=="leaf1").routes'
    """
    from labctl.plan.compile import compile_plan
    from labctl.topology.load import load_topology
    from labctl.units import format_rate
    p = compile_plan(load_topology(file, sets, template_dirs, name))
    if as_json:
        click.echo(json.dumps(p.to_dict(), indent=1))
        return
    t = Table(title=f"lab {p.lab}: {len(p.nodes)} nodes, {len(p.links)} links, dilation {p.dilation:g}")
    for col in ("node", "kind", "namespace", "ports", "addresses", "routes"):
        t.add_column(col)
    for n in p.nodes:
        t.add_row(n.name, n.kind, n.namespace, ", ".join(i.name for i in n.interfaces),
                  ", ".join([i.address for i in n.interfaces] + ([n.loopback] if n.loopback else [])),
                  str(len(n.routes)))
    out.print(t)
    lt = Table(title="links")
    for col in ("a", "b", "fabric", "subnet", "rate (real)", "rate (lab)"):
        lt.add_column(col)
    for lk in p.links:
        lt.add_row(lk.a, lk.b, lk.fabric, lk.subnet, format_rate(lk.rate_bps), format_rate(lk.lab_rate_bps))
    out.print(lt)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--name", help="the lab name (default: the file's name:); two names make two independent labs")
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
def up(file, sets, name, template_dirs):
    """Build a lab: namespaces, veth links, addresses, ECMP routes and shaping.

    Every node becomes a namespace <lab>-<node>, so plain `ip netns exec <lab>-<node> ...` works
    too. If anything fails half-way, what was made is removed again.

    \b
    Example:
      sudo labctl up topologies/leaf-spine.yml
      sudo labctl up topologies/leaf-spine.yml --name ls2 --set spines=4
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from labctl import lab as labmod
    from labctl.units import format_rate

    with Progress(TextColumn("{task.description:<12}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not sys.stderr.isatty()) as bar:
        tasks = {}

        def progress(stage, done, total):
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        p, lab, elapsed = labmod.up(file, sets, name, template_dirs, progress=progress)
    kinds: dict[str, int] = {}
    for n in p.nodes:
        kinds[n.kind] = kinds.get(n.kind, 0) + 1
    t = Table(title=f"lab {p.lab} is up ({elapsed * 1000:.0f} ms)", show_header=True)
    t.add_column("what")
    t.add_column("count / value")
    for k, v in kinds.items():
        t.add_row(f"{k} nodes", str(v))
    t.add_row("links", str(len(p.links)))
    t.add_row("routes", str(sum(len(n.routes) for n in p.nodes)))
    t.add_row("fabrics", ", ".join(f"{f} ({fp.kind})" for f, fp in p.fabrics.items()))
    rates = sorted({lk.lab_rate_bps for lk in p.links})
    t.add_row("link rates in the lab", ", ".join(format_rate(r) for r in rates) + f"  (dilation {p.dilation:g})")
    t.add_row("lab record", str(lab.path))
    out.print(t)
    first = next((n for n in p.nodes if n.kind == "gpu"), p.nodes[0])
    out.print(f"next: labctl status {p.lab} | labctl exec {first.name} -- ip route | labctl down {p.lab}",
              highlight=False)


@cli.command()
@click.argument("lab")
def down(lab):
    """Tear a lab down: stop its processes, delete its namespaces (and with them every link).

    Works from the lab's record alone, so the topology file may be gone. LAB is a lab name or the
    file it was built from.

    \b
    Example:
      sudo labctl down ls
    """
    from labctl import lab as labmod
    removed = labmod.down(lab)
    out.print(f"lab {lab}: removed {len(removed)} namespaces", highlight=False)


@cli.command()
@click.argument("lab", required=False)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def status(lab, as_json):
    """Show running labs, or one lab's nodes, ports, addresses, link state and counters.

    \b
    Example:
      labctl status            # every lab
      labctl status ls --json  # one lab, with per-port counters
    """
    from labctl import lab as labmod
    from labctl import state
    if lab is None:
        labs = [{"lab": d.name, **{k: d.read_state().get(k) for k in ("status", "topology_file", "pid")}}
                for d in state.all_labs()]
        if as_json:
            click.echo(json.dumps(labs, indent=1))
            return
        if not labs:
            out.print("no labs (labctl up FILE builds one)")
            return
        t = Table(title="labs")
        for col in ("lab", "status", "topology file"):
            t.add_column(col)
        for d in labs:
            t.add_row(d["lab"], str(d["status"]), str(d["topology_file"]))
        out.print(t)
        return
    s = labmod.status(labmod.find_lab(lab))
    if as_json:
        click.echo(json.dumps(s, indent=1))
        return
    t = Table(title=f"lab {s['lab']} ({s['status']}), built from {s['topology_file']}")
    for col in ("node", "kind", "port", "address", "peer", "state", "tx bytes", "rx bytes"):
        t.add_column(col)
    for n in s["nodes"]:
        first = True
        for p in n["interfaces"]:
            t.add_row(n["name"] if first else "", n["kind"] if first else "", p["name"], p["address"], p["peer"],
                      p["state"] if n["present"] else "[red]missing[/]", str(p.get("tx_bytes", "")),
                      str(p.get("rx_bytes", "")))
            first = False
    out.print(t)


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
def exec_(node, command, lab_name):
    """Run a command inside a node's namespace (like `ip netns exec <lab>-<node> ...`).

    \b
    Example:
      sudo labctl exec srv1-gpu0 -- ping -c 3 10.1.0.29
      sudo labctl exec leaf1 --lab ls -- ip -s link
    """
    from labctl import lab as labmod
    labmod.require_root("labctl exec")
    lab = labmod.default_lab(lab_name)
    p = labmod.load_plan(lab)
    try:
        ns = p.node(node).namespace
    except KeyError:
        raise LabError(f"lab {p.lab!r} has no node {node!r}", "`labctl status " + p.lab + "` lists the nodes")
    argv = ["ip", "netns", "exec", ns, *command]
    os.execvp("ip", argv)  # an argv list: nothing the user typed goes through a shell


@cli.command()
@click.argument("source", metavar="FILE|LAB")
@click.option("--format", "fmt", type=click.Choice(["dot", "mermaid"]), default="dot", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
def graph(source, fmt, sets):
    """Draw a lab as Graphviz dot or Mermaid (from a topology file, or a running lab's record).

    \b
    Example:
      labctl graph topologies/leaf-spine.yml | dot -Tpng > fabric.png
      labctl graph ls --format mermaid
    """
    from labctl import graph as graphmod
    click.echo(graphmod.render_graph(graphmod.plan_from(source, sets), fmt), nl=False)


@cli.command()
@click.argument("node")
@click.argument("dest")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
@click.option("--sport", type=click.IntRange(0, 65535), default=49152, show_default=True,
              help="UDP source port of the flow (RoCEv2 derives it from the QP pair)")
@click.option("--dport", type=click.IntRange(0, 65535), default=4791, show_default=True,
              help="UDP destination port (4791 = RoCEv2)")
def route(node, dest, lab_name, sport, dport):
    """Show the path a UDP flow takes, hop by hop, as the kernel's ECMP hash decides it.

    DEST is a node name or an address. Try several --sport values to see flows spread over spines.

    \b
    Example:
      sudo labctl route srv1-gpu0 srv2-gpu1 --sport 49152
      sudo labctl route srv1-gpu0 srv2-gpu1 --sport 49153
    """
    from labctl import lab as labmod
    p = labmod.load_plan(labmod.default_lab(lab_name))
    hops = labmod.trace_path(p, node, dest, sport, dport)
    path = " -> ".join(h["node"] + (f" ({h['out']})" if h["out"] else "") for h in hops)
    click.echo(f"udp sport {sport} dport {dport}: {path}")


@cli.command()
@click.argument("workload", type=click.Path(dir_okay=False))
@click.option("--lab", "lab_name", help="the lab to run on (needed when several are up)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="run directory (default runs/<time>-<name>)")
@click.option("--json", "as_json", is_flag=True, help="print results.json instead of the table")
def run(workload, lab_name, out_dir, as_json):
    """Play a workload (collectives or an FSDP step) on a running lab and report like nccl-tests.

    Starts one agent per GPU inside its namespace; they send RoCEv2 (UDP 4791) to each other with
    real data dependencies, and every byte is accounted at the receivers. Results, the plan and the
    workload go to the run directory.

    \b
    Example:
      sudo labctl run workloads/allreduce.yml --lab ls
      sudo labctl run workloads/fsdp-llama7b.yml --out runs/fsdp
    """
    from pathlib import Path
    from labctl import lab as labmod
    from labctl.traffic import report
    from labctl.traffic.run import default_run_dir, run_workload
    from labctl.traffic.workload import load_workload
    loaded = load_workload(workload)
    labmod.require_root("labctl run")
    lab = labmod.default_lab(lab_name)
    plan = labmod.load_plan(lab)
    target = Path(out_dir) if out_dir else default_run_dir(loaded.workload.name)

    def progress(done, total, label):
        if sys.stderr.isatty():
            print(f"\r  {done}/{total} {label:<60}", end="", file=sys.stderr, flush=True)

    doc = run_workload(plan, lab, loaded, target, progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if as_json:
        click.echo(json.dumps(doc, indent=1))
        return
    click.echo(report.table(doc))
    click.echo(f"# results: {target / 'results.json'}")
    if any(r["wrong"] or r["timed_out"] for r in doc["results"]):
        raise SystemExit(1)


@cli.command()
@click.argument("lab", required=False)
@click.option("--fabric", help="only this fabric (default: every fabric)")
def pingall(lab, fabric):
    """Ping every host from every other host, over each fabric they share (like Mininet's pingall).

    Exits non-zero if any pair cannot reach the other.

    \b
    Example:
      sudo labctl pingall ls
      sudo labctl pingall ls --fabric backend
    """
    from labctl import lab as labmod
    p = labmod.load_plan(labmod.default_lab(lab))
    tried, failed = labmod.pingall(p, fabric)
    for a, b in failed:
        click.echo(f"  {a} -> {b}: no reply")
    click.echo(f"pingall {p.lab}: {tried - len(failed)}/{tried} pairs reachable")
    if failed or not tried:
        raise SystemExit(1)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def doctor(as_json):
    """Check this machine: root, kernel features, tools, and which mechanism each feature uses here.

    \b
    Example:
      sudo labctl doctor
    """
    from labctl import doctor as doc
    report = doc.run()
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    for section in ("kernel", "tools"):
        t = Table(title=section)
        t.add_column("item")
        t.add_column("present")
        t.add_column("note")
        for item in report[section]:
            t.add_row(item["name"], "yes" if item["present"] else "[red]no[/]", item.get("note", ""))
        out.print(t)
    t = Table(title="mechanism per feature on this machine")
    for col in ("feature", "mechanism", "status"):
        t.add_column(col)
    for f in report["features"]:
        t.add_row(f["feature"], f["mechanism"], f["status"])
    out.print(t)
    if not report["root"]:
        out.print("[yellow]not root:[/] kernel probes were skipped; run `sudo labctl doctor`")


@cli.command()
@click.option("--all", "everything", is_flag=True, help="also tear down labs that are up and healthy")
def clean(everything):
    """Remove the remains of labs whose `up` died half-way (from their records, nothing else).

    \b
    Example:
      sudo labctl clean
      sudo labctl clean --all   # every lab labctl knows about
    """
    from labctl import lab as labmod
    results = labmod.clean(everything)
    if not results:
        out.print("nothing to clean")
    for r in results:
        out.print(f"{r.lab}: {r.reason}; removed {len(r.removed)} namespaces", highlight=False)


@cli.command()
@click.argument("name", required=False)
def templates(name):
    """List the topology templates on the search path, or one template's variables.

    \b
    Example:
      labctl templates
      labctl templates leaf-spine
    """
    from labctl.topology import templates as tpl
    found = tpl.list_templates(tpl.search_path(None))
    if name is None:
        t = Table(title="templates")
        t.add_column("name")
        t.add_column("from")
        t.add_column("description")
        for x in found:
            t.add_row(x.name, str(x.directory), x.description)
        out.print(t)
        return
    match = [x for x in found if x.name == name]
    if not match:
        raise LabError(f"no template {name!r}", "`labctl templates` lists them")
    x = match[0]
    out.print(x.description)
    t = Table(title=f"variables of {name}")
    for col in ("var", "type", "default", "help"):
        t.add_column(col)
    for v in x.vars.values():
        t.add_row(v.name, v.type, str(v.default), v.help)
    out.print(t)


def main():
    cli(prog_name="labctl")

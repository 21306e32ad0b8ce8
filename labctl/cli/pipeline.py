"""Commands that need no root: render, plan, export (and graph), templates."""
from __future__ import annotations

import json
import shlex

import click
from rich.table import Table

from labctl.cli.base import (SET_HELP, TEMPLATES_HELP, TOPO_HELP, TOPO_TRUST_HELP, clab_map_options, clab_maps, cli, hosts_list, out,
                             placement_options)
from labctl.errors import LabError


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False), required=False)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
@click.option("--topo", help=TOPO_HELP)
@click.option("--trust", is_flag=True, help=TOPO_TRUST_HELP)
@clab_map_options
def render(file, sets, template_dirs, topo, trust, kind_map, image_map):
    """Print the full lab YAML a file expands to (its template rendered with its vars).

    \b
    Example:
      labctl render topologies/leaf-spine.yml --set spines=4 --set rail_optimised=false
      labctl render --topo linear,3            # Mininet's linear topology, as a labctl lab
      labctl render clos01.clab.yml --kind-map nokia_srlinux=frr   # a containerlab file, NOS nodes on FRR
    """
    from labctl.topology import sources
    click.echo(sources.render(file, sets, template_dirs, topo, clab_maps(kind_map, image_map), trust), nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False), required=False)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--name", help="the lab name (default: the file's name:)")
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
@click.option("--topo", help=TOPO_HELP)
@click.option("--trust", is_flag=True, help=TOPO_TRUST_HELP)
@click.option("--json", "as_json", is_flag=True, help="print the whole plan as JSON (what `up` would build)")
@clab_map_options
@placement_options
def plan(file, sets, name, template_dirs, topo, trust, as_json, kind_map, image_map, hosts, spread):
    """Compile a lab into its concrete plan without building it (no root needed).

    Shows every namespace, port, address and route, and the lab's powerful lines (exec on the
    host, binds, images labctl did not build, privileged containers, added capabilities) with
    whether `up` trusts them; --json prints
    everything, including MACs, ifindexes, sysctls and per-port shaping.

    \b
    Example:
      labctl plan topologies/leaf-spine.yml
      labctl plan topologies/leaf-spine.yml --json | jq '.nodes[] | select(.name=="leaf1").routes'
    """
    from labctl.plan.compile import compile_plan
    from labctl.topology import sources
    from labctl.units import format_rate
    from labctl.dataplane import arrivals
    from labctl.plan import trust
    loaded = sources.load(file, sets, template_dirs, name, topo, clab_maps(kind_map, image_map), trust)
    if hosts:
        from labctl.topology.placement import apply_hosts
        apply_hosts(loaded, hosts_list(hosts), spread)
    p = compile_plan(loaded, arrivals.choose())
    powerful, untrusted = trust.powerful(loaded), trust.untrusted(loaded)
    agents = _agent_places(p)
    if as_json:
        click.echo(json.dumps({**p.to_dict(), "powerful": trust.as_dicts(powerful),
                               "trusted": not untrusted, "untrusted_because": untrusted,
                               "switch_agents": agents}, indent=1))
        return
    t = Table(title=f"lab {p.lab}: {len(p.nodes)} nodes, {len(p.links)} links, dilation {p.dilation:g}")
    boxed = any(n.container for n in p.nodes)
    placed = any(n.machine for n in p.nodes)
    for col in ("node", "kind", *(("machine",) if placed else ()), "namespace", *(("image",) if boxed else ()),
                "ports", "addresses", "routes"):
        t.add_column(col)
    for n in p.nodes:
        addresses = [i.address for i in n.interfaces if i.address] + ([n.loopback] if n.loopback else [])
        routes = str(len(n.routes)) if n.static_routes else ("its own" if n.numbered else "its exec lines")
        t.add_row(n.name, n.kind, *((n.machine,) if placed else ()), n.namespace,
                  *((n.container.image if n.container else "-",) if boxed else ()),
                  ", ".join(i.name for i in n.interfaces),
                  ", ".join(addresses) or ("(its exec lines)" if not n.numbered else ""), routes)
    out.print(t)
    lines = [(n, argv) for n in p.nodes for argv in n.exec]
    if lines:
        et = Table(title="exec lines, run in each node once it is cabled (in a container, or as root in the netns)")
        for col in ("node", "in", "command"):
            et.add_column(col)
        for n, argv in lines:
            et.add_row(n.name, "container" if n.container else "netns", shlex.join(argv))
        out.print(et)
    if powerful:
        verdict = ("its files are root's alone: `up` runs them" if not untrusted else
                   f"NOT TRUSTED ({'; '.join(untrusted[:2])}): `up` refuses them without --trust")
        pt = Table(title=f"powerful lines: code this lab runs as root, or host paths it hands out; {verdict}")
        for col in ("where", "what", "line", "why"):
            pt.add_column(col)
        for line in powerful:
            pt.add_row(line.where, line.what, line.text, line.why)
        out.print(pt)
    chosen = [n for n in p.nodes if n.container and n.container.chosen]
    if chosen:
        ct = Table(title="placed nodes the lab file runs in no container: labctl runs each as a Swarm service of "
                         "its own image on its machine (Docker's default /proc, no no_new_privs: services know neither)")
        for col in ("node", "machine", "image", "capabilities added", "why"):
            ct.add_column(col)
        for n in chosen:
            ct.add_row(n.name, n.machine, n.container.image, ", ".join(n.container.cap_add) or "-",
                       "its switch agent loads BPF programs (Docker 20.10 knows no CAP_BPF)" if n.container.cap_add
                       else "")
        out.print(ct)
    if agents:
        from labctl.containers.nodes import AGENT_CODE, AGENT_HOME
        at = Table(title="switch agents (inside each node: LABCTL_SWITCH_AGENTS=node, or a placed lab): where each "
                         "node's PFC/ECN agent runs")
        for col in ("node", "runs", "what it is given"):
            at.add_column(col)
        for name, where in agents.items():
            given = (f"labctl's package read-only at {AGENT_CODE}, its own agents/{name}/ at {AGENT_HOME}; "
                     "run real-time, in labctl's CPU group" if where == "container" else "its share, from the host, in the node's namespace")
            at.add_row(name, "inside its container" if where == "container" else "from the host", given)
        out.print(at)
        from labctl.plan.share import memory_refusal
        from labctl.procs import mem_available
        refused = memory_refusal(p, mem_available())
        if refused:
            out.print(f"[red]`up` refuses these agents:[/] {refused[0]}; {refused[1]}")
    lt = Table(title="links")
    for col in ("a", "b", "fabric", "subnet", "rate (real)", "rate (lab)", *(("between machines",) if placed else ())):
        lt.add_column(col)
    for lk in p.links:
        lt.add_row(lk.a, lk.b, lk.fabric, lk.subnet, format_rate(lk.rate_bps), format_rate(lk.lab_rate_bps),
                   *((" -- ".join(lk.machines) + " (VXLAN)" if lk.machines else "",) if placed else ()))
    out.print(lt)
    if p.notes:
        out.print("[bold]notes on the lab file[/] (they do not stop `up`):", highlight=False)
        for note in p.notes:
            out.print(f"  - {note}", highlight=False, markup=False)
    notes = [line[len("# note: "):] for line in loaded.text.splitlines() if line.startswith("# note: ")]
    if notes:
        from rich.markup import escape
        what, render = (("Mininet topology", f"`labctl render FILE --topo {topo}`") if topo else
                        ("containerlab file", "`labctl render FILE`"))
        out.print(f"[bold]how the {what} was read[/] ({escape(render)} shows the lab it became):", highlight=False)
        for note in notes:
            out.print(f"  - {note}", highlight=False, markup=False)


def _agent_places(p) -> dict[str, str]:
    """node -> "container" or "namespace" for each node's own switch agent; {} with one for the lab."""
    from labctl.containers.nodes import agent_inside
    from labctl.plan import share
    if share.placement() != "node" and not any(n.machine for n in p.nodes):
        return {}
    return {n.name: "container" if agent_inside(n) else "namespace" for n in share.served(p)}


def _export_options(f):
    f = click.option("--topo", help=TOPO_HELP)(f)
    f = click.option("--trust", is_flag=True, help=TOPO_TRUST_HELP)(f)
    f = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)(f)
    return click.argument("source", metavar="FILE|LAB", required=False)(f)


@cli.command()
@click.option("--format", "fmt", default="dot", show_default=True, metavar="FORMAT",
              help="dot, mermaid, json, mininet or clab (each is described below)")
@click.option("--strict", is_flag=True, help="clab: refuse a lab that uses what containerlab cannot express "
                                             "(the PFC/ECN controller, the WAN line, dilation)")
@click.option("--out", "out_dir", metavar="DIR", help="clab: write a directory that carries the fabric: the "
              "topology, each node's share of the plan and labctl's agent code (PFC, ECN, classes)")
@_export_options
def export(source, fmt, sets, topo, trust, strict, out_dir):
    """Write a lab out for another tool: a topology file, or a running lab's record.

    \b
    Formats:
      dot       Graphviz: labctl export FILE | dot -Tpng > lab.png
      mermaid   for a Markdown ```mermaid block
      json      the whole plan (as `labctl plan --json`)
      mininet   a standalone Mininet script (sudo python3 lab.py --test pings every pair)
      clab      a containerlab topology: linux nodes on labctl/host, exec: lines for
                addresses, routes and shaping (labctl up FILE.clab.yml reads it back)

    \b
    Example:
      labctl export topologies/leaf-spine.yml --format mermaid
      labctl export ls --format json > ls.plan.json
      labctl export topologies/leaf-spine.yml --format clab > ls.clab.yml
      labctl export topologies/leaf-spine.yml --format clab --out ls-clab/

    \b
    With --out DIR (clab), every node that needs PFC or ECN runs labctl's switch agent inside it:
    DIR/LAB.clab.yml, DIR/agents/NODE/share.json (its share of the plan) and DIR/labctl-agent
    (the agent's code, bound read-only). `containerlab deploy -t DIR/LAB.clab.yml` then has
    labctl's classes, pauses and ECN marking, each agent reporting to DIR/agents/NODE/pfc.json.
    """
    from labctl import exports
    plan = exports.plan_of(source, sets, topo, trust)
    if out_dir is not None:
        if fmt != "clab":
            raise click.UsageError("--out is for --format clab (the others print one file)")
        from pathlib import Path
        from labctl.exports import clab
        written = clab.export_dir(plan, Path(out_dir), strict)
        click.echo(f"wrote {written[0]} with {len(written) - 2} agent shares and the agent's code "
                   f"({written[-1].parent}); deploy: sudo containerlab deploy -t {written[0]}")
        return
    click.echo(exports.export(plan, fmt, strict), nl=False)


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["dot", "mermaid"]), default="dot", show_default=True,
              help="Graphviz dot (draw it with `dot -Tpng`, from the graphviz package) or Mermaid")
@_export_options
def graph(source, fmt, sets, topo, trust):
    """Draw a lab as Graphviz dot or Mermaid (the same as `labctl export --format dot|mermaid`).

    \b
    Example:
      labctl graph topologies/leaf-spine.yml | dot -Tpng > fabric.png
      labctl graph ls --format mermaid
    """
    from labctl import exports
    click.echo(exports.export(exports.plan_of(source, sets, topo, trust), fmt), nl=False)


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



"""Building and removing labs: up, down, clean, doctor."""
from __future__ import annotations

import json
import sys

import click
from rich.table import Table

from labctl import backends
from labctl.errors import LabError
from labctl.cli.base import (SET_HELP, TEMPLATES_HELP, TOPO_HELP, clab_map_options, clab_maps, cli, err, hosts_list,
                             out, placement_options)

@cli.command()
@click.argument("file", type=click.Path(dir_okay=False), required=False)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--name", help="the lab name (default: the file's name:); two names make two independent labs")
@click.option("--templates", "template_dirs", multiple=True, type=click.Path(file_okay=False), help=TEMPLATES_HELP)
@click.option("--topo", help=TOPO_HELP)
@click.option("--backend", default="netns", show_default=True, metavar="NAME",
              help="what builds the nodes: " + ", ".join(backends.names()))
@click.option("--no-build", is_flag=True, help="fail, with the command to run, instead of building a missing "
              "labctl/* image (up builds one on first use, which takes minutes)")
@click.option("--trust", is_flag=True, help="run the lab's powerful lines (exec on the host, binds, foreign images, "
              "privileged containers, added capabilities) "
              "although its files are not root's alone; read them first in `labctl plan`")
@clab_map_options
@placement_options
def up(file, sets, name, template_dirs, topo, backend, no_build, trust, kind_map, image_map, hosts, spread):
    """Build a lab: namespaces, veth links, addresses, ECMP routes and shaping.

    Every node's network namespace is <lab>-<node>, whatever backend built it, so plain
    `ip netns exec <lab>-<node> ...` works too. If anything fails half-way, what was made is
    removed again.

    A lab file is code run as root. If it has powerful lines (exec on the host, binds, images
    labctl did not build, privileged: and cap_add: on containers), up runs it only when the file, its directory and its templates are
    root's and writable by no one else, or with --trust. `labctl plan FILE` lists those lines.

    \b
    Example:
      sudo labctl up topologies/leaf-spine.yml
      sudo labctl up topologies/leaf-spine.yml --name ls2 --set spines=4
      sudo labctl up topologies/leaf-spine.yml --backend mininet   # Mininet builds the nodes
      sudo labctl up --topo tree,2,3                               # Mininet's own tree topology
      sudo labctl up mytopo.py --topo mytopo                       # a `mn --custom` file (runs it)
      sudo labctl up clos01.clab.yml --kind-map nokia_srlinux=frr  # containerlab's Clos, SR Linux on FRR
      sudo labctl up topologies/leaf-spine-bgp.yml --hosts m1,m2,m3 # over three machines (labctl cluster)
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from labctl import lifecycle as labmod
    from labctl.units import format_rate

    with Progress(TextColumn("{task.description:<12}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not sys.stderr.isatty()) as bar:
        tasks = {}

        def progress(stage, done, total):
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        maps = clab_maps(kind_map, image_map)
        p, lab, elapsed = labmod.up(file, sets, name, template_dirs, backend=backend, progress=progress, topo=topo,
                                    maps=maps, build_images=not no_build, trust=trust, hosts=hosts_list(hosts),
                                    spread=spread)
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
    for note in p.notes:        # located remarks on the file that did not stop it (plan/buffers.py)
        err.print(f"note: {note}", highlight=False, markup=False)
    from labctl.kinds import node_kind
    first = next((n for n in p.nodes if node_kind(n.kind).holds_rank), p.nodes[0])
    out.print(f"next: labctl status {p.lab} | labctl exec {first.name} -- ip route | labctl down {p.lab}",
              highlight=False)


@cli.command()
@click.argument("lab")
def down(lab):
    """Tear a lab down: stop its processes, delete its namespaces (and with them every link).

    Works from the lab's record alone, so the topology file may be gone. LAB is a lab name or the
    file it was built from (the lab whose record names that file, whatever --name it was given;
    if several were built from it, name one).

    \b
    Example:
      sudo labctl down ls
      sudo labctl down topologies/leaf-spine.yml
    """
    from labctl import lifecycle as labmod
    from labctl.lifecycle.labs import find_lab
    try:
        name = find_lab(lab).name       # `down FILE` names the lab it built, not the file
    except LabError:
        name = lab                      # down says why, below
    removed = labmod.down(lab)
    out.print(f"lab {name}: removed {len(removed)} namespaces", highlight=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="print it as JSON, for scripts")
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
    for lab in report.get("labs", []):
        if "error" in lab:
            out.print(f"lab {lab['lab']}: [yellow]{lab['error']}[/]")
            continue
        fast, slow = lab["fast_path"], lab["slow_path"]
        out.print(f"lab {lab['lab']}: {len(fast)} routers forward on the fast path"
                  + (f", {len(slow)} on the slow path ({', '.join(slow)})" if slow else "")
                  + f"; {len(lab.get('ecn_in_data_path', []))} switches mark ECN in the data path"
                  + (f"; {len(lab['agents_in_nodes'])} nodes run their own switch agent"
                     if lab.get("agents_in_nodes") else "; one switch agent on the host"))
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
    from labctl import lifecycle as labmod
    results = labmod.clean(everything)
    if not results:
        out.print("nothing to clean")
    for r in results:
        out.print(f"{r.lab}: {r.reason}; removed {len(r.removed)} namespaces", highlight=False)


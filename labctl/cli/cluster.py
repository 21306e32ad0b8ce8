"""`labctl cluster`: the machines a lab may spread over (Docker engines joined in one Swarm), and
emulating such machines on this host."""
from __future__ import annotations

import json
import time

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from labctl.cli.base import cli, out
from labctl.names import terminal_safe


def say(text: str) -> None:
    """One line to the terminal, as text: a machine's engine wrote part of it (an error, a state),
    so no markup of rich's and no control character of the terminal's may act."""
    out.print(escape(terminal_safe(text)), highlight=False)

DEFAULT_IMAGES = ("labctl/host", "labctl/frr")


@cli.group()
def cluster():
    """Machines a lab can spread over: Docker engines joined in one Swarm.

    Each machine is a Docker engine and an underlay address; Swarm places a lab node's container
    on the machine its `placement:` names (the Swarm node label labctl.machine), and links
    between machines travel as VXLAN between underlay addresses.

    \b
    Try it on one host (three machines, each a namespace with its own dockerd):
      sudo labctl cluster emulate 3        # m1..m3 on 192.168.77.0/24, one Swarm, images copied
      labctl cluster status                # machines, Swarm state, lab containers on each
      sudo labctl cluster emulate --stop   # remove all of it
    \b
    Real machines (each runs dockerd; the engine URL is how this host reaches it):
      sudo labctl cluster init --name a --engine unix:///var/run/docker.sock --address 192.168.1.1
      sudo labctl cluster join --name b --engine ssh://root@hostb --address 192.168.1.2
      sudo labctl cluster leave b          # b leaves the Swarm and is forgotten
      sudo labctl cluster reset            # every machine leaves; labctl forgets them all
    The Swarm forms over real machines, but `up` places nodes only on machines whose kernel is
    this host's (emulated ones, or this host's own engine): labctl cables a node through its
    network namespace. docs/multi-machine.md says what building on other hosts still needs.
    """


def _progress():
    """Progress lines: one when a stage starts and one when it is done, with the time so far."""
    t0, seen = time.monotonic(), set()

    def stage_line(stage, done, total):
        mark = "done" if done >= total else "start" if done == 0 else None
        if mark and (stage, mark) not in seen:
            seen.add((stage, mark))
            text = f"{stage}: {done}/{total}" if mark == "done" else f"{stage} ..."
            say(f"  [{time.monotonic() - t0:5.1f} s] {text}")
    return stage_line


@cluster.command("emulate")
@click.argument("count", type=int, default=3, required=False)
@click.option("--subnet", default="192.168.77.0/24", show_default=True,
              help="the emulated underlay: machine mN gets address N in it (keep it out of 10.0.0.0/8, the labs')")
@click.option("--stop", "stop_", is_flag=True, help="remove the emulated machines and everything they run")
@click.option("--image", "images_", multiple=True, default=DEFAULT_IMAGES, show_default=True,
              help="copy this image from this host's engine into every machine (labctl's are built first if "
                   "missing); repeatable")
@click.option("--no-images", is_flag=True, help="copy no image")
@click.option("--halt", metavar="MACHINE", help="take one machine away, as if it went down: its engine stops, "
              "and every container on it (its namespace and Swarm state stay for --resume)")
@click.option("--resume", metavar="MACHINE", help="bring a halted machine back: its engine starts, rejoins the "
              "Swarm, and removes what the manager removed meanwhile")
def cluster_emulate(count, subnet, stop_, images_, no_images, halt, resume):
    """Emulate COUNT machines (default 3) on this host and join them in one Swarm.

    Machine mN is the network namespace lcm-mN, cabled to the bridge lcm-underlay, running its
    own dockerd (socket /run/lcm-mN.sock; its data root /var/lib/labctl/machines/mN is kept, so
    images copied once stay). m1 manages the Swarm. They are recorded as labctl's cluster, so
    `placement:` in a lab file can name m1..mN. `--stop` removes exactly what was made.

    \b
    Example:
      sudo labctl cluster emulate 3
      sudo labctl cluster emulate --halt m3      # m3 goes away (its engine stops answering)
      sudo labctl cluster emulate --stop
    """
    from labctl.cluster import emulate
    from labctl.lifecycle.labs import require_root
    require_root("labctl cluster emulate")
    if halt or resume:
        (emulate.halt if halt else emulate.resume)(halt or resume)
        say(f"machine {halt} is away (`--resume {halt}` brings it back)" if halt else
                  f"machine {resume} is back")
        return
    if stop_:
        from labctl.cluster.services import refuse_while_placed
        refuse_while_placed("labctl cluster emulate --stop")
        t0 = time.monotonic()
        had = emulate.stop()
        say(f"the emulated machines are removed ({time.monotonic() - t0:.1f} s)" if had
                  else "no machines are emulated on this host")
        return
    t0 = time.monotonic()
    machines = emulate.start(count, subnet, progress=_progress())
    say(f"{len(machines)} machines emulated and joined in one Swarm in {time.monotonic() - t0:.1f} s")
    if not no_images and images_:
        _copy_images(list(machines.values()), list(images_))
    _status_table(as_json=False)


def _copy_images(machines, wanted: list[str]) -> None:
    from labctl.cluster import images
    progress = _progress()
    src, started = images.default_images_client(wanted, progress=progress)
    try:
        for m in machines:
            for ref, seconds in images.ensure_images(m, wanted, src, progress=progress).items():
                say(f"  {ref} copied to {m.name} in {seconds:.1f} s")
    finally:
        src.close()
        images.release_default(started)


def _machine(name, engine_url, address, manager):
    from labctl.cluster.machines import Machine
    return Machine(name, engine_url, address, manager=manager).check()


def _machine_options(f):
    """--name, --engine and --address: what labctl records of a machine."""
    f = click.option("--address", required=True, help="its underlay IPv4 address (the Swarm and VXLAN links use "
                     "it; a joining machine's must reach the manager's)")(f)
    f = click.option("--engine", "engine_url", required=True,
                     help="its Docker engine: unix:///var/run/docker.sock, tcp://HOST:2376 or ssh://root@HOST")(f)
    return click.option("--name", required=True, help="the machine's name, as `placement:` names it")(f)


@cluster.command("init")
@_machine_options
def cluster_init(name, engine_url, address):
    """Form a Swarm with this machine as its manager, and record it.

    \b
    Example:
      sudo labctl cluster init --name a --engine unix:///var/run/docker.sock --address 192.168.1.1
    """
    from labctl.cluster import machines as mrec
    from labctl.cluster import swarm
    from labctl.errors import LabError
    from labctl.lifecycle.labs import require_root
    require_root("labctl cluster init")
    known = mrec.load()
    if known:
        raise LabError(f"labctl knows machines already ({', '.join(known)})",
                       "`labctl cluster join` adds one; `labctl cluster reset` forgets them all")
    m = _machine(name, engine_url, address, True)
    swarm.init(m)
    swarm.label(m, m)
    mrec.save({m.name: m})
    say(f"Swarm formed; {name} ({address}) manages it")


@cluster.command("join")
@_machine_options
def cluster_join(name, engine_url, address):
    """Join a machine to the recorded manager's Swarm, label it, and record it.

    \b
    Example:
      sudo labctl cluster join --name b --engine ssh://root@hostb --address 192.168.1.2
    """
    from labctl.cluster import machines as mrec
    from labctl.cluster import swarm
    from labctl.errors import LabError
    from labctl.lifecycle.labs import require_root
    require_root("labctl cluster join")
    known = mrec.load()
    mgr = mrec.manager(known)
    if name in known:
        raise LabError(f"labctl knows a machine {name} already", f"`labctl cluster leave {name}` first")
    m = _machine(name, engine_url, address, False)
    swarm.join(m, mgr)
    swarm.label(mgr, m)
    mrec.save({**known, m.name: m})
    say(f"{name} ({address}) joined the Swarm of {mgr.name}")


def _rows() -> list[dict]:
    from labctl.cluster import machines as mrec
    from labctl.cluster import swarm
    from labctl.errors import LabError
    known = mrec.load()
    by_machine = {}
    if known:
        try:
            by_machine = {n["machine"]: n for n in swarm.nodes(mrec.manager(known)) if n["machine"]}
        except LabError:
            pass                       # the manager does not answer: Swarm state unknown
    rows = []
    for m in known.values():
        node = by_machine.get(m.name, {})
        try:
            c = mrec.client(m, timeout=5)
            try:
                labs = len(c.containers.list(filters={"label": "labctl.lab"}))
            finally:
                c.close()
        except LabError:
            labs = None
        rows.append({"machine": m.name, "engine": m.engine, "address": m.address, "netns": m.netns,
                     "role": node.get("role") or ("manager" if m.manager else "worker"),
                     "swarm": node.get("state"), "availability": node.get("availability"),
                     "lab_containers": labs})
    return rows


def _status_table(as_json: bool) -> None:
    rows = _rows()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if not rows:
        say("labctl knows no machines: `labctl cluster init` forms a Swarm, "
                  "`sudo labctl cluster emulate 3` emulates three here")
        return
    t = Table()
    for col in ("machine", "engine", "address", "role", "Swarm state", "lab containers"):
        t.add_column(col)
    for r in rows:
        state = "? (no answer)" if r["swarm"] is None else r["swarm"] if r["availability"] == "active" \
            else f"{r['swarm']} ({r['availability']})"
        cells = (r["machine"], r["engine"], r["address"], r["role"], state,
                 "-" if r["lab_containers"] is None else str(r["lab_containers"]))
        t.add_row(*(Text(terminal_safe(c)) for c in cells))      # the manager's words: never markup
    out.print(t)


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="print it as JSON, for scripts")
def cluster_status(as_json):
    """The machines: engine, address, Swarm role and state, lab containers running on each.

    \b
    Example:
      labctl cluster status
    """
    _status_table(as_json)


@cluster.command("leave")
@click.argument("name")
def cluster_leave(name):
    """Make machine NAME leave the Swarm, and forget it (a manager leaves last: use reset).

    \b
    Example:
      sudo labctl cluster leave b
    """
    from labctl.cluster import machines as mrec
    from labctl.cluster import swarm
    from labctl.errors import LabError
    from labctl.lifecycle.labs import require_root
    require_root("labctl cluster leave")
    from labctl.cluster.services import refuse_while_placed
    refuse_while_placed(f"labctl cluster leave {name}", name)
    known = mrec.load()
    if name not in known:
        raise LabError(f"labctl knows no machine {name}", "`labctl cluster status` lists them")
    m = known.pop(name)
    if m.manager and known:
        raise LabError(f"{name} manages the Swarm, and {', '.join(known)} still belong to it",
                       "let them leave first (`labctl cluster leave NAME`), or `labctl cluster reset`")
    nid = swarm.node_id(m)
    swarm.leave(m)
    if not m.manager:
        swarm.remove_node(mrec.manager(known), nid, m)      # or it stays listed, Down
    if known:
        mrec.save(known)
    else:
        mrec.record_path().unlink(missing_ok=True)
    say(f"{name} left the Swarm and is forgotten")


@cluster.command("reset")
def cluster_reset():
    """Every known machine leaves the Swarm (those that answer), and labctl forgets them all.

    \b
    Example:
      sudo labctl cluster reset
    """
    from labctl.cluster import emulate
    from labctl.cluster import machines as mrec
    from labctl.cluster import swarm
    from labctl.errors import LabError
    from labctl.lifecycle.labs import require_root
    require_root("labctl cluster reset")
    from labctl.cluster.services import refuse_while_placed
    refuse_while_placed("labctl cluster reset")
    try:
        known = mrec.load()
    except LabError as exc:          # an unreadable record: forgotten all the same
        say(f"  {exc.message}")
        known = {}
    for m in sorted(known.values(), key=lambda m: m.manager):     # workers first
        try:
            swarm.leave(m)
        except LabError as exc:
            say(f"  {m.name}: {exc.message} (forgotten anyway)")
    mrec.record_path().unlink(missing_ok=True)
    say(f"forgot {len(known)} machine(s)")
    if emulate.status():
        say("the emulated machines still run: `sudo labctl cluster emulate --stop` removes them")

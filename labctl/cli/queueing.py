"""Queueing at runtime: tc show / tc set, link down / up, counters."""
from __future__ import annotations

import json
import time

import click
from rich.live import Live
from rich.table import Table

from labctl.cli.base import cli, out
from labctl.units import format_rate, format_size


def _target(spec: str, lab_name: str | None, need_iface: bool):
    """(lab, plan, node, port name or None) of NODE[:PORT] in the lab."""
    from labctl import lifecycle as labmod
    from labctl.lifecycle import targets
    labmod.require_root("labctl tc/link/counters")
    lab = labmod.default_lab(lab_name)
    plan = labmod.load_plan(lab)
    node, iface = targets.port(plan, spec, need_port=need_iface)
    return lab, plan, node, iface.name if iface else None


def _queue_table(rows: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("node", "port", "class", "dscp", "rate / ceil", "buffer", "depth", "sent", "drops",
                "ECN Kmin-Kmax / Pmax", "ECN p", "CE marked", "PFC (XOFF)", "PFC tx/rx", "paused"):
        t.add_column(col)
    for r in rows:
        pfc = "-" if not r["lossless"] else (f"on ({r['xoff_bytes'] // 1024} KiB)" if r["pfc"] else "off")
        # a lossless class with PFC turned off (`tc set --pfc off`) drops like any other
        kind = "" if not r["lossless"] else ", lossless" if r["pfc"] else ", lossless class, PFC off: drops"
        t.add_row(r["node"], r["port"], f"{r['class']} (tc {r['tc']}{kind})",
                  ",".join(map(str, r["dscp"])) or "other", f"{format_rate(r['rate_bps'])} / "
                  f"{format_rate(r['ceil_bps'])}", f"{r['buffer_bytes'] // 1024} KiB", f"{r['depth_bytes']} B",
                  f"{r['sent_packets']} pkt", str(r["drops"]),
                  _ecn_cell(r) if r["ecn"] else "-",
                  "-" if r["mark_probability"] is None else f"{r['mark_probability']:.3f}",
                  str(r["ecn_marked"]) if r["ecn"] else "-", pfc,
                  f"{r['pfc_tx']}/{r['pfc_rx']}" if "pfc_tx" in r else "-",
                  f"{r['paused_s']:.3f} s" if "paused_s" in r else "-")
    return t


def _ecn_cell(r: dict) -> str:
    """The class's profile, and whether its queue can reach it (plan/buffers.py notes a link's own
    buffer below the lab's profile; `tc set` refuses thresholds above the buffer)."""
    cell = f"{format_size(r['kmin'])}-{format_size(r['kmax'])} / {r['pmax']:g}"
    if r["kmin"] >= r["buffer_bytes"]:
        return cell + " (never marks: Kmin >= buffer)"
    return cell + (" (Pmax never reached: Kmax > buffer)" if r["kmax"] > r["buffer_bytes"] else "")


@cli.group()
def tc():
    """Show or change a port's traffic classes, rates and queues while the lab runs.

    \b
    Example:
      sudo labctl tc show leaf1
      sudo labctl tc set leaf1:spine1 --rate 50M
    """


@tc.command("show")
@click.argument("target", metavar="NODE[:PORT]")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
@click.option("--json", "as_json", is_flag=True, help="print it as JSON, for scripts")
def tc_show(target, lab_name, as_json):
    """Classes (DSCP, rate, ceil, buffer, lossless, ECN) with live depth, counters and marking.

    \b
    Example:
      sudo labctl tc show leaf1
      sudo labctl tc show leaf1:spine1 --json
    """
    from labctl.dataplane import control
    from labctl.telemetry.queues import add_pfc, node_queues
    lab, plan, node, iface = _target(target, lab_name, need_iface=False)
    lab_path = lab.path
    rows = node_queues(plan, node, iface, control.settings_in_force(plan, lab_path))
    add_pfc(rows, lab_path)
    from labctl.telemetry import reaction
    react = reaction.summary(reaction.read(lab_path), plan.pfc_response_s)
    if as_json:
        click.echo(json.dumps({"ecn": vars(plan.ecn), "controller_reaction": react, "queues": rows}, indent=1))
        return
    scaled = f" at {plan.ecn.rate_bps / 1e9:g}G, scaled to each port's rate" if plan.ecn.rate_bps else ""
    out.print(_queue_table(rows, f"{node.name} in lab {plan.lab}; the lab's ECN profile: Kmin {plan.ecn.kmin} B, "
                                 f"Kmax {plan.ecn.kmax} B{scaled}, Pmax {plan.ecn.pmax} (each class's, as in force, "
                                 "in its row)"))
    if any(r["lossless"] for r in rows):
        out.print(reaction.describe(react) + ", since the lab came up", highlight=False)


ON_OFF = click.Choice(["on", "off"])


@tc.command("set")
@click.argument("targets", metavar="NODE[:PORT]...", nargs=-1, required=True)
@click.option("--rate", help="the port's new rate in the lab, e.g. 50M (real rate = this x dilation); needs a PORT")
@click.option("--class", "class_name", help="only this class (default: every class the setting applies to)")
@click.option("--ecn", type=ON_OFF, help="ECN marking on/off (switch ports, ECN-capable classes)")
@click.option("--kmin", help="ECN: depth where marking starts, e.g. 200KB")
@click.option("--kmax", help="ECN: depth where marking reaches Pmax, e.g. 800KB")
@click.option("--pmax", type=float, help="ECN: marking probability at Kmax, 0..1")
@click.option("--pfc", type=ON_OFF, help="PFC on/off for lossless classes (off: the class drops when full)")
@click.option("--xoff", help="PFC: depth that pauses the feeding ports, e.g. 1MB")
@click.option("--xon", help="PFC: depth that releases them again")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
def tc_set(targets, rate, class_name, ecn, kmin, kmax, pmax, pfc, xoff, xon, lab_name):
    """Change a port's rate, ECN thresholds or PFC while the lab runs.

    Thresholds and on/off switches go to the lab's controller, which applies them within 10 ms;
    `labctl tc show` shows what is in force. NODE alone changes every port of the node. Several
    targets are all checked before any is changed, and their settings reach the controller as one
    change, taken whole.

    \b
    Example:
      sudo labctl tc set leaf1:spine1 --rate 50M      # halve an uplink: watch ECMP and ECN react
      sudo labctl tc set leaf1 --pfc off              # the lossy alternative: incast now drops
      sudo labctl tc set leaf1 leaf2 spine1 --pfc off # the whole fabric at once
      sudo labctl tc set leaf1:srv1-gpu0 --kmin 100KB --kmax 400KB --pmax 0.5
    """
    from labctl import lifecycle as labmod
    resolved = [_target(t, lab_name, need_iface=rate is not None) for t in targets]
    settings = {"ecn": ecn, "kmin": kmin, "kmax": kmax, "pmax": pmax, "pfc": pfc, "xoff": xoff, "xon": xon}
    given = {k: v for k, v in settings.items() if v is not None}
    done = labmod.tc_set_many(resolved, class_name, rate, **settings)
    for (lab, plan, node, iface), (bps, count) in zip(resolved, done):
        if bps is not None:
            out.print(f"{node.name}:{iface} now shaped to {format_rate(bps)} "
                      f"({format_rate(bps * plan.dilation)} on the real fabric)", highlight=False)
        if given:
            out.print(f"applied {', '.join(f'{k}={v}' for k, v in given.items())} to {count} port class(es) "
                      f"on {node.name}{':' + iface if iface else ''}", highlight=False)


@cli.command()
@click.argument("state", type=click.Choice(["down", "up"]))
@click.argument("target", metavar="NODE:PORT")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
def link(state, target, lab_name):
    """Take a link down or bring it back (both ends), e.g. to watch ECMP route around a failure.

    \b
    Example:
      sudo labctl link down leaf1:spine1
      sudo labctl route srv1-gpu0 srv2-gpu1 --sport 49152   # now only via spine2
      sudo labctl link up leaf1:spine1
    """
    from labctl import lifecycle as labmod
    lab, plan, node, iface = _target(target, lab_name, need_iface=True)
    import time
    t0 = time.monotonic()
    changed = labmod.set_link_state(lab, plan, node, iface, state == "up")
    port = node.iface(iface)
    took = labmod.converge_after_link_change(lab, plan, t0)
    if took is None:
        out.print(f"link {node.name}:{iface} -- {port.peer_node}:{port.peer_iface} is {state}; "
                  f"{changed} routes changed as the fabric reconverged", highlight=False)
    else:
        out.print(f"link {node.name}:{iface} -- {port.peer_node}:{port.peer_iface} is {state}; the lab's routing "
                  f"converged in {took * 1e3:.0f} ms (lab time; {took * 1e6 / plan.dilation:.1f} us at real-fabric "
                  f"speed, dilation {plan.dilation:g}, with timers that are not dilated)", highlight=False)


@cli.command()
@click.argument("lab", required=False)
@click.option("--json", "as_json", is_flag=True, help="one JSON document with every port and class")
@click.option("--watch", is_flag=True, help="refresh every second until Ctrl-C")
@click.option("--busy", is_flag=True, help="only queues that sent or dropped something")
@click.option("--losses", is_flag=True, help="the loss ledger: every place a packet was lost since `up`")
def counters(lab, as_json, watch, busy, losses):
    """Per port and class: queue depth, packets and bytes sent, drops, ECN marking probability, PFC
    frames sent/received and time paused; and the loss ledger (--losses).

    The ledger counts every place the lab can lose a packet: qdisc drops per port and class, device
    drops and errors, per-CPU backlog drops, ARP's unresolved discards, IP discards and UDP
    receive-buffer errors per namespace, and the WAN line's losses. `labctl run` puts the same ledger, for the run alone, in results.json.

    \b
    Example:
      sudo labctl counters ls --busy
      sudo labctl counters ls --watch
      sudo labctl counters ls --losses --json
    """
    from labctl import lifecycle as labmod
    from labctl.telemetry.queues import lab_queues
    labmod.require_root("labctl counters")
    lab_dir = labmod.default_lab(lab, positional=True)
    plan = labmod.load_plan(lab_dir)
    if losses:
        from labctl import procs
        from labctl.telemetry import ledger
        with procs.realtime():
            led = ledger.since_up(plan, lab_dir)
        if as_json:
            click.echo(json.dumps(led, indent=1))
            return
        t = Table(title=f"lab {plan.lab}: packets lost since it came up")
        for col in ("place", "node", "port", "what", "count", "lossless class"):
            t.add_column(col)
        lossless = {(n.name, i.name, c.name) for n in plan.nodes for i in n.interfaces for c in i.shaping.classes
                    if c.lossless}
        for p in sorted(led["places"], key=lambda p: -p["count"]):
            t.add_row(p["place"], p["node"], p["port"], p["what"], str(p["count"]),
                      "yes" if (p["node"], p["port"], p["what"]) in lossless else "")
        out.print(t if led["places"] else f"lab {plan.lab}: nothing lost anywhere since it came up", highlight=False)
        return

    from labctl.dataplane import control

    def rows():
        got = lab_queues(plan, lab_dir.path, control.settings_in_force(plan, lab_dir.path))
        return [r for r in got if r["sent_packets"] or r["drops"] or r.get("pfc_tx") or r.get("pfc_rx")] \
            if busy else got

    if as_json:
        click.echo(json.dumps(rows(), indent=1))
        return
    if not watch:
        out.print(_queue_table(rows(), f"lab {plan.lab}"))
        return
    with Live(_queue_table(rows(), f"lab {plan.lab}"), console=out, refresh_per_second=2) as live:
        try:
            while True:
                time.sleep(1)
                live.update(_queue_table(rows(), f"lab {plan.lab} (Ctrl-C to stop)"))
        except KeyboardInterrupt:
            pass

"""Looking into a running lab: status, exec, route, pingall."""
from __future__ import annotations

import json
import os

import click
from rich.table import Table

from labctl.cli.base import cli, out

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
    from labctl import lifecycle as labmod
    from labctl import state
    if lab is None:
        labs = [{"lab": d.name, **{k: d.read_state().get(k) for k in ("status", "topology_file", "pid")},
                 "helpers_down": [h["helper"] for h in labmod.helpers(d) if not h["running"]]}
                for d in state.all_labs()]
        if as_json:
            click.echo(json.dumps(labs, indent=1))
            return
        if not labs:
            out.print("no labs (labctl up FILE builds one)")
            return
        t = Table(title="labs")
        for col in ("lab", "status", "helpers", "topology file"):
            t.add_column(col)
        for d in labs:
            down = d["helpers_down"]
            t.add_row(d["lab"], str(d["status"]), f"[red]{', '.join(down)} not running[/]" if down else "ok",
                      str(d["topology_file"] or "(built from Python: labctl.Topology)"))
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
            kind = n["kind"] + (f" ({n['image']})" if n.get("image") else "")   # a container node's image
            kind += f" on {n['machine']}" if n.get("machine") else ""
            peer = p["peer"] + (f" (VXLAN to {p['vxlan_to']})" if p.get("vxlan_to") else "")
            t.add_row(n["name"] if first else "", kind if first else "", p["name"], p["address"], peer,
                      p["state"] if n["present"] else "[red]missing[/]", str(p.get("tx_bytes", "")),
                      str(p.get("rx_bytes", "")))
            first = False
    out.print(t)
    for h in s["helpers"]:
        state_text = "[green]running[/]" if h["running"] else "[red]not running[/]"
        out.print(f"{h['helper']} (pid {h['pid']}): {state_text}" + (f"; {h['note']}" if h["note"] else ""),
                  highlight=False)


@cli.command(hidden=True)
@click.argument("lab", required=False)
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_context
def inspect(ctx, lab, as_json):
    """containerlab's `clab inspect`: labctl's is `labctl status` (this runs it).

    \b
    Example:
      labctl inspect ls        # the same as: labctl status ls
    """
    ctx.forward(status)


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
    from labctl import lifecycle as labmod
    labmod.require_root("labctl exec")
    from labctl.lifecycle import targets
    lab = labmod.default_lab(lab_name)
    argv = labmod.backend_of(lab).exec_argv(targets.node(labmod.load_plan(lab), node), list(command), interactive=True)
    os.execvp(argv[0], argv)  # an argv list: nothing the user typed goes through a shell


@cli.command()
@click.argument("node")
@click.argument("dest")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
@click.option("--sport", "sports", type=click.IntRange(0, 65535), multiple=True, default=[49152], show_default=True,
              help="UDP source port of the flow (RoCEv2 derives it from the QP pair); give it again for more flows")
@click.option("--dport", type=click.IntRange(0, 65535), default=4791, show_default=True,
              help="UDP destination port (4791 = RoCEv2)")
@click.option("--qp", type=click.IntRange(0, 7), default=0, show_default=True,
              help="which QP of the pair the packets belong to: their BTH destination QP, which ecmp-qp hashes")
@click.option("--dscp", type=click.IntRange(0, 63), default=None,
              help="the packets' DSCP, which te: rules match (default: 26, RoCE data, to port 4791; else 0)")
def route(node, dest, lab_name, sports, dport, qp, dscp):
    """Show the path a UDP flow takes, hop by hop, as each switch's ECMP hash decides it.

    DEST is a node name or an address. Give several --sport values to see flows spread over spines,
    one line per flow.
    On kernels before 6.11 the switches place packets by labctl's own seeded hash (see `labctl
    doctor`): this command computes it, where `ip route get` inside a switch would not. In a lab
    with lb: (docs/load-balancing.md) each router that chose among next hops says why, in its
    mode: the hash's inputs (ecmp, ecmp-qp with the QP), the flow's flowlet and when it may move
    (flowlet), the uplinks in turn (spray), the uplinks' depths now (adaptive). A router whose
    te: rules steer the packet (by --dscp and --dport) names the rule and the path it chose.

    \b
    Example:
      sudo labctl route srv1-gpu0 srv2-gpu1 --sport 49152
      sudo labctl route srv1-gpu0 srv2-gpu1 --sport 49152 --sport 49153 --sport 49154
      sudo labctl route srv1-gpu0 srv2-gpu1 --qp 1
    """
    from labctl import lifecycle as labmod
    p = labmod.load_plan(labmod.default_lab(lab_name))
    dqpn = labmod.dest_qp(p, node, dest, qp)
    for sport in sports:
        hops = labmod.trace_path(p, node, dest, sport, dport, qp=dqpn, dscp=dscp)
        path = " -> ".join(h["node"] + (f" ({h['out']})" if h["out"] else "") for h in hops)
        qp_text = f" qp {qp} (BTH dest QP {dqpn:#08x})" if any(h.get("why") and not h.get("te") for h in hops) else ""
        click.echo(f"udp sport {sport} dport {dport}{qp_text}: {path}")
        for h in hops:
            if h.get("why"):
                click.echo(f"  {h['why']}")


@cli.command()
@click.argument("lab", required=False)
@click.option("--fabric", help="only this fabric (default: every fabric)")
@click.option("--sample", type=click.IntRange(min=1), metavar="N",
              help="ping N random pairs instead of all (a 1,024-GPU lab has over a million)")
@click.option("--seed", type=int, default=1, show_default=True, help="which random pairs --sample takes")
def pingall(lab, fabric, sample, seed):
    """Ping every host from every other host, over each fabric they share (like Mininet's pingall).

    Exits non-zero if any pair cannot reach the other. On a large lab, --sample N checks N pairs
    drawn at random (the same N for the same --seed): a sampled check, not a proof for every pair.
    In a lab whose exec: lines set the addresses (a containerlab file), the pairs are those the
    lab's own routing connects, hop by hop as each node's kernel routes them.

    \b
    Example:
      sudo labctl pingall ls
      sudo labctl pingall ls --fabric backend
      sudo labctl pingall big --sample 200
    """
    from labctl import lifecycle as labmod
    name = labmod.default_lab(lab, positional=True)
    p = labmod.load_plan(name)
    tried, failed = labmod.pingall(p, fabric, sample=sample, seed=seed, backend=labmod.backend_of(name))
    for a, b in failed:
        click.echo(f"  {a} -> {b}: no reply")
    of = f" (a random sample, seed {seed})" if sample else ""
    if any(not n.numbered for n in p.nodes):
        of += " (its exec lines number it: the pairs its own routing connects)"
    click.echo(f"pingall {p.lab}: {tried - len(failed)}/{tried} pairs reachable{of}"
               + (f"; {labmod.why_none(p, fabric)}" if not tried else ""))
    if failed or not tried:
        raise SystemExit(1)



@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("target", metavar="NODE:PORT")
@click.argument("bpf", nargs=-1, metavar="[-- FILTER]")
@click.option("-w", "out", default=None, help="pcapng file to write ('-' for stdout); default NODE_PORT.pcapng")
@click.option("--snaplen", type=int, default=128, show_default=True,
              help="bytes kept per frame: 128 keeps all RoCE headers (BTH, RETH, AETH), though Wireshark's "
                   "summary then calls cut frames malformed; 0 = whole frames")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
def capture(target, bpf, out, snaplen, lab_name):
    """Capture a lab port to pcapng (Ctrl-C stops), or stream it into Wireshark.

    NODE may also be one end of a WAN line (wire<link>.a or .b, port fibre): the only place an
    encrypted WAN shows ESP. The filter is a capture filter (pcap syntax) after `--`.

    \b
    Example:
      sudo labctl capture leaf1:srv1-gpu0 -- udp port 4791 or ether proto 0x8808
      sudo labctl capture spine1:leaf1 -w - | wireshark -k -i -
      tshark -r leaf1_srv1-gpu0.pcapng --disable-protocol rpcordma   # RoCE as RRoCE, PFC as MAC Control
    """
    import subprocess
    from labctl import lifecycle as labmod
    from labctl.lifecycle.capture import command, file_name, open_output
    from labctl.lifecycle.targets import capture_point
    labmod.require_root("labctl capture")
    plan = labmod.load_plan(labmod.default_lab(lab_name))
    ns, port = capture_point(plan, target)
    path = out or file_name(target)
    if path != "-":
        click.echo(f"capturing {target} to {path} (Ctrl-C to stop)", err=True)
    import signal
    from labctl.errors import LabError
    # Ctrl-C is how a capture ends: a shell's background job starts with SIGINT ignored, which
    # dumpcap would inherit and Python would keep, so both would run on past the user's Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out_fd = None if path == "-" else open_output(path)
    try:
        p = subprocess.Popen(command(ns, port, snaplen, " ".join(bpf)), stdout=out_fd, stderr=subprocess.PIPE)
    finally:
        if out_fd is not None:
            os.close(out_fd)
    relay = _pass_stderr(p)
    try:
        code = p.wait()
    except (KeyboardInterrupt, SystemExit) as stop:    # Ctrl-C, or SIGTERM (the CLI's handler)
        p.send_signal(signal.SIGINT)   # dumpcap flushes and closes the file on SIGINT (a kill would lose the tail)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()                   # a dumpcap deaf to SIGINT never outlives the command
            p.wait()
            raise LabError(f"dumpcap did not stop within 10 s of Ctrl-C and was killed; {path} may lack "
                           f"its last frames", "capture again; if it recurs, run dumpcap by hand in the node: "
                           f"sudo ip netns exec {ns} dumpcap -i {port}") from None
        if isinstance(stop, SystemExit):
            raise
    else:
        raise SystemExit(code)
    finally:
        relay.join(timeout=2)      # dumpcap's last words, before this process may exit


def _pass_stderr(p):
    """dumpcap's messages, but its "File: -": labctl, not dumpcap, names the file (it writes to our pipe)."""
    import sys
    import threading

    def relay():
        for line in p.stderr:
            if line.strip() != b"File: -":
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
    thread = threading.Thread(target=relay, daemon=True)
    thread.start()
    return thread


@cli.command(name="lb")
@click.argument("settings", nargs=-1, metavar="[TARGET=MODE ...]")
@click.option("--lab", "lab_name", help="the lab (needed when several are up)")
def lb_cmd(settings, lab_name):
    """Show or change how the routers balance load, while the lab runs (docs/load-balancing.md).

    TARGET is all, a tier (leaf: routers with an end host below them, spine: the others) or a
    router; MODE is ecmp, ecmp-qp, flowlet:GAP (fabric time, e.g. flowlet:50us), spray or
    adaptive. The lab must name lb: in its file (routing.lb: ecmp hashes the 5-tuple with the lab's
    seed, in labctl's program, not the kernel's hash): that is what puts the program on every router. Without TARGET=MODE, each router's mode.

    \b
    Example:
      sudo labctl lb
      sudo labctl lb leaf=spray
      sudo labctl lb leaf=flowlet:50us spine=ecmp
    """
    from labctl import lifecycle as labmod
    from labctl.errors import LabError
    from labctl.kernel import lb
    from labctl.plan.lb import describe, tier
    lab = labmod.default_lab(lab_name)
    plan = labmod.load_plan(lab)
    from labctl.lifecycle.balance import checked
    wanted = []
    for setting in settings:            # every setting checked before any is made
        target, sep, mode = setting.partition("=")
        if not sep:
            raise LabError(f"{setting!r} is not TARGET=MODE", "e.g. leaf=spray")
        checked(plan, target, mode)
        wanted.append((target, mode))
    for target, mode in wanted:
        labmod.require_root("labctl lb")
        changed = labmod.set_lb(lab, plan, target, mode)
        click.echo(f"{mode}: {', '.join(changed) or 'no router'}")
    if settings:
        return
    by_name = {n.name: n for n in plan.nodes}
    routers = lb.routers(plan)
    if not routers:
        click.echo(f"lab {plan.lab} names no lb: its routers use the kernel's ECMP hash (or labctl's, "
                   "before Linux 6.11)")
    for n in routers:
        ups = f", spreading over {', '.join(n.flow_hash.group)}" if n.flow_hash.group else ""
        click.echo(f"{n.name} ({tier(n, by_name)}): {describe(n.flow_hash, plan.dilation)}{ups}")

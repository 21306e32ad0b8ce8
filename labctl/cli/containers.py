"""`labctl engine` (the Docker engine labctl starts when none runs) and `labctl image` (node images
built from Debian packages, with no registry)."""
from __future__ import annotations

import json

import click
from rich.table import Table

from labctl.cli.base import cli, out


@cli.group()
def engine():
    """The Docker engine that runs container nodes.

    `labctl up` starts one when a lab has container nodes and none answers, and the last `down`
    stops it again. It runs with Docker's iptables rules, bridge and forwarding off, so it never
    touches the host's firewall or Linux bridges.

    \b
    Example:
      sudo labctl engine start     # start it now and keep it (until `labctl engine stop`)
      sudo labctl engine status
    """


@engine.command("start")
def engine_start():
    """Start dockerd (if no engine answers) and keep it running.

    \b
    Example:
      sudo labctl engine start     # kept until `labctl engine stop`, whatever labs come and go
    """
    from labctl.containers import engine as eng
    from labctl.lifecycle.labs import require_root
    require_root("labctl engine start")
    had = eng.answering()
    eng.ensure(auto=False).close()
    out.print("the Docker engine was already running" if had else f"dockerd started (log: {eng.LOG})",
              highlight=False)


@engine.command("stop")
@click.option("--force", is_flag=True, help="stop it even if containers still run on it")
def engine_stop(force):
    """Stop the dockerd that labctl started (never one it did not start).

    \b
    Example:
      sudo labctl engine stop
    """
    from labctl.containers import engine as eng
    from labctl.lifecycle.labs import require_root
    require_root("labctl engine stop")
    out.print("dockerd stopped" if eng.stop(force=force) else "labctl started no dockerd that still runs",
              highlight=False)


@engine.command("status")
@click.option("--json", "as_json", is_flag=True, help="print it as JSON, for scripts")
def engine_status(as_json):
    """Is an engine answering, and did labctl start it?

    \b
    Example:
      labctl engine status
    """
    from labctl.containers import engine as eng
    st = eng.status()
    if as_json:
        click.echo(json.dumps(st, indent=1))
        return
    who = "started by labctl" + (" for a lab (stops with the last down)" if st["auto"] else "") \
        if st["started_by_labctl"] else "not started by labctl"
    state = f"answering on {st['socket']}, Docker {st.get('version')}" if st["answering"] else "not running"
    out.print(f"Docker engine: {state}; {who}" + ("" if st["dockerd"] else "; dockerd is not installed"),
              highlight=False)


@cli.group()
def image():
    """Node images built from Debian packages (no registry needed).

    \b
    Example:
      sudo labctl image build host     # iproute2, ping, tcpdump, iperf3: image labctl/host
      sudo labctl image build frr      # Debian's FRR: image labctl/frr
      labctl image list
    A node uses one with `image: labctl/host`. Builds are cached by content: building again
    does nothing until the recipe changes (--force rebuilds).

    \b
    Example:
      labctl image list
      sudo labctl image build frr
    """


@image.command("build")
@click.argument("name")
@click.option("--force", is_flag=True, help="build again even if the image is present")
@click.option("--mirror", help="the Debian mirror (default: $LABCTL_DEBIAN_MIRROR or deb.debian.org)")
def image_build(name, force, mirror):
    """Build image NAME (host or frr) with debootstrap and `docker import`.

    \b
    Example:
      sudo labctl image build host       # about a minute from a local Debian mirror
      sudo labctl image build frr --force
    """
    from labctl.containers import images
    from labctl.lifecycle.labs import require_root
    require_root("labctl image build")
    images.recipe(name)
    tag, built, seconds = images.build(name, force=force, mirror=mirror,
                                       say=lambda m: out.print(f"  {m}", highlight=False))
    out.print(f"built {tag} in {seconds:.0f} s (also labctl/{name}:latest)" if built
              else f"{tag} is present (cached; --force rebuilds)", highlight=False)


@image.command("list")
def image_list():
    """The images labctl can build, and whether each is in the engine.

    \b
    Example:
      labctl image list
    """
    from labctl.containers import images
    t = Table()
    for col in ("name", "image", "present", "what"):
        t.add_column(col)
    for row in images.listing():
        present = {True: "yes", False: "no", None: "? (no engine running)"}[row["present"]]
        t.add_row(row["name"], row["tag"], present, row["description"])
    out.print(t)

"""The labctl command group, shared options and error handling."""
from __future__ import annotations

import os
import sys

import click
from rich.console import Console

from labctl import __version__
from labctl.errors import LabError
from labctl.names import terminal_safe

# Written to a file or a pipe, rich would wrap tables at 80 columns and cut their cells ("leaf1:spin…"):
# there, lines are as wide as they need (up to a generous 240; COLUMNS still wins when set)
PIPED_WIDTH = 240
def _width(stream) -> int | None:
    try:
        return None if stream.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH
    except (AttributeError, ValueError):      # closed (`labctl ... >&-`): rich decides
        return None


out = Console(width=_width(sys.stdout))
err = Console(stderr=True, width=_width(sys.stderr))

SET_HELP = "override a template variable (or a dotted key of a plain lab), e.g. --set spines=4; repeatable"
TEMPLATES_HELP = "a directory of your own templates, searched before the bundled ones; repeatable"
KIND_MAP_HELP = ("containerlab files: run a network OS's nodes as frr (a Linux router on labctl/frr), linux "
                 "(a plain namespace) or bridge, e.g. --kind-map nokia_srlinux=frr; its own configuration is not "
                 "translated; repeatable")
IMAGE_MAP_HELP = ("containerlab files: run a public image as a local one, e.g. --image-map frrouting/frr=labctl/frr "
                  "(well-known images are mapped by default, with a note); repeatable")


TOPO_TRUST_HELP = ("with --topo FILE: read (run) a Mininet topology file that is not root's alone; labctl runs "
                   "it as root to read it, as `mn --custom` does")


def clab_maps(kind_map, image_map):
    """The ImportMaps of --kind-map and --image-map, checked before anything is read."""
    from labctl.topology import clabmaps
    return clabmaps.parse(kind_map, image_map)


def placement_options(f):
    """--hosts and --spread: place a lab's nodes over the machines of labctl's cluster."""
    f = click.option("--spread", default="server", show_default=True, type=click.Choice(["server", "zone", "node"]),
                     help="with --hosts: server keeps each server (its GPUs and NVLink switch) on one machine, "
                          "the fabric on the first; zone deals zones; node deals every node")(f)
    return click.option("--hosts", metavar="M1,M2,...", help="run the nodes on these machines of `labctl cluster "
                        "status` (over the lab file's placement:); links between machines become VXLAN")(f)


def hosts_list(hosts: str | None) -> list[str] | None:
    return [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None


def clab_map_options(f):
    """--kind-map and --image-map, for every command that reads a lab file."""
    f = click.option("--image-map", "image_map", multiple=True, metavar="IMAGE=IMAGE", help=IMAGE_MAP_HELP)(f)
    return click.option("--kind-map", "kind_map", multiple=True, metavar="KIND=TARGET", help=KIND_MAP_HELP)(f)


TOPO_HELP = ("read a Mininet topology instead, written as for `mn --topo` (NAME[,ARG...][,KEY=VALUE...]): "
             "NAME from FILE's `topos` or a Topo class in FILE (this runs FILE's Python), or with no "
             "FILE Mininet's own single,N  linear,K[,N]  tree,DEPTH[,FANOUT]")


class LabctlGroup(click.Group):
    """Prints LabError as a one-line message with its fix, and exits with its code (2 for bad input)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LabError as exc:
            # its text may quote an engine, a container or a file: nothing in it may drive the terminal
            print(f"error: {terminal_safe(str(exc))}", file=sys.stderr)
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



"""The maps that let a containerlab file as people write it run on labctl's own parts.

- An **image map** replaces a public image by a local one, since labctl reaches no registry:
  `--image-map frrouting/frr=labctl/frr`. A well-known public image (FRR, network-multitool,
  alpine, ...) is mapped by default, with a note; `--image-map IMAGE=IMAGE` keeps one as written.
- A **kind map** runs a network OS's node as something labctl can run: `--kind-map nokia_srlinux=frr`
  (a Linux router on labctl/frr), `--kind-map ceos=linux` (a plain namespace) or `=bridge`. The
  topology's shape (nodes, names, links) is kept; the NOS's own configuration is not translated,
  and a note says so.

An image is matched by its repository path without registry host, tag or digest: a map key
`frrouting/frr` matches `quay.io/frrouting/frr:10.5.1`, and a key `network-multitool` matches
`ghcr.io/hellt/network-multitool` (a key with no `/` matches the last path element).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from labctl.errors import InputError, Where

KIND_TARGETS = {
    "frr": "a Linux router on labctl/frr (FRR started in it, no NOS configuration)",
    "linux": "a plain namespace (a Linux host with the node's links)",
    "bridge": "labctl's L2 bridge",
}
DEFAULT_IMAGE_MAP = {
    "frrouting/frr": "labctl/frr",
    "network-multitool": "labctl/host",
    "netshoot": "labctl/host",
    "alpine": "labctl/host",
    "busybox": "labctl/host",
    "debian": "labctl/host",
    "ubuntu": "labctl/host",
}
_NAME = re.compile(r"[a-z0-9][a-z0-9._/:@-]{0,254}")
_KIND = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")


@dataclass(frozen=True)
class ImportMaps:
    kinds: dict = field(default_factory=dict)      # containerlab kind -> one of KIND_TARGETS
    images: dict = field(default_factory=dict)     # image repository -> image

    def image(self, image: str) -> tuple[str, bool]:
        """(the image to run, whether a map changed it)."""
        repo = repository(image)
        for table in (self.images, DEFAULT_IMAGE_MAP):
            for key, to in table.items():
                if repo == key or ("/" not in key and repo.rsplit("/", 1)[-1] == key):
                    if repository(to) == key:          # IMAGE=IMAGE: keep it as written
                        return image, False
                    return to, to != image
        return image, False


def repository(image: str) -> str:
    """`quay.io/frrouting/frr:10.5.1` -> `frrouting/frr`; `alpine@sha256:...` -> `alpine`."""
    name = image.split("@", 1)[0]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    last = parts[-1].split(":", 1)[0]
    return "/".join(parts[:-1] + [last]).lower()


def parse(kind_map=(), image_map=()) -> ImportMaps:
    """--kind-map and --image-map values (each FROM=TO), checked before anything is read."""
    kinds, images = {}, {}
    for item in kind_map:
        src, sep, to = str(item).partition("=")
        if not sep or not _KIND.fullmatch(src) or to not in KIND_TARGETS:
            raise InputError(Where("--kind-map", key=str(item)), f"{item!r} is not KIND=TARGET with a target "
                             "labctl runs", "write e.g. --kind-map nokia_srlinux=frr; targets: "
                             + "; ".join(f"{k}: {v}" for k, v in KIND_TARGETS.items()))
        kinds[src] = to
    for item in image_map:
        src, sep, to = str(item).partition("=")
        if not sep or not _NAME.fullmatch(src) or not _NAME.fullmatch(to):
            raise InputError(Where("--image-map", key=str(item)), f"{item!r} is not IMAGE=IMAGE",
                             "write e.g. --image-map frrouting/frr=labctl/frr (registry host and tag are ignored "
                             "on the left)")
        images[repository(src)] = to
    return ImportMaps(kinds, images)

"""Who may make labctl run code as root: the trust model of a lab file.

labctl runs as root, and a lab file can hand parts of the host to whoever wrote it. These are its
powerful lines:
- an `exec:` line on a node without an image: it runs on this host, as root, in the node's netns
  (with the host's file system and processes in reach);
- a `binds:` entry: a host path mounted into a container (read-write unless `:ro`);
- an `image:` labctl did not build: someone else's code runs in a container labctl cables;
- `privileged: true` on a container node: Docker's privileged mode, every capability and device
  and no seccomp or AppArmor, so root in the container is root on this machine;
- each `cap_add:` entry: a capability added to the container's (containers/nodes.py gives every
  node a fixed set; this is more); and SYS_ADMIN, which an FRR image is given for its zebra.

Only a node with `image:` may say `privileged` or `cap_add` (an image-less node is a namespace of
this machine's). Host-network nodes cannot be written at all: labctl cables each node's own
netns, and a node in the host's would be the host (the containerlab importer refuses
`network-mode: host` and `container:...` with that reason).

A lab with powerful lines comes up only if it is trusted: the lab file, the directory holding it,
and every file of the template tree it was rendered from are owned by root and writable by no one
else (a sticky directory such as /tmp counts as safe) — or the user says `--trust`. Otherwise
`up` stops before it creates anything, listing each powerful line and both ways on. `labctl plan`
lists the powerful lines always.

Some binds are refused even with `--trust` (plan/software.py): the host's system trees, a
container runtime's socket, and a relative path or symlink that leaves the lab's directory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from labctl import paths as paths_module
from labctl.capabilities import FRR_EXTRA, is_frr
from labctl.errors import InputError, Where

OWN_IMAGES = ("labctl/",)          # images `labctl image build` makes from Debian packages
MAX_TEMPLATE_FILES = 4096


@dataclass(frozen=True)
class Powerful:
    where: str      # file:line: key
    what: str       # exec-on-host, bind or image
    text: str
    why: str

    def line(self) -> str:
        return f"{self.where}: {self.what}: {self.text}  ({self.why})"


def powerful(loaded) -> list[Powerful]:
    """Every powerful line of a loaded lab, in file order."""
    smap, out = loaded.source, []
    for name, node in loaded.topology.nodes.items():
        if node.image is None:
            for i, line in enumerate(node.exec):
                out.append(Powerful(str(smap.where(("nodes", name, "exec", i))), "exec on the host", line,
                                    f"runs as root on this machine, in {name}'s netns"))
        else:
            if not node.image.startswith(OWN_IMAGES):
                out.append(Powerful(str(smap.where(("nodes", name, "image"))), "image", node.image,
                                    "runs code labctl did not build, in a container it cables"))
            for i, bind in enumerate(node.binds):
                mode = "read-only" if bind.endswith(":ro") else "read-write"
                out.append(Powerful(str(smap.where(("nodes", name, "binds", i))), "bind", bind,
                                    f"mounts a host path into {name}, {mode}"))
            if node.privileged:
                out.append(Powerful(str(smap.where(("nodes", name, "privileged"))), "privileged", "true",
                                    f"{name}'s container gets every capability and device, without seccomp or "
                                    "AppArmor: root in it is root on this machine"))
            for cap in (c for c in FRR_EXTRA if is_frr(node.image) and c not in node.cap_add):
                out.append(Powerful(str(smap.where(("nodes", name, "image"))), "capability", f"{cap} (FRR)",
                                    f"given to {name}'s FRR container because zebra asks for it; with it the "
                                    "container can mount a /proc of its own and write the host's kernel sysctls "
                                    "(kernel.core_pattern): root in it is root on this machine"))
            for i, cap in enumerate(node.cap_add):
                out.append(Powerful(str(smap.where(("nodes", name, "cap_add", i))), "capability", cap,
                                    f"added to {name}'s container, beyond the set labctl gives a node"))
    return out


def untrusted(loaded) -> list[str]:
    """Why the lab's own files are not trusted (empty: they are): each file or directory that
    someone other than root owns or may write."""
    # an experiment's `set:` can write any key of the lab (an exec line, an image): its file is
    # the lab's as much as the lab file is
    paths = [Path(loaded.file)]
    # each file by what was read (its owner and mode then, every directory above it now): a name
    # checked later could be another file (a link flipped between the two)
    read = [why for read_as in filter(None, (loaded.read_as, *loaded.set_by))
            for why in paths_module.untrusted_tree(Path(read_as["path"]), read_as["stat"])]
    if loaded.template_root is not None:
        root = Path(loaded.template_root)
        paths.append(root)
        for k, p in enumerate(root.rglob("*")):
            if k >= MAX_TEMPLATE_FILES:
                return [f"{root}: more than {MAX_TEMPLATE_FILES} files in the template tree"]
            paths.append(p)
    return list(dict.fromkeys(read + paths_module.untrusted(paths)))


def require(loaded, trusted_by_flag: bool) -> list[Powerful]:
    """Refuse a lab whose powerful lines nobody vouched for, before anything is built."""
    lines = powerful(loaded)
    if not lines or trusted_by_flag:
        return lines
    reasons = untrusted(loaded)
    if not reasons:
        return lines
    listing = "\n    ".join(p.line() for p in lines)
    raise InputError(Where(str(loaded.file)),
                     f"this lab runs code as root on this machine, and its files are not trusted "
                     f"({'; '.join(reasons[:3])}{'; ...' if len(reasons) > 3 else ''}). Its powerful lines:\n    "
                     f"{listing}",
                     "read those lines, then either make the files root's and writable by no one else "
                     "(sudo chown root: FILE && sudo chmod go-w FILE, and the same for its directory and "
                     "templates), or say you trust it: labctl up --trust ...")


def as_dicts(lines: list[Powerful]) -> list[dict]:
    return [asdict(p) for p in lines]

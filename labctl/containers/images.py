"""Node images built from Debian packages, for machines that reach no image registry.

`labctl image build host|frr`: debootstrap a minimal Debian with the recipe's packages into a
scratch directory, strip what a node never reads (docs, man pages, apt lists), and `docker import`
the tree. The image is tagged `labctl/<name>:<key>` and `labctl/<name>:latest`, where the key
is a hash of everything that decides its content (recipe, suite, builder version), so a second
build on the same machine finds it and does nothing, and a changed recipe builds anew.

Traffic agents, captures and pings run from the host in the node's netns, so an image needs none
of them: these are for the user (ping, tcpdump, iperf3 inside a container) and for FRR. A switch
agent can run inside the node (LABCTL_SWITCH_AGENTS=node): for it the images carry Python,
numpy and libnftables.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.containers import engine
from labctl.errors import LabError

SUITE = "bookworm"
BUILDER_VERSION = 1
CACHE_DIR = Path("/var/cache/labctl/images")
STRIP = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/lib/apt/lists",
         "var/cache/apt/archives", "var/cache/debconf/templates.dat-old", "var/log")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    packages: tuple[str, ...]
    cmd: tuple[str, ...] = ("sleep", "infinity")


# what a switch agent needs to run inside the node (dataplane/agents.py): Python with numpy, and
# libnftables; labctl's own code is bound in read-only when the agent starts
AGENT_PACKAGES = ("python3-numpy", "libnftables1")
RECIPES = {r.name: r for r in (
    Recipe("host", "an end host: iproute2, ping, tcpdump, iperf3; Python for its switch agent",
           ("iproute2", "iputils-ping", "tcpdump", "iperf3", "procps") + AGENT_PACKAGES),
    Recipe("frr", "a router: Debian's FRR (zebra, bgpd, bfdd, vtysh) with iproute2, ping and tcpdump; "
                  "Python for its switch agent",
           ("frr", "iproute2", "iputils-ping", "tcpdump", "procps") + AGENT_PACKAGES),
)}


def key(recipe: Recipe) -> str:
    text = json.dumps({"recipe": asdict(recipe), "suite": SUITE, "builder": BUILDER_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def tag(recipe: Recipe) -> str:
    return f"labctl/{recipe.name}:{key(recipe)}"


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise LabError(f"there is no image recipe {name!r}", f"labctl builds: {', '.join(RECIPES)}")
    return RECIPES[name]


def present(client, recipe: Recipe) -> bool:
    try:
        client.images.get(tag(recipe))
        return True
    except engine.sdk().errors.ImageNotFound:
        return False


def build(name: str, force: bool = False, mirror: str | None = None, say=print) -> tuple[str, bool, float]:
    """(tag, whether it was built now, seconds). Starts the engine if none runs, and stops it again
    afterwards if it started it for this."""
    r = recipe(name)
    with engine.lease():
        had_engine = engine.answering()
        client = engine.ensure(auto=True)
        try:
            return _build(client, r, force, mirror, say)
        except engine.sdk().errors.DockerException as exc:
            raise LabError(f"the Docker engine failed while building {tag(r)}: {exc}") from None
        except OSError as exc:     # requests' ConnectionError: the engine went away
            raise LabError(f"lost the Docker engine while building {tag(r)}: {exc}") from None
        finally:
            client.close()
            if not had_engine:
                from labctl.state import all_labs
                engine.release_if_idle(any(lab.journaled("container") for lab in all_labs()))


def _build(client, r: Recipe, force: bool, mirror: str | None, say) -> tuple[str, bool, float]:
    t0 = time.monotonic()
    if present(client, r) and not force:
        client.images.get(tag(r)).tag(f"labctl/{r.name}", "latest")
        return tag(r), False, time.monotonic() - t0
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise LabError("debootstrap is not installed", engine.INSTALL_HINT)
    mirror = mirror or os.environ.get("LABCTL_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE_DIR, prefix=f"build-{r.name}-") as scratch:
        root = Path(scratch) / "root"
        say(f"debootstrap {SUITE} with {', '.join(r.packages)} (from {mirror}) ...")
        log = Path(scratch) / "debootstrap.log"
        with open(log, "w") as out:
            done = subprocess.run([debootstrap, "--variant=minbase", f"--include={','.join(r.packages)}",
                                   SUITE, str(root), mirror], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, cwd="/")
        if done.returncode != 0:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise LabError(f"debootstrap failed (status {done.returncode}): {' / '.join(tail)}",
                           "check that the Debian mirror is reachable (LABCTL_DEBIAN_MIRROR picks another)")
        for rel in STRIP:
            shutil.rmtree(root / rel, ignore_errors=True)
        archive = Path(scratch) / "rootfs.tar"
        say(f"docker import as {tag(r)} ...")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(archive), "."], check=True,
                       stdin=subprocess.DEVNULL)
        changes = [f"CMD {json.dumps(list(r.cmd))}", f"LABEL labctl.recipe={r.name} labctl.key={key(r)}"]
        client.api.import_image_from_file(str(archive), repository=f"labctl/{r.name}", tag=key(r),
                                          changes=changes)
    client.images.get(tag(r)).tag(f"labctl/{r.name}", "latest")
    _remember_time(r, time.monotonic() - t0)
    return tag(r), True, time.monotonic() - t0


def recipe_of(image: str) -> Recipe | None:
    """The recipe that makes `image` (labctl/frr, labctl/frr:latest or its key tag), if labctl makes it."""
    repo, _, tag_ = image.partition(":")
    r = RECIPES.get(repo.removeprefix("labctl/")) if repo.startswith("labctl/") else None
    return r if r and tag_ in ("", "latest", key(r)) else None


def ensure_present(client, wanted: list[str], build: bool = True, progress=None) -> list[str]:
    """Build each labctl/* image of `wanted` the engine lacks (or, with build=False, refuse with the
    command that builds it); returns those built. An image labctl does not make is left to the node's
    start, which names it."""
    built = []
    for image in wanted:
        r = recipe_of(image)
        if r is None or _has(client, image):
            continue
        if not build:
            raise LabError(f"image {image} is not built yet on this machine (and --no-build was given)",
                           f"sudo labctl image build {r.name}   # {_expected_time(r)}")
        stage = f"build {image} ({_expected_time(r)})"
        print(f"labctl: building image {image} on first use ({_expected_time(r)}); "
              f"`labctl up --no-build` refuses instead", file=sys.stderr, flush=True)
        if progress:
            progress(stage, 0, 1)
        _build(client, r, False, None, say=lambda m: None)     # it records how long it took
        if progress:
            progress(stage, 1, 1)
        built.append(image)
    return built


def missing(client, nodes) -> list:
    """The nodes whose image the engine does not have (labctl's own are built before this)."""
    have: dict[str, bool] = {}
    for n in nodes:
        if n.container.image not in have:
            have[n.container.image] = _has(client, n.container.image)
    return [n for n in nodes if not have[n.container.image]]


def missing_fix(image: str) -> str:
    from labctl.topology.clabmaps import repository
    repo = repository(image)
    return (f"`docker load -i FILE` it into this engine (or `docker pull {image}` where a registry is reachable); "
            f"or run the node on labctl's own image: `image: labctl/host` (or labctl/frr), or for a containerlab "
            f"file `--image-map {repo}=labctl/host`")


def _has(client, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except engine.sdk().errors.ImageNotFound:
        return False


def _expected_time(r: Recipe) -> str:
    try:
        last = float((CACHE_DIR / f"{r.name}.seconds").read_text())
        return f"about {last / 60:.0f} min, as the last build here took"
    except (OSError, ValueError):
        return "debootstrap of Debian's packages: a few minutes the first time"


def _remember_time(r: Recipe, seconds: float) -> None:
    try:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        (CACHE_DIR / f"{r.name}.seconds").write_text(f"{seconds:.0f}")
    except OSError:
        pass


def listing() -> list[dict]:
    """Each recipe, and whether its current image is in the engine (None: no engine answers)."""
    client = engine.client() if engine.answering() else None
    try:
        return [{"name": r.name, "tag": tag(r), "description": r.description,
                 "present": present(client, r) if client else None} for r in RECIPES.values()]
    finally:
        if client:
            client.close()

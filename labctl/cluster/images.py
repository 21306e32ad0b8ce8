"""Images on the machines, with no registry: copied from this host's default engine.

A Swarm worker runs a service from the images its own engine holds (labctl's images are built
here, never pushed). Each image the machine lacks is streamed out of the source engine
(`docker save`) straight into the machine's engine (`docker load`), with no file in between, and
gets every tag it has at the source (labctl/host:latest and its content key labctl/host:<key>).
"""
from __future__ import annotations

import time

from labctl.cluster.machines import Machine, client
from labctl.errors import LabError

CHUNK = 4 << 20


def _image_id(c, ref: str) -> str | None:
    from labctl.containers import engine
    try:
        return c.images.get(ref).id
    except engine.sdk().errors.ImageNotFound:
        return None


def ensure_images(machine: Machine, images: list[str], source_client, progress=None) -> dict[str, float]:
    """Copy each of `images` that `machine`'s engine lacks (or holds in another version) from
    `source_client`'s engine. Returns {image: seconds} for those copied; an image already there
    costs one lookup."""
    target = client(machine)
    copied = {}
    try:
        for ref in images:
            src_id = _image_id(source_client, ref)
            if src_id is None:
                raise LabError(f"image {ref} is not in the source engine, so it cannot be copied to {machine.name}",
                               "`sudo labctl image build host|frr` builds labctl's images")
            if _image_id(target, ref) == src_id:
                continue
            stage = f"copy {ref} to {machine.name}"
            if progress:
                progress(stage, 0, 1)
            t0 = time.monotonic()
            src = source_client.images.get(ref)
            try:
                # a generator as the body: requests sends it chunked, so the image is never held whole
                answer = target.api.load_image(src.save(chunk_size=CHUNK, named=ref if ":" in ref else f"{ref}:latest"),
                                               quiet=True)
                for msg in answer or ():     # the load is done only once its answer is read to the end
                    if isinstance(msg, dict) and msg.get("error"):
                        raise RuntimeError(msg["error"])
            except Exception as exc:     # APIError, or the stream cut (either engine went away)
                raise LabError(f"machine {machine.name} (engine {machine.engine}): loading {ref} failed: "
                               f"{getattr(exc, 'explanation', None) or exc}",
                               "check the machine's engine and its free disk space") from None
            loaded = target.images.get(src_id)
            for t in src.tags:           # `save` carries one name: give the copy every tag it has here
                repo, _, tag = t.rpartition(":")
                loaded.tag(repo, tag)
            copied[ref] = time.monotonic() - t0
            if progress:
                progress(stage, 1, 1)
        return copied
    finally:
        target.close()


def default_images_client(wanted: list[str], progress=None, build: bool = True):
    """A client of this host's default engine holding `wanted` (labctl's images are built there
    if missing, unless `build` is False: `up --no-build` refuses with the command to run), and
    whether the engine was started for this (the caller releases it then)."""
    from labctl.containers import engine
    from labctl.containers import images as builder
    had = engine.answering()
    c = engine.ensure(auto=True, progress=progress)
    try:
        builder.ensure_present(c, wanted, build=build, progress=progress)
    except BaseException:
        c.close()
        release_default(not had)
        raise
    return c, not had


def release_default(started: bool) -> None:
    """Stop the default engine again if it was started for the copy and no lab needs it."""
    if not started:
        return
    from labctl.containers import engine
    from labctl.state import all_labs
    engine.release_if_idle(any(lab.journaled("container") for lab in all_labs()))

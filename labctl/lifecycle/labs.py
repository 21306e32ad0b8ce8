"""Finding a lab: by its name or the topology file it was built from, never by a path to its record."""
from __future__ import annotations

import os
from pathlib import Path

from labctl import backends, paths, state
from labctl.errors import LabError, NotRootError
from labctl.plan.model import LabPlan
from labctl.topology.load import render_topology
from labctl.topology.yamlpos import load_yaml


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise NotRootError(what)


def find_lab(name_or_file: str) -> state.LabDir:
    """A lab by name, or by the topology file it was built from (the file need not exist for a name).

    Never by a path to its record: `down` deletes what it finds, so `labctl down /` or `down ..`
    must name nothing."""
    if state.valid_lab_name(name_or_file):
        lab = state.lab_dir(name_or_file)
        if lab.path.is_dir():
            return lab
    path = Path(name_or_file)
    if paths.is_file(path):
        # the labs whose record says they were built from this file (a Mininet .py is never run here)
        # first the labs whose record says they were built from this file; only if none, the
        # lab its name: says, if that one was built from it (a Mininet .py is never run here)
        built = [d for d in state.all_labs() if d.read_state().get("topology_file") == str(path.resolve())]
        if len(built) == 1:
            return built[0]
        if built:
            raise LabError(f"{len(built)} labs were built from {name_or_file}: {', '.join(d.name for d in built)}",
                           "name the one you mean")
        lab_name = None
        if path.suffix != ".py":
            try:
                text, smap, _ = render_topology(path)
                data, _ = load_yaml(text, smap.file)
            except LabError:
                data = None
            lab_name = data.get("name") if isinstance(data, dict) else None
            if state.valid_lab_name(lab_name) and state.lab_dir(lab_name).path.is_dir():
                recorded = state.lab_dir(lab_name).read_state().get("topology_file")
                if recorded in (None, str(path.resolve())):
                    return state.lab_dir(lab_name)
                raise LabError(f"lab {lab_name!r}, the name {name_or_file} gives, was built from {recorded}",
                               f"`labctl down {lab_name}` if that is the one you mean")
        raise LabError(f"the lab of {name_or_file}" + (f" ({lab_name!r})" if lab_name else "") + " is not up",
                       f"`labctl up {name_or_file}` to build it; `labctl status` lists running labs")
    running = [d.name for d in state.all_labs()]
    what = "no lab named" if state.valid_lab_name(name_or_file) else "neither a lab name nor a topology file:"
    raise LabError(f"{what} {name_or_file!r}",
                   f"running labs: {', '.join(running)}" if running else "no lab is up; `labctl up FILE`")


def default_lab(name: str | None, positional: bool = False) -> state.LabDir:
    """The lab `name`, or the one lab up. `positional`: the command takes the lab as its argument
    (`labctl status NAME`), not as --lab NAME, and the fix says so."""
    if name:
        return find_lab(name)
    labs = state.all_labs()
    if len(labs) == 1:
        return labs[0]
    if not labs:
        raise LabError("no lab is up", "`labctl up topologies/leaf-spine.yml`")
    # every lab is offered alike: the first by name may be someone else's (a `tc set` on it changes it)
    if positional:
        import click
        ctx = click.get_current_context(silent=True)
        how = " or ".join(f"`{ctx.command_path if ctx else 'labctl COMMAND'} {d.name}`" for d in labs[:6])
    else:
        how = " or ".join(f"--lab {d.name}" for d in labs[:6])
    raise LabError(f"{len(labs)} labs are up ({', '.join(d.name for d in labs)})",
                   f"say which: {how}{' or ...' if len(labs) > 6 else ''} (`labctl status` says what each was built from)")


def load_plan(lab: state.LabDir) -> LabPlan:
    try:
        return LabPlan.from_dict(lab.read_plan())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LabError(f"the record of lab {lab.name!r} is unreadable ({exc})",
                       "`labctl clean --all` removes it") from None


def change_record(lab: state.LabDir, what: str, change) -> None:
    """`change(plan)` applied to the lab's plan as recorded now, under the state lock, and written
    back: another command may have changed the record since the caller read it, and two commands
    changing a running lab must not undo each other."""
    with state.lock(what):
        recorded = load_plan(lab)
        change(recorded)
        lab.write_plan(recorded.to_dict())


def backend_of(lab: state.LabDir):
    """The backend that built the lab, as its record says."""
    return backends.get(lab.read_state().get("backend", "netns"))

"""An experiment resolved against its lab's plan before anything is built: every capture port,
tc: and link: target, traffic class and workload participant names something the lab has, every
tc: setting is one `tc set` takes, and a train: step's degrees fit its participants. A miss is an
InputError at the experiment's own key."""
from __future__ import annotations

from labctl.errors import InputError, LabError
from labctl.experiment.spec import Experiment
from labctl.lifecycle import targets
from labctl.lifecycle.runtime import settings_from_text
from labctl.plan.model import LabPlan
from labctl.traffic import flows, train_run
from labctl.traffic.run import participants, victim_ranks


def resolve(exp: Experiment, smap, plan: LabPlan, workloads: dict) -> None:
    """Raise the first name or setting of `exp` its lab's `plan` has no place for."""
    for k, c in enumerate(exp.captures):
        _located(smap, ("captures", k, "port"), targets.capture_point, plan, c.port)
    for k, step in enumerate(exp.steps):
        if step.tc is not None:
            _tc(smap, ("steps", k, "tc"), plan, step.tc)
        elif step.link is not None:
            (state, target), = step.link.items()
            _located(smap, ("steps", k, "link", state), targets.port, plan, target)
        elif step.lb is not None:
            _lb(smap, ("steps", k, "lb"), plan, step.lb)
        elif k in workloads:
            _workload(smap, ("steps", k, "run"), plan, workloads[k], inline=isinstance(step.run, dict))


def _lb(smap, key: tuple, plan: LabPlan, settings: dict[str, str]) -> None:
    """Each target names routers that run labctl's load balancing, and each can take its mode."""
    from labctl.lifecycle.balance import mode_error, routers_for
    for target, mode in settings.items():
        # a lab without lb:, or a tier without such routers, is routers_for's located error
        for node in _located(smap, key + (target,), routers_for, plan, target):
            why = mode_error(plan, node, mode)
            if why:
                raise InputError(smap.where(key + (target,)), f"{node.name}: {why}",
                                 "modes: ecmp, ecmp-qp, flowlet:GAP (e.g. flowlet:50us), spray, adaptive")


def _located(smap, key: tuple, check, *args):
    try:
        return check(*args)
    except LabError as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(smap.where(key), exc.message, exc.fix) from None


def _tc(smap, key: tuple, plan: LabPlan, tc) -> None:
    node, iface = _located(smap, key + ("target",), targets.port, plan, tc.target, False)
    if tc.class_ is not None:
        ports = [iface] if iface is not None else node.interfaces
        names = sorted({c.name for i in ports for c in i.shaping.classes})
        if tc.class_ not in names:
            raise InputError(smap.where(key + ("class",)), f"{tc.target} has no traffic class {tc.class_!r}",
                             f"its classes: {', '.join(names) or 'none (the lab defines no qos: classes)'}")
    if tc.rate is not None and iface is None:
        raise InputError(smap.where(key + ("rate",)), "rate: needs a port",
                         f"write target: NODE:PORT, e.g. {node.name}:{node.interfaces[0].name}" if node.interfaces else None)
    _located(smap, key, settings_from_text, tc.settings())
    if tc.rate is None and not tc.settings():
        raise InputError(smap.where(key), "tc: changes nothing", "give rate, ecn, kmin/kmax/pmax, pfc or xoff/xon")


def _workload(smap, key: tuple, plan: LabPlan, loaded, inline: bool) -> None:
    """Its participants, victim and flows name the lab's nodes, and a train: step's degrees fit its
    participants; an inline workload's miss is located in the experiment (its file is a copy the
    user never wrote)."""
    w = loaded.workload
    try:
        ranks = participants(plan, loaded) if w.collective is not None or w.fsdp is not None or w.train else []
        ranks += [r for r in victim_ranks(plan, loaded) if r not in ranks]    # as the run counts them
        if w.train is not None:
            train_run.step_config(plan, loaded, ranks)
        flows.sequences(plan, w.flows, str(loaded.file))
    except InputError as exc:
        if not inline:
            raise
        raise in_experiment(smap, key, exc) from None


def in_experiment(smap, key: tuple, exc: InputError) -> InputError:
    """An inline workload's error, located at its key inside the experiment's step `key` (the
    workload file labctl wrote from it is a copy the user never saw)."""
    dotted = (exc.where.key if exc.where is not None else None) or ""
    inner = tuple(int(p) if p.isdigit() else p for p in dotted.replace("[", ".").replace("]", "").split(".") if p)
    return InputError(smap.where(key + inner), exc.message, exc.fix)

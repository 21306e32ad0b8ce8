"""The experiment file, validated whole before anything is built.

    name: incast-pfc
    description: an 8:1 incast with PFC on, then off
    topology: ../topologies/leaf-spine.yml      # a lab file, relative to this file
    set: [scale_up=false]                       # template variables (like `up --set`)
    sweep: {var: distance, values: [1, 10, 25]} # optional: the whole experiment once per value
    captures:
      - {port: leaf1:srv1-gpu0, snaplen: 128, filter: "udp port 4791 or ether proto 0x8808"}
    steps:
      - run: ../workloads/incast.yml            # or an inline workload mapping
        as: pfc_on
      - tc: {target: leaf1, pfc: "off"}         # labctl tc set
      - link: {down: leaf1:spine1}              # or {up: ...}
      - lb: {leaf: spray}                       # labctl lb: TARGET (all, leaf, spine, a router): MODE
      - wait: 1s
    expect:
      - {run: pfc_on, metric: lossless_drops, op: "==", value: 0, what: "PFC keeps RoCE lossless"}
      - {run: qps4, metric: uplink_imbalance, op: "<", than: {run: qps1}, what: "..."}
      - {run: ar, metric: time_s, trend: increasing, what: "longer WAN, slower all-reduce"}   # over a sweep
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from labctl.errors import InputError
from labctl.paths import is_file
from labctl.topology.load import input_error
from labctl.topology.yamlpos import load_yaml_file
from labctl.units import parse_duration_ns

METRICS = {
    "time_s": "lab seconds of the run's collectives (summed over iterations and sizes)",
    "busbw": "bus bandwidth, lab GB/s (mean over sizes)",
    "ideal_busbw": "the alpha-beta bound's bus bandwidth, lab GB/s",
    "ratio": "time / alpha-beta ideal (1.0 = at the bound)",
    "wrong": "transfers (slices) the receivers never got or got wrong (#wrong)",
    "gaps": "RoCE packets lost (PSN gaps at receivers)",
    "retransmits": "RoCE packets resent by go-back-N",
    "ce_marks": "CE-marked RoCE packets seen by receivers",
    "drops": "packets dropped by any queue during the run",
    "lossless_drops": "packets dropped by lossless-class queues during the run",
    "frontend_drops": "packets dropped by the frontend fabric's queues (lossy) during the run",
    "ecn_marked": "packets switches marked CE during the run",
    "pfc_tx": "PFC frames sent during the run",
    "pfc_rx": "PFC frames received during the run",
    "max_depth": "deepest lossless-class queue seen (bytes)",
    "uplink_imbalance": "max / mean bytes over a leaf's uplinks (1 = balanced), worst leaf",
    "link_imbalance": "max / mean bytes over a leaf's spine links, either direction, from the ports' counters "
                      "(1 = balanced), worst leaf",
    "reordered_share": "data packets that arrived after a later one of their QP / data packets (first transmissions)",
    "naks": "NAKs (PSN sequence error) the receivers sent",
    "retransmitted_bytes": "bytes on the wire that go-back-N sent again",
    "ring_collisions": "ring hops that ECMP sent out of a switch port another hop of the ring also takes (0 "
                       "with no collision, or where paths are not fixed per flow)",
    "predicted_imbalance": "link_imbalance as the hash predicts it from `labctl route`'s trace of every pair's "
                           "QPs (0 where paths are per packet)",
    "wan_bytes": "bytes the WAN line delivered during the run",
    "tcp_goodput_bps": "TCP flows' bytes x 8 / their span, lab bit/s",
    "tcp_retransmits": "segments the TCP flows' senders retransmitted (their kernel's count)",
    "fsdp_bytes_ratio": "FSDP: bytes sent per rank / the strategy's formula (FULL_SHARD 3(n-1)/n x model, "
                        "SHARD_GRAD_OP 2(n-1)/n, HYBRID_SHARD 3(g-1)/g + 2(r-1)/(r g)) (1 = as FSDP predicts)",
    "victim_time_s": "lab seconds the workload's victim: transfer took, beside the collectives",
    "wan_max_depth": "deepest queue at a DCI router's WAN egress (bytes)",
    "wan_drops": "packets the DCI routers' WAN egress queues dropped during the run",
    "zone_pfc_tx": "PFC frames sent inside the zones (every port not on the WAN) during the run",
    "wan_port_bytes": "bytes the WAN links' ports sent during the run (both ends, port counters)",
    "wan_long_share": "share of the WAN links' bytes (port counters) on paths longer than the shortest",
    "wan_short_bytes": "bytes the shortest WAN paths' ports sent during the run (both ends)",
    "wan_long_bytes": "bytes the longer WAN paths' ports sent during the run (both ends)",
    "wan_bound_s": "the model's floor for the run's WAN part: on the slowest path that carried bytes, its "
                   "busier direction's bytes at its lab rate plus its lab one-way delay",
    "wan_expected_bytes": "train: the bytes the steps' schedule puts on the WAN, on the wire (warm-up steps included, as the ports count them)",
    "duty_cycle": "train: per GPU, the share of the step its transfers were in flight (mean)",
    "wan_hidden_fraction": "train: the share of the WAN's busy time during which some GPU computed",
    "model_step_s": "train: the alpha-beta model's step time for this lab (labctl/estimate/train.py)",
    "model_flip_km": "train: WAN km at which the model has this placement and the one with its outer two "
                     "dimensions swapped tie (-1: no flip below 20000 km)",
    "model_swapped_step_s": "train: the model's step time with the outer two dimensions swapped",
    "ep_hot_ratio": "train: the hottest expert-parallel receiver's bytes / the mean",
    "ep_hot_expected": "train: that ratio as the routing skew gives it",
    "ep_busy_s": "train: lab seconds during which expert-parallel all-to-all traffic was in flight",
}
Duration = Annotated[int, BeforeValidator(parse_duration_ns)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Capture(Strict):
    port: str = Field(description="NODE:PORT to capture on")
    snaplen: int = Field(128, ge=0, le=65535, description="bytes kept per frame (0: all); 128 keeps BTH/RETH/AETH")
    filter: str = Field("", description="a capture filter, e.g. udp port 4791")


SWEEP_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")


class Sweep(Strict):
    var: str = Field(description="the template variable to sweep")
    values: list[Any] = Field(description="its values, one run of the steps each")

    @field_validator("values")
    @classmethod
    def _names_a_run(cls, values: list) -> list:
        if len(values) < 2:
            raise ValueError(f"a sweep runs the steps once per value, so it needs two values or more (it has "
                             f"{len(values)}); for one, write it under set: instead (set: [VAR=VALUE])")
        # each value names its runs and their directories (ar@5): a path there could escape the run dir
        for v in values:
            if isinstance(v, (dict, list)) or not SWEEP_VALUE.fullmatch(str(v)) or ".." in str(v):
                raise ValueError(f"sweep value {v!r} must be a plain number or word (letters, digits, '.', "
                                 "'+', '-'; it names the runs)")
        return values


Size = str | int
OnOff = Literal["on", "off"] | bool


class TcStep(Strict):
    """`labctl tc set` as a step: what it changes, on a node (every port) or on NODE:PORT."""
    target: str = Field(description="NODE or NODE:PORT")
    class_: str | None = Field(None, alias="class", description="a traffic class's name (default: every class)")
    rate: str | None = Field(None, description="the port's rate, e.g. 10Gbit (needs NODE:PORT)")
    ecn: OnOff | None = None
    kmin: Size | None = None
    kmax: Size | None = None
    pmax: float | None = Field(None, ge=0, le=1)
    pfc: OnOff | None = None
    xoff: Size | None = None
    xon: Size | None = None
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def settings(self) -> dict:
        """The settings it changes, as `tc set` takes them (no target, class or rate)."""
        return self.model_dump(exclude={"target", "class_", "rate"}, exclude_none=True)


class Step(Strict):
    run: str | dict | None = Field(None, description="a workload file (relative to this file) or an inline workload")
    as_: str | None = Field(None, alias="as", pattern=r"^[a-z][a-z0-9_]*$", description="the run's name")
    tc: TcStep | None = Field(None, description="labctl tc set: {target, rate, ecn, kmin, kmax, pmax, pfc, xoff, xon, class}")
    link: dict[Literal["down", "up"], str] | None = Field(None, description="{down: NODE:PORT} or {up: NODE:PORT}")
    wait: Duration | None = Field(None, description="sleep this long (lab time), e.g. 1s")
    lb: dict[str, str] | None = Field(None, min_length=1, description="labctl lb: {TARGET: MODE}, TARGET all, leaf, "
                                                                      "spine or a router (the lab must name lb:)")
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="after")
    def exactly_one(self):
        given = [k for k in ("run", "tc", "link", "wait", "lb") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("a step is one of run:, tc:, link:, wait: or lb:" + (f" (got {', '.join(given)})" if given else ""))
        if self.as_ and self.run is None:
            raise ValueError("as: names a run: step")
        return self


class Other(Strict):
    run: str
    metric: str | None = None


class Gap(Strict):
    """Between two runs: the share of the way from one's metric to the other's that a run went."""
    from_: str = Field(alias="from", description="the run the way starts at (share 0)")
    to: str = Field(description="the run it ends at (share 1)")
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Expectation(Strict):
    run: str
    metric: str
    op: Literal["==", "!=", "<", "<=", ">", ">="] | None = None
    value: float | None = None
    than: Other | None = None
    factor: float = 1.0
    trend: Literal["increasing", "decreasing"] | None = None
    share_of: Gap | None = Field(None, description="compare (from - run) / (from - to) of the metric with value:, "
                                                   "e.g. how much of a better run's gain this one got")
    what: str = ""

    @model_validator(mode="after")
    def one_form(self):
        if self.trend is None and (self.op is None or (self.value is None) == (self.than is None)):
            raise ValueError("an expectation needs op: with value: or than:, or trend: over a sweep")
        if self.share_of is not None and (self.value is None or self.trend is not None):
            raise ValueError("share_of: compares the share with value:, e.g. op: \">=\", value: 0.5")
        return self


class Experiment(Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    description: str = ""
    topology: str = Field(description="the lab file, relative to this file")
    set: list[str] = Field(default_factory=list, description="template variables, VAR=VALUE")
    sweep: Sweep | None = None
    captures: list[Capture] = Field(default_factory=list)
    steps: list[Step] = Field(min_length=1)
    expect: list[Expectation] = Field(default_factory=list)
    figure: list[str] = Field(default_factory=list, description="metrics drawn run by run in the figure that "
                                                                "opens the report (summary.png)")


def load_experiment(path: Path, opened: dict | None = None) -> tuple[Experiment, str, object]:
    """`opened` gets the file that was read (yamlpos.read_input): its `set:` is judged by it."""
    text, data, smap = load_yaml_file(path, "experiment", "name:, topology:, steps:", "experiments/incast-pfc.yml",
                                      opened)
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        raise input_error(exc, smap, Experiment) from None
    _check(exp, path, smap)
    return exp, text, smap


def _check(exp: Experiment, path: Path, smap) -> None:
    """Cross-key checks: files exist, runs named once, expectations name known runs and metrics."""
    base = path.parent
    if not is_file(base / exp.topology):
        raise InputError(smap.where(("topology",)), f"topology file {exp.topology!r} not found (relative to {base})",
                         "give the lab file's path relative to the experiment file")
    names = []
    for k, step in enumerate(exp.steps):
        if isinstance(step.run, str) and not is_file(base / step.run):
            raise InputError(smap.where(("steps", k, "run")), f"workload file {step.run!r} not found",
                             "give the workload's path relative to the experiment file, or write it inline")
        if step.run is not None:
            name = step.as_ or f"run{k + 1}"
            if name in names:
                raise InputError(smap.where(("steps", k)), f"two runs are named {name!r}", "give each run its own as:")
            names.append(name)
    points = [str(v) for v in exp.sweep.values] if exp.sweep else []
    for k, metric in enumerate(exp.figure):
        if metric not in METRICS:
            raise InputError(smap.where(("figure", k)), f"unknown metric {metric!r}", "metrics: " + ", ".join(METRICS))
    for k, e in enumerate(exp.expect):
        refs = [(e.run, e.metric, ("expect", k))]
        if e.than:
            refs.append((e.than.run, e.than.metric or e.metric, ("expect", k, "than")))
        if e.share_of:
            refs += [(e.share_of.from_, e.metric, ("expect", k, "share_of", "from")),
                     (e.share_of.to, e.metric, ("expect", k, "share_of", "to"))]
        for run, metric, key in refs:
            base_name, _, point = run.partition("@")
            if base_name not in names:
                raise InputError(smap.where(key + ("run",)), f"expectation names run {run!r}, which no step makes",
                                 f"runs: {', '.join(names) or 'none'} (name a run step with as:)")
            if point and point not in points:
                raise InputError(smap.where(key + ("run",)), f"{run!r}: {point!r} is not a sweep value",
                                 f"sweep values: {', '.join(points) or 'no sweep'}")
            if metric not in METRICS:
                raise InputError(smap.where(key + ("metric",)), f"unknown metric {metric!r}",
                                 "metrics: " + ", ".join(METRICS))
        if e.trend and not exp.sweep:
            raise InputError(smap.where(("expect", k, "trend")), "trend: needs a sweep: to go over",
                             "add sweep: {var: ..., values: [...]} or compare runs with op:")

"""Workload files: which collective (or FSDP step), what sizes, which ranks, with what options.

    name: allreduce
    collective: all_reduce            # all_reduce, reduce_scatter, all_gather, all_to_all, broadcast,
                                      # sendrecv, incast, hier_all_reduce
    sizes: {begin: 1MB, end: 64MB, factor: 2}   # or sizes: [1MB, 8MB], like nccl-tests -b -e -f
    iterations: 1
    warmup: 0
    participants: all                 # all | rail:N | [node, node, ...]
    root: srv1-gpu0                   # broadcast source / incast receiver (default: the first)
    options: {qps: 1, sport: per-qp, slice: 512KiB, channels: 1, cnp: false, alpha: 0us}

or, instead of collective and sizes, one FSDP step:

    fsdp: {model: llama-7b, strategy: FULL_SHARD, group_size: 4, prefetch: true, scale: 0.001}

and, with either or alone, TCP flows on the frontend (or wherever the nodes' addresses lead):

    flows:
      - {kind: checkpoint, from: gpus, to: storage, size: 20MB, count: 2, period: 5s}
      - {kind: dataset, from: stor1, to: [srv1-gpu0], size: 50MB, background: true}
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from labctl.errors import InputError
from labctl.topology.load import input_error
from labctl.topology.yamlpos import load_yaml_file
from labctl.traffic import fsdp, train_spec
from labctl.traffic.schedule import COLLECTIVES
from labctl.units import parse_duration_ns, parse_rate, parse_size

Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0, description="a size such as 16MB or 512KiB")]


# operations one workload plays (sizes x (warmup + iterations), or FSDP stages x steps): each is
# scheduled before the first is sent, and 10,000 of the smallest already take minutes of lab time
MAX_OPS = 10_000


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sweep(Strict):
    begin: Size
    end: Size
    factor: float = Field(2.0, gt=1, description="the multiplier between sizes, > 1")


class Options(Strict):
    @model_validator(mode="after")
    def _ooo_needs_reliable(self):
        if "ooo" in self.model_fields_set and not self.reliable:
            raise ValueError("ooo: chooses what a reliable receiver does with a packet that overtook another; "
                             "without reliable: true every packet is kept and none is asked for again "
                             "(add reliable: true)")
        return self

    qps: int = Field(1, ge=1, le=8, description="queue pairs per connection, 1..8 (messages round-robin)")
    sport: Literal["per-qp", "fixed", "random"] = Field(
        "per-qp", description="UDP source port: per-qp (from the QP pair, as Linux), fixed, or random per message")
    slice: Size = Field(512 * 1024, description="pipeline slice (NCCL step) size, default 512KiB")
    channels: int = Field(1, ge=1, le=16, description="parallel rings, 1..16")
    cnp: bool = Field(False, description="receivers act as DCQCN notification points (send CNPs on CE)")
    dcqcn: bool = Field(False, description="senders run DCQCN rate control on CNPs (pair it with cnp: true)")
    dcqcn_rate_ai: Annotated[int, BeforeValidator(parse_rate)] = Field(
        40_000_000, description="DCQCN additive increase step, real-fabric rate (default 40Mbit, docs/design.md §6)")
    dcqcn_rate_hai: Annotated[int, BeforeValidator(parse_rate)] = Field(
        400_000_000, description="DCQCN hyper increase step, real-fabric rate (default 400Mbit)")
    dcqcn_g: float = Field(1 / 256, gt=0, le=1, description="DCQCN α gain g (default 1/256)")
    dcqcn_timer: Annotated[int, BeforeValidator(parse_duration_ns)] = Field(
        55_000, description="DCQCN rate-increase and α timer, real-fabric time (default 55us)")
    dcqcn_byte_counter: Size = Field(10_000_000, description="DCQCN byte counter (default 10MB)")
    reliable: bool = Field(False, description="go-back-N: NAK (syndrome 0x60) and resend, so loss shows as "
                                              "retransmissions instead of missing bytes")
    ooo: Literal["drop", "tolerate"] = Field(
        "drop", description="reliable receivers: drop (go-back-N: a packet ahead of the next PSN is dropped and "
                            "NAKed, so reordering costs retransmissions) or tolerate (placed where it belongs, "
                            "as NICs that support spraying do: a window of PSNs ahead, the highest contiguous ACKed)")
    cnp_interval: Annotated[int, BeforeValidator(parse_duration_ns)] = Field(
        50_000, description="minimum real-fabric time between CNPs per QP, default 50us")
    alpha: Annotated[int, BeforeValidator(parse_duration_ns)] = Field(
        0, description="per-step latency of the α-β model in real-fabric time, e.g. 5us")
    timeout: Annotated[int, BeforeValidator(parse_duration_ns)] | None = Field(
        None, description="per operation in lab time (default: give up once nothing has arrived for "
                          "2 x ideal, at least 10 s, or at 100 x ideal + 60 s)")


class Flow(Strict):
    """TCP transfers, one connection each: `count` per source, `period` apart, to the `to` nodes in turn."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    kind: Literal["checkpoint", "dataset", "telemetry", "bulk"] = Field(
        "bulk", description="what it stands for: checkpoint (GPU -> storage), dataset (storage -> GPU), ...")
    from_: str | list[str] = Field(alias="from", description="sources: gpus, storage, a node, or a list of nodes")
    to: str | list[str] = Field(description="destinations: gpus, storage, a node, or a list of nodes")
    size: Size = Field(description="bytes per transfer, e.g. 20MB")
    count: int = Field(1, ge=1, le=10000, description="transfers per source")
    period: Annotated[int, BeforeValidator(parse_duration_ns)] = Field(
        0, description="lab time between one source's transfer starts (0: back to back), e.g. 2s")
    background: bool = Field(False, description="repeat until the collectives end (a saturating load)")
    congestion: Literal["cubic", "reno", "bbr"] = Field("cubic", description="TCP congestion control")


class Victim(Strict):
    """A transfer played beside every collective, to measure what the collective's congestion does to it."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: str = Field(alias="from", description="the sending GPU")
    to: str = Field(description="the receiving GPU")
    size: Size = Field(8_000_000, description="bytes, e.g. 8MB")


class FsdpSpec(Strict):
    model: str | None = Field(None, description="a preset: " + ", ".join(fsdp.PRESETS))
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=64)
    params_per_layer: int | None = Field(None, ge=1)
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "bf16"
    strategy: Literal[fsdp.STRATEGIES] = "FULL_SHARD"
    group_size: int | None = Field(None, ge=1, description="HYBRID_SHARD shard group size")
    group_by: Literal["zone", "server"] | None = Field(
        None, description="HYBRID_SHARD: shard inside each zone (building) or server, replicate across them")
    prefetch: bool = True
    scale: float = Field(1e-3, gt=0, le=1, description="multiply every size by this so a step fits the lab")


class Workload(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="lower-case letters, digits, '-' and '_'")
    description: str = ""
    collective: Literal[COLLECTIVES] | None = Field(None, description="one of " + ", ".join(COLLECTIVES))
    algorithm: Literal["ring", "tree", "hier", "auto"] = Field(
        "ring", description="all_reduce's algorithm: ring, tree (NCCL's double binary tree), hier (NVLink "
                            "first), auto (the fastest by the α-β bound, as NCCL's tuner picks)")
    sizes: Sweep | list[Size] | Size | None = None
    iterations: int = Field(1, ge=1, le=MAX_OPS)
    warmup: int = Field(0, ge=0, le=MAX_OPS)
    participants: str | list[str] = Field("all", description="all, rail:N, or a list of GPU node names")
    root: str | None = None
    options: Options = Options()
    fsdp: FsdpSpec | None = None
    train: train_spec.TrainSpec | None = Field(None, description="one Megatron-style training step (docs/parallelism.md)")
    flows: list[Flow] = Field(default_factory=list, description="TCP flows started with the collectives")
    victim: Victim | None = Field(None, description="a sendrecv played beside each collective; its time is reported")

    @field_validator("algorithm")
    @classmethod
    def algorithm_of_all_reduce(cls, value, info):
        if value != "ring" and info.data.get("collective") != "all_reduce":
            raise ValueError(f"{value} applies to collective: all_reduce (the others are rings)")
        return value

    @model_validator(mode="after")
    def one_kind(self):
        if sum(x is not None for x in (self.collective, self.fsdp, self.train)) > 1:
            raise ValueError("give one of collective: (with sizes:), fsdp: or train:, not several")
        if self.collective is None and self.fsdp is None and self.train is None and not self.flows:
            raise ValueError("give collective: (with sizes:), fsdp:, train: or flows:")
        if self.collective and self.sizes is None:
            raise ValueError("a collective needs sizes: (e.g. sizes: 16MB, or {begin: 1MB, end: 64MB})")
        return self

    def size_count(self) -> int:
        """len(size_list()), without making the list (a factor of 1.0000001 would make millions)."""
        if isinstance(self.sizes, Sweep):
            import math
            if self.sizes.end < self.sizes.begin:
                return 0
            return int(math.log(self.sizes.end / self.sizes.begin * (1 + 1e-9)) / math.log(self.sizes.factor)) + 1
        return len(self.sizes) if isinstance(self.sizes, list) else 1

    def size_list(self) -> list[int]:
        if isinstance(self.sizes, Sweep):
            out, s = [], float(self.sizes.begin)
            while s <= self.sizes.end * (1 + 1e-9):
                out.append(int(s))
                s *= self.sizes.factor
            return out
        if isinstance(self.sizes, list):
            return list(self.sizes)
        return [self.sizes]


@dataclass
class LoadedWorkload:
    workload: Workload
    file: Path
    text: str
    smap: object = None      # the file's SourceMap: locates errors found once the lab is known


def load_workload(file: str | Path) -> LoadedWorkload:
    path = Path(file)
    text, data, smap = load_yaml_file(path, "workload", "name:, collective:, sizes:", "workloads/allreduce.yml")
    try:
        w = Workload.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "value_error" and not err["loc"]:
            raise InputError(smap.where(()), err["msg"].removeprefix("Value error, "),
                             "see the workload format in README.md") from None
        raise input_error(exc, smap, Workload) from None
    if w.collective and w.sizes is not None:
        if w.size_count() == 0:
            raise InputError(smap.where(("sizes",)), "no sizes to play (an empty list, or a sweep whose end is "
                             "below its begin)", "give at least one size, e.g. sizes: 16MB")
        plays = w.size_count() * (w.warmup + w.iterations)
        if plays > MAX_OPS:
            key = "iterations" if w.size_count() <= MAX_OPS else "sizes"
            raise InputError(smap.where((key,)), f"{w.size_count():,} sizes x {w.warmup + w.iterations:,} iterations "
                             f"(warmup included) is {plays:,} operations; one workload plays at most {MAX_OPS:,}",
                             "fewer sizes (a larger factor:) or fewer iterations; split it into several workloads")
    if w.flows and not (w.collective or w.fsdp or w.train) and all(f.background for f in w.flows):
        raise InputError(smap.where(("flows", 0, "background")), "every flow is background: it repeats until "
                         "the collectives end, and this workload plays none, so the run would never end",
                         "give one flow a count: (and period:) instead, or add a collective: with sizes:")
    if w.fsdp:
        try:
            fsdp.model_from(w.fsdp.model, w.fsdp.layers, w.fsdp.hidden, w.fsdp.params_per_layer, w.fsdp.dtype)
        except ValueError as exc:
            raise InputError(smap.where(("fsdp",)), str(exc), "use a preset or give layers and hidden") from None
    if w.train:
        train_spec.check(w.train, smap.where)
    return LoadedWorkload(w, path, text, smap)

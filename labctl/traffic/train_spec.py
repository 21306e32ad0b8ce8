"""The `train:` key of a workload file, and the checks it gets before anything is built.

    train:
      model: llama-7b            # a preset (train_model.PRESETS) or layers/hidden/ffn/heads/experts/top_k
      layers: 4                  # any preset field may be overridden (fewer layers: a shorter step)
      degrees: {tp: 2, pp: 2, dp: 4, ep: 1}   # tp x pp x dp = participants; ep divides dp; tp divides
                                              # heads, kv_heads and ffn, pp the layers (Megatron)
      placement: [tp, pp, dp]    # innermost first: [tp, dp, pp] puts pp across zones
      micro_batches: 4
      micro_batch_size: 1
      seq_len: 4096
      sequence_parallel: false   # tp as all-gather + reduce-scatter instead of all-reduce, no gather of pp's receipts
      skew: uniform              # MoE routing: uniform, zipf:<s> or one weight per expert
      dp_shard: 2                # HSDP: shard over 2 dp ranks, all-reduce across the replicas
      dtype: bf16
      scale: 0.001               # every size and compute time x this, so a step fits the lab
      peak_tflops: 989           # the GPU's dense peak (H100 SXM bf16)
      mfu: 0.4
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from labctl.errors import InputError, Where
from labctl.traffic import train_model as tm
from labctl.traffic.train import TrainStep

DOC = "docs/parallelism.md"


def _help(what: str, example: str) -> str:
    """A field's description. A bad value's fix is "<key> is <description>" (labctl/topology/load.py's
    _field_help composes it), so each says what the key is, then what to write."""
    return f"{what}; write e.g. {example} (the train: format is in {DOC})"


def _shown(v) -> str:
    # a bad scalar is shown by the error itself ("(got 5)"), a list or mapping is not
    return f", not {v!r}" if isinstance(v, (list, dict)) else ""


def _placement(v):
    # checked whole, so a bad item is reported at placement: with its help, not at an index
    if not isinstance(v, list) or any(x not in ("tp", "pp", "dp") for x in v):
        raise ValueError("placement must be a list of tp, pp and dp" + _shown(v))
    return v


def _skew(v):
    # one message for both forms (a union's errors would name its branches, str and list[float])
    if isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                          for x in v)):
        return v
    raise ValueError("skew must be uniform, zipf:<s> or a list of numbers" + _shown(v))


class Degrees(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tp: int = Field(1, ge=1, le=1024, description=_help(
        "the tensor-parallel degree, a whole number from 1 to 1024 that divides heads, kv_heads and ffn", "tp: 2"))
    pp: int = Field(1, ge=1, le=256, description=_help(
        "the number of pipeline stages, a whole number from 1 to 256 that divides layers", "pp: 2"))
    dp: int | None = Field(None, ge=1, description=_help(
        "the data-parallel degree, with tp x pp x dp equal to the participants; left out, it is what tp x pp "
        "leave", "dp: 4"))
    ep: int = Field(1, ge=1, le=1024, description=_help(
        "the expert-parallel degree, a whole number that divides dp and the experts", "ep: 2"))


class TrainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description=_help(
        "a preset's name (" + ", ".join(tm.PRESETS) + "), or left out when layers and hidden are given",
        "model: llama-7b"))
    layers: int | None = Field(None, ge=1, le=1000, description=_help(
        "the number of transformer layers, a whole number from 1 to 1000", "layers: 4"))
    hidden: int | None = Field(None, ge=64, le=65536, description=_help(
        "the model's width, a whole number from 64 to 65536 that heads divides", "hidden: 4096"))
    ffn: int | None = Field(None, ge=64, description=_help(
        "the MLP's hidden size (per expert), a whole number of at least 64 that tp divides", "ffn: 11008"))
    heads: int | None = Field(None, ge=1, description=_help(
        "the number of attention (query) heads, a whole number that divides hidden", "heads: 32"))
    kv_heads: int | None = Field(None, ge=1, description=_help(
        "the number of key/value heads (query groups), a whole number that divides heads", "kv_heads: 8"))
    experts: int | None = Field(None, ge=1, le=1024, description=_help(
        "the experts of each MoE layer, a whole number from 1 (dense) to 1024", "experts: 8"))
    top_k: int | None = Field(None, ge=1, description=_help(
        "the experts each token is routed to, a whole number no larger than experts", "top_k: 2"))
    degrees: Degrees = Field(Degrees(), description=_help("a mapping of the parallel degrees",
                                                          "degrees: {tp: 2, pp: 2, dp: 4, ep: 1}"))
    placement: Annotated[list[str], BeforeValidator(_placement)] = Field(["tp", "pp", "dp"], description=_help(
        "the list of tp, pp and dp, each once, innermost first", "placement: [tp, pp, dp]"))
    micro_batches: int = Field(4, ge=1, le=256, description=_help(
        "the micro-batches of a step, a whole number from 1 to 256", "micro_batches: 4"))
    micro_batch_size: int = Field(1, ge=1, le=1024, description=_help(
        "the sequences in a micro-batch, a whole number from 1 to 1024", "micro_batch_size: 1"))
    seq_len: int = Field(4096, ge=1, le=1 << 20, description=_help(
        "the tokens of a sequence, a whole number from 1 to 1048576", "seq_len: 4096"))
    sequence_parallel: bool = Field(False, description=_help(
        "a switch, true for tp as all-gather + reduce-scatter (and pipeline receipts kept as 1/tp shards) or false "
        "for all-reduce (and each received micro-batch all-gathered over tp)", "sequence_parallel: true"))
    skew: Annotated[str | list[float], BeforeValidator(_skew)] = Field("uniform", description=_help(
        "the MoE routing: uniform, zipf:<s> or a list of one weight per expert", "skew: zipf:1.2"))
    dp_shard: int | None = Field(None, ge=1, description=_help(
        "the HSDP shard group, a number of dp ranks that divides dp (left out: all of dp)", "dp_shard: 2"))
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = Field("bf16", description=_help(
        "the element type, one of fp32, bf16, fp16 or fp8", "dtype: bf16"))
    scale: float = Field(1e-3, gt=0, le=1, description=_help(
        "the factor every size and compute time is multiplied by, a number above 0 and at most 1",
        "scale: 0.001"))
    peak_tflops: float = Field(989.0, gt=0, description=_help(
        "the GPU's dense peak in TFLOP/s, a number above 0", "peak_tflops: 989 (H100 SXM, bf16)"))
    mfu: float = Field(0.4, gt=0, le=1, description=_help(
        "the model FLOPs utilisation, a number above 0 and at most 1", "mfu: 0.4"))

    def transformer(self) -> tm.Transformer:
        return tm.transformer(self.model, layers=self.layers, hidden=self.hidden, ffn=self.ffn, heads=self.heads,
                              kv_heads=self.kv_heads, experts=self.experts, top_k=self.top_k, dtype=self.dtype)

    def step(self, n: int, dilation: float) -> TrainStep:
        g = self.degrees
        return TrainStep(self.transformer(), tm.degrees(n, g.tp, g.pp, g.dp, g.ep), tuple(self.placement),
                         self.micro_batches, self.micro_batch_size, self.seq_len, self.sequence_parallel,
                         self.skew, self.dp_shard, self.scale, self.peak_tflops * 1e12, self.mfu,
                         dilation * self.scale)


def _key(dotted: str) -> tuple:
    return ("train",) + tuple(dotted.split("."))


def check(spec: TrainSpec, where) -> None:
    """Every rule that needs no lab; `where(key path)` locates an error."""
    try:
        m = spec.transformer()
    except tm.ShapeError as exc:
        raise InputError(where(_key(exc.key)), str(exc), exc.fix) from None
    except ValueError as exc:
        raise InputError(where(("train", "model")), str(exc), "use a preset or give layers and hidden") from None
    if sorted(spec.placement) != ["dp", "pp", "tp"]:
        raise InputError(where(("train", "placement")), f"placement {spec.placement} must name tp, pp and dp "
                         "once each", "write e.g. [tp, pp, dp] (innermost first)")
    g = spec.degrees
    if g.dp is not None and g.dp % g.ep:
        raise InputError(where(_key("degrees.ep")), f"ep {g.ep} must divide dp {g.dp} (expert-parallel groups "
                         "are made of data-parallel ranks)", f"set ep to {tm.divisors(math.gcd(g.dp, m.experts))}")
    try:
        tm.check_shape(m, tm.Degrees(g.tp, g.pp, g.dp or g.ep, g.ep))
    except tm.ShapeError as exc:
        raise InputError(where(_key(exc.key)), str(exc), exc.fix) from None
    if g.dp is not None and spec.dp_shard is not None and g.dp % spec.dp_shard:
        raise InputError(where(("train", "dp_shard")), f"dp_shard {spec.dp_shard} must divide dp {g.dp}",
                         f"set dp_shard to {tm.divisors(g.dp)} (dp itself is plain FSDP/ZeRO)")
    try:
        tm.skew_weights(spec.skew, m.experts)
    except ValueError as exc:
        raise InputError(where(("train", "skew")), str(exc), "write uniform, zipf:1.2 or one weight per expert") \
            from None


def _near(n: int, k: int) -> str:
    """The multiples of k next to n, as a fix offers them: " (16 or 24)"; nothing when the next
    one is k itself (the fix has just named it)."""
    below, above = n // k * k, (n // k + 1) * k
    return f" ({below:,} or {above:,})" if below else "" if above == k else f" ({above:,})"


def step_for(spec: TrainSpec, n: int, dilation: float, where) -> TrainStep:
    """The step for `n` participants; an InputError at the key to change if it does not fit them."""
    g, shard = spec.degrees, spec.dp_shard
    tpp = g.tp * g.pp
    if g.dp is None and n % tpp:
        raise InputError(where(_key("degrees")), f"tp x pp = {g.tp} x {g.pp} = {tpp} does not divide the {n} "
                         "participants", f"choose tp and pp whose product divides {n}, or run on a multiple of "
                         f"{tpp} GPUs{_near(n, tpp)}")
    dp = n // tpp if g.dp is None else g.dp
    if tpp * dp != n:
        fit = f"leave dp out (it is then {n} / {tpp} = {n // tpp}), or " if n % tpp == 0 else ""
        raise InputError(where(_key("degrees")), f"tp x pp x dp = {g.tp} x {g.pp} x {dp} = {tpp * dp}, but there "
                         f"are {n} participants", f"{fit}choose degrees whose product is {n}")
    experts = spec.transformer().experts
    whence = f" (= {n} participants / tp x pp {tpp})" if g.dp is None else ""
    if dp % g.ep:
        raise InputError(where(_key("degrees.ep")), f"ep {g.ep} must divide dp {dp}{whence}",
                         f"set ep to {tm.divisors(math.gcd(dp, experts))}, or run on a multiple of tp x pp x ep = "
                         f"{tpp * g.ep:,} GPUs{_near(n, tpp * g.ep)}")
    if shard is not None and dp % shard:
        raise InputError(where(("train", "dp_shard")), f"dp_shard {shard} must divide dp {dp}{whence}",
                         f"set dp_shard to {tm.divisors(dp)}, or run on a multiple of tp x pp x dp_shard = "
                         f"{tpp * shard:,} GPUs{_near(n, tpp * shard)} to keep dp_shard {shard}")
    try:
        return spec.step(n, dilation)
    except ValueError as exc:       # check() has passed every other rule; kept located all the same
        raise InputError(where(_key("degrees")), str(exc), f"see the train: format in {DOC}") from None


def located(file: str, smap):
    return (lambda path: smap.where(path)) if smap is not None else (lambda path: Where(file, key=".".join(path)))

"""The `train:` key of a workload file, and the checks it gets before anything is built.

    train:
      model: llama-7b            # a preset (train_model.PRESETS) or layers/hidden/ffn/heads/experts/top_k
      layers: 4                  # any preset field may be overridden (fewer layers: a shorter step)
      degrees: {tp: 2, pp: 2, dp: 4, ep: 1}   # tp x pp x dp = participants; ep divides dp
      placement: [tp, pp, dp]    # innermost first: [tp, dp, pp] puts pp across zones
      micro_batches: 4
      micro_batch_size: 1
      seq_len: 4096
      sequence_parallel: false   # tp as all-gather + reduce-scatter instead of all-reduce
      skew: uniform              # MoE routing: uniform, zipf:<s> or one weight per expert
      dp_shard: 2                # HSDP: shard over 2 dp ranks, all-reduce across the replicas
      dtype: bf16
      scale: 0.001               # every size and compute time x this, so a step fits the lab
      peak_tflops: 989           # the GPU's dense peak (H100 SXM bf16)
      mfu: 0.4
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from labctl.errors import InputError, Where
from labctl.traffic import train_model as tm
from labctl.traffic.train import TrainStep

HINT = "see the train: format in docs/parallelism.md"


class Degrees(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tp: int = Field(1, ge=1, le=1024, description="tensor parallel")
    pp: int = Field(1, ge=1, le=256, description="pipeline stages")
    dp: int | None = Field(None, ge=1, description="data parallel (default: participants / (tp x pp))")
    ep: int = Field(1, ge=1, le=1024, description="expert parallel, divides dp")


class TrainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(None, description="a preset: " + ", ".join(tm.PRESETS))
    layers: int | None = Field(None, ge=1, le=1000)
    hidden: int | None = Field(None, ge=64, le=65536)
    ffn: int | None = Field(None, ge=64)
    heads: int | None = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=1)
    experts: int | None = Field(None, ge=1, le=1024)
    top_k: int | None = Field(None, ge=1)
    degrees: Degrees = Degrees()
    placement: list[Literal["tp", "pp", "dp"]] = Field(["tp", "pp", "dp"], description="innermost first")
    micro_batches: int = Field(4, ge=1, le=256)
    micro_batch_size: int = Field(1, ge=1, le=1024)
    seq_len: int = Field(4096, ge=1, le=1 << 20)
    sequence_parallel: bool = False
    skew: str | list[float] = Field("uniform", description="uniform, zipf:<s> or one weight per expert")
    dp_shard: int | None = Field(None, ge=1, description="HSDP shard group (dp ranks); default all of dp")
    dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "bf16"
    scale: float = Field(1e-3, gt=0, le=1, description="multiply every size and compute time by this")
    peak_tflops: float = Field(989.0, gt=0, description="GPU dense peak, TFLOP/s")
    mfu: float = Field(0.4, gt=0, le=1, description="model FLOPs utilisation")

    def transformer(self) -> tm.Transformer:
        return tm.transformer(self.model, layers=self.layers, hidden=self.hidden, ffn=self.ffn, heads=self.heads,
                              kv_heads=self.kv_heads, experts=self.experts, top_k=self.top_k, dtype=self.dtype)

    def step(self, n: int, dilation: float) -> TrainStep:
        g = self.degrees
        return TrainStep(self.transformer(), tm.degrees(n, g.tp, g.pp, g.dp, g.ep), tuple(self.placement),
                         self.micro_batches, self.micro_batch_size, self.seq_len, self.sequence_parallel,
                         self.skew, self.dp_shard, self.scale, self.peak_tflops * 1e12, self.mfu,
                         dilation * self.scale)


def check(spec: TrainSpec, where) -> None:
    """Every rule that needs no lab; `where(key path)` locates an error."""
    try:
        m = spec.transformer()
    except ValueError as exc:
        raise InputError(where(("train", "model")), str(exc), "use a preset or give layers and hidden") from None
    if sorted(spec.placement) != ["dp", "pp", "tp"]:
        raise InputError(where(("train", "placement")), f"placement {spec.placement} must name tp, pp and dp "
                         "once each", "write e.g. [tp, pp, dp] (innermost first)")
    g = spec.degrees
    d = tm.Degrees(g.tp, g.pp, g.dp or g.ep, g.ep)
    try:
        if g.dp is not None and g.dp % g.ep:
            raise ValueError(f"ep {g.ep} must divide dp {g.dp} (expert-parallel groups are made of "
                             "data-parallel ranks)")
        tm.check_shape(m, d)
    except ValueError as exc:
        raise InputError(where(("train", "degrees")), str(exc), "choose degrees that divide the model") from None
    if g.dp is not None and spec.dp_shard is not None and g.dp % spec.dp_shard:
        raise InputError(where(("train", "dp_shard")), f"dp_shard {spec.dp_shard} must divide dp {g.dp}",
                         "pick a divisor of dp (dp itself is plain FSDP/ZeRO)")
    try:
        tm.skew_weights(spec.skew, m.experts)
    except ValueError as exc:
        raise InputError(where(("train", "skew")), str(exc), "write uniform, zipf:1.2 or one weight per expert") \
            from None


def step_for(spec: TrainSpec, n: int, dilation: float, where) -> TrainStep:
    """The step for `n` participants; an InputError if the degrees do not multiply to it."""
    try:
        step = spec.step(n, dilation)
        if spec.dp_shard is not None and step.degrees.dp % spec.dp_shard:
            raise ValueError(f"dp_shard {spec.dp_shard} must divide dp {step.degrees.dp}")
    except ValueError as exc:
        raise InputError(where(("train", "degrees")), str(exc),
                         "make tp x pp x dp equal the participants (or leave dp out)") from None
    return step


def located(file: str, smap):
    return (lambda path: smap.where(path)) if smap is not None else (lambda path: Where(file, key=".".join(path)))

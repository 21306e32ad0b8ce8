"""One FSDP training step as a sequence of collectives (PyTorch FSDP's communication pattern).

FULL_SHARD, per layer: all-gather of the parameters in forward, again in backward, then a
reduce-scatter of the gradients: 3(n−1)/n × model bytes per rank. SHARD_GRAD_OP keeps parameters
after forward: 2(n−1)/n. HYBRID_SHARD shards inside groups of g ranks (a building, a server) and
all-reduces each gradient shard across the n/g replicas, so only that crosses between groups.
A step is a list of stages; collectives in one stage run at the same time (prefetch overlaps the
next layer's all-gather with this layer's reduce-scatter in backward).
"""
from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# transformer blocks only (embeddings are a small share and sharded the same way)
PRESETS = {
    "llama-7b": {"layers": 32, "hidden": 4096, "params_per_layer": 202_383_360},
    "llama-13b": {"layers": 40, "hidden": 5120, "params_per_layer": 317_214_720},
    "llama-70b": {"layers": 80, "hidden": 8192, "params_per_layer": 855_654_400},
}
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")


@dataclass(frozen=True)
class Collective:
    collective: str                 # all_gather | reduce_scatter | all_reduce
    size: int                       # bytes (the whole buffer)
    groups: tuple[tuple[int, ...], ...]  # disjoint rank groups, each running its own collective
    label: str


@dataclass
class Model:
    layers: int
    params_per_layer: int
    dtype: str = "bf16"

    @property
    def layer_bytes(self) -> int:
        return self.params_per_layer * DTYPE_BYTES[self.dtype]

    @property
    def bytes(self) -> int:
        return self.layers * self.layer_bytes


def model_from(preset: str | None = None, layers: int | None = None, hidden: int | None = None,
               params_per_layer: int | None = None, dtype: str = "bf16") -> Model:
    if preset:
        if preset not in PRESETS:
            raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
        p = PRESETS[preset]
        layers = layers or p["layers"]
        params_per_layer = params_per_layer or p["params_per_layer"]
    if params_per_layer is None and hidden is not None:
        params_per_layer = 12 * hidden * hidden  # attention 4h² + MLP 8h²
    if not layers or not params_per_layer:
        raise ValueError("a model needs a preset, or layers and hidden (or params_per_layer)")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return Model(layers, params_per_layer, dtype)


def fsdp_step(model: Model, ranks: list[int], strategy: str = "FULL_SHARD", group_size: int | None = None,
              prefetch: bool = True, scale: float = 1.0) -> list[list[Collective]]:
    """The stages of one training step. `scale` shrinks every size so a step fits the lab."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    n = len(ranks)
    g = group_size if strategy == "HYBRID_SHARD" else n
    if not g or n % g:
        raise ValueError(f"HYBRID_SHARD needs group_size dividing the {n} ranks, got {group_size}")
    shard_groups = tuple(tuple(ranks[i:i + g]) for i in range(0, n, g))
    replica_groups = tuple(tuple(ranks[j::g]) for j in range(g)) if n > g else ()
    size = max(4, int(model.layer_bytes * scale) // (4 * g) * 4 * g)  # divisible by the group

    def ag(layer, when):
        return Collective("all_gather", size, shard_groups, f"{when} all_gather layer {layer}")

    def rs(layer):
        return Collective("reduce_scatter", size, shard_groups, f"backward reduce_scatter layer {layer}")

    def ar(layer):
        return Collective("all_reduce", size // g, replica_groups, f"replica all_reduce layer {layer}")

    stages: list[list[Collective]] = [[ag(layer, "forward")] for layer in range(model.layers)]
    backward = list(reversed(range(model.layers)))
    for i, layer in enumerate(backward):
        stage = []
        if strategy != "SHARD_GRAD_OP" and not (prefetch and i > 0):
            stage.append(ag(layer, "backward"))
        stage.append(rs(layer))
        if prefetch and strategy != "SHARD_GRAD_OP" and i + 1 < len(backward):
            stage.append(ag(backward[i + 1], "backward"))  # prefetch the next layer's parameters
        if replica_groups:
            stage.append(ar(layer))
        stages.append(stage)
    return stages


def expected_per_rank(strategy: str, n: int, model_bytes: float, group_size: int | None = None) -> tuple[float, str]:
    """What each rank sends in a step by the strategy's formula, and the formula as text: FULL_SHARD
    3(n−1)/n × model, SHARD_GRAD_OP 2(n−1)/n × model, HYBRID_SHARD 3(g−1)/g × model inside a group of
    g plus 2(r−1)/r × model/g across its r = n/g replicas (each rank all-reduces its shard)."""
    if strategy == "SHARD_GRAD_OP":
        return 2 * (n - 1) / n * model_bytes, "2(n-1)/n x model"
    if strategy == "HYBRID_SHARD":
        g = group_size or n
        r = n // g
        return (3 * (g - 1) / g + 2 * (r - 1) / r / g) * model_bytes, f"3(g-1)/g + 2(r-1)/(r g) x model, g={g} r={r}"
    return 3 * (n - 1) / n * model_bytes, "3(n-1)/n x model"


def bytes_per_rank(stages: list[list[Collective]], n_ranks: int) -> float:
    """What each rank sends in the step (ring algorithms), for the check against expected_per_rank."""
    total = 0.0
    for stage in stages:
        for c in stage:
            k = len(c.groups[0])
            factor = {"all_gather": (k - 1) / k, "reduce_scatter": (k - 1) / k,
                      "all_reduce": 2 * (k - 1) / k}[c.collective]
            total += factor * c.size
    return total

"""A transformer's shape, its parallel degrees and placement, and its routing skew (pure logic).

Conventions (Megatron-LM's):
- tp x pp x dp is the participant count; ep (expert parallel) divides dp: an expert-parallel group
  is ep consecutive data-parallel ranks that share a (tp, pp) coordinate, and each expert's own
  gradients are sharded over the dp / ep ranks that hold the same experts (expert data parallel).
- placement lists tp, pp, dp innermost first: rank index i of the participants (in the lab's rank
  order: GPU, server, zone) has coordinate tp = i % TP, then pp, then dp, when placement is
  [tp, pp, dp]. The innermost dimension fills a server (a scale-up domain), the outermost spans zones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DIMS = ("tp", "pp", "dp", "ep")

# heads, hidden, ffn and kv_heads as published; attention params h*(h + 2*kv*h/heads) + h*h (GQA),
# SwiGLU MLP 3*h*ffn per expert, a router of h*experts on MoE layers.
PRESETS = {
    "llama-7b": {"layers": 32, "hidden": 4096, "ffn": 11008, "heads": 32, "kv_heads": 32},
    "llama-13b": {"layers": 40, "hidden": 5120, "ffn": 13824, "heads": 40, "kv_heads": 40},
    "llama-70b": {"layers": 80, "hidden": 8192, "ffn": 28672, "heads": 64, "kv_heads": 8},
    "mixtral-8x7b": {"layers": 32, "hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8,
                     "experts": 8, "top_k": 2},
}


@dataclass(frozen=True)
class Transformer:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    experts: int = 1          # 1: dense
    top_k: int = 1
    dtype: str = "bf16"

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def attention_params(self) -> int:
        h = self.hidden
        return h * (h + 2 * self.kv_heads * h // self.heads) + h * h

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.ffn

    @property
    def params_per_layer(self) -> int:
        router = self.hidden * self.experts if self.moe else 0
        return self.attention_params + self.experts * self.expert_params + router

    @property
    def active_params_per_layer(self) -> int:
        """What one token touches: attention and its top_k experts (FLOPs follow these)."""
        return self.attention_params + self.top_k * self.expert_params

    @property
    def params(self) -> int:
        return self.layers * self.params_per_layer


def transformer(preset: str | None = None, **given) -> Transformer:
    """A preset, each of its fields overridable, or an explicit shape. ValueError says what is missing."""
    if preset and preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(PRESETS)}")
    fields = dict(PRESETS[preset]) if preset else {}
    fields.update({k: v for k, v in given.items() if v is not None})
    missing = [k for k in ("layers", "hidden") if k not in fields]
    if missing:
        raise ValueError(f"a model needs a preset, or layers and hidden (missing {', '.join(missing)})")
    h = fields["hidden"]
    fields.setdefault("ffn", 4 * h)
    fields.setdefault("heads", max(1, h // 128))
    fields.setdefault("kv_heads", fields["heads"])
    if fields.get("experts", 1) > 1:
        fields.setdefault("top_k", 2)
    m = Transformer(**fields)
    # located at the key the user gave (heads, kv_heads, top_k) when they gave it, else at model:
    if m.hidden % m.heads:
        key = "heads" if given.get("heads") is not None else "hidden" if given.get("hidden") is not None else "model"
        raise ShapeError(f"hidden {m.hidden} must be a multiple of heads {m.heads}", key,
                         f"set heads to one of {divisors(m.hidden)} (hidden / heads is a head's width, "
                         "128 in most published models)")
    if m.heads % m.kv_heads:
        key = "kv_heads" if given.get("kv_heads") is not None else "heads" if given.get("heads") is not None \
            else "model"
        raise ShapeError(f"heads {m.heads} must be a multiple of kv_heads {m.kv_heads} (grouped-query attention "
                         "shares each kv head among whole groups of query heads)", key,
                         f"set kv_heads to one of {divisors(m.heads)}")
    if m.top_k > m.experts:
        key = "top_k" if given.get("top_k") is not None else "experts"
        raise ShapeError(f"top_k {m.top_k} is more than the {m.experts} experts", key,
                         f"set top_k to at most {m.experts}")
    return m


@dataclass(frozen=True)
class Degrees:
    tp: int
    pp: int
    dp: int
    ep: int = 1

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.dp


def degrees(n: int, tp: int = 1, pp: int = 1, dp: int | None = None, ep: int = 1) -> Degrees:
    """The degrees for `n` participants (dp defaults to what is left); ValueError names the broken rule."""
    if dp is None:
        if n % (tp * pp):
            raise ValueError(f"tp x pp = {tp * pp} does not divide the {n} participants")
        dp = n // (tp * pp)
    if tp * pp * dp != n:
        raise ValueError(f"tp x pp x dp = {tp} x {pp} x {dp} = {tp * pp * dp}, but there are {n} participants")
    if dp % ep:
        raise ValueError(f"ep {ep} must divide dp {dp} (expert-parallel groups are made of data-parallel ranks)")
    return Degrees(tp, pp, dp, ep)


class ShapeError(ValueError):
    """A split the model cannot take: `key` (under train:) is the degree to change, `fix` what to write."""

    def __init__(self, message: str, key: str, fix: str):
        super().__init__(message)
        self.key = key
        self.fix = fix


def divisors(n: int, most: int = 8) -> str:
    """n's divisors as a fix lists them: '1, 2, 4 or 8' (the largest elided past `most`)."""
    ds = sorted({k for i in range(1, math.isqrt(n) + 1) if n % i == 0 for k in (i, n // i)})
    if len(ds) > most:
        return ", ".join(str(k) for k in ds[:most - 1]) + f", ... or {ds[-1]}"
    return " or ".join(filter(None, (", ".join(str(k) for k in ds[:-1]), str(ds[-1]))))


def check_shape(m: Transformer, d: Degrees) -> None:
    """What Megatron refuses: a tp rank holds whole query heads and whole kv-head groups
    (num_query_groups) and an equal share of the MLP's ffn columns, so tp divides all three; pp
    divides the layers and ep the experts."""
    tp_ok = divisors(math.gcd(m.heads, m.kv_heads, m.ffn))
    for n, what, field in ((m.heads, "attention heads", "heads"),
                           (m.kv_heads, "kv_heads (Megatron's num_query_groups: each tp rank holds whole groups)",
                            "kv_heads"),
                           (m.ffn, "ffn hidden size (each tp rank holds an equal share of the MLP)", "ffn")):
        if n % d.tp:
            raise ShapeError(f"tp {d.tp} must divide the {n} {what}", "degrees.tp",
                             f"set tp to {tp_ok} (what divides heads {m.heads}, kv_heads {m.kv_heads} and ffn "
                             f"{m.ffn}), or make the model's {field} a multiple of {d.tp}")
    if m.layers % d.pp:
        raise ShapeError(f"pp {d.pp} must divide the {m.layers} layers", "degrees.pp",
                         f"set pp to {divisors(m.layers)}, or make layers a multiple of {d.pp}")
    if d.ep > 1 and not m.moe:
        raise ShapeError(f"ep {d.ep} needs a mixture-of-experts model (experts > 1)", "degrees.ep",
                         "leave ep out (1) for a dense model, or use a MoE model (e.g. model: mixtral-8x7b)")
    if m.moe and m.experts % d.ep:
        raise ShapeError(f"ep {d.ep} must divide the {m.experts} experts", "degrees.ep",
                         f"set ep to {divisors(m.experts)}")


def coordinates(n: int, d: Degrees, placement: tuple[str, ...]) -> list[dict[str, int]]:
    """Each participant index's {tp, pp, dp} coordinate; placement lists the dimensions innermost first."""
    out = []
    for i in range(n):
        c, rest = {}, i
        for dim in placement:
            size = getattr(d, dim)
            c[dim] = rest % size
            rest //= size
        out.append(c)
    return out


def skew_weights(skew, experts: int) -> list[float]:
    """Each expert's share of the routed tokens: uniform, zipf:<s> (expert k gets 1/(k+1)^s) or weights."""
    if skew in (None, "uniform"):
        w = [1.0] * experts
    elif isinstance(skew, str) and skew.startswith("zipf:"):
        try:
            s = float(skew.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"{skew!r} is not zipf:<exponent>, e.g. zipf:1.2") from None
        if s < 0:
            raise ValueError(f"zipf exponent {s} must be >= 0")
        w = [1 / (k + 1) ** s for k in range(experts)]
    elif isinstance(skew, list):
        if len(skew) != experts:
            raise ValueError(f"skew lists {len(skew)} weights for {experts} experts")
        if any(x < 0 for x in skew) or sum(skew) <= 0:
            raise ValueError("skew weights must be >= 0 and not all 0")
        w = [float(x) for x in skew]
    else:
        raise ValueError(f"skew {skew!r} is not uniform, zipf:<s> or a list of weights")
    total = sum(w)
    return [x / total for x in w]


def rank_loads(weights: list[float], ep: int) -> list[float]:
    """The share of routed tokens each expert-parallel rank receives (experts in contiguous blocks)."""
    per = len(weights) // ep
    return [sum(weights[j * per:(j + 1) * per]) for j in range(ep)]

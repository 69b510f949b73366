"""What the planner is asked about: a model, a dtype policy, a layout, and the checks
that refuse an impossible one before anything is computed.

Every input is a frozen dataclass with `to_dict` / `from_dict` over plain JSON
values, with these key names (stable: the HTML book's planner reads them):

    model   layers, hidden, heads, seq, vocab, experts (0: dense), top_k,
            capacity_factor
    policy  dtype ("fp32" | "bf16" | "amp-bf16"), reduce ("fp32" | "bf16"),
            optimizer ("adamw" | "adamw-fused" | "sgd")
    layout  dp, tp, pp, micro_batches, zero (0-3), sp (bool), ckpt ("none" |
            "selective" | "full"), schedule ("gpipe" | "1f1b" | "interleaved"),
            virtual (stages per rank, interleaved only), bucket_view (bool),
            ep, cp (chapter 12's expert and context parallelism; `plan.axes`),
            reshard (bool, ZeRO-3 only: FSDP's reshard_after_forward)

The MoE keys appear in `to_dict` only with experts > 0, ep and cp only above 1,
reshard only when false, as the prediction's cp and ep times and bytes: a
chapter 10 input's dict is unchanged.

The model is `examples.gpt.TinyGPT`'s shape: L blocks of width h with a heads,
learned positions for seq tokens, a vocabulary of V, an untied head. Its
parameters (each block: 4 h x h attention matrices with biases, the 4h MLP with
biases, two norms; then embeddings, final norm, head):

    params = L (12 h^2 + 13 h) + 2 V h + seq h + 2 h

With E = experts > 0 every block's MLP (8 h^2 + 5 h) is E experts of that size
and a router of h E: params += L ((E - 1)(8 h^2 + 5 h) + h E).

`ModelSpec.from_params(N)` picks such a shape for a count alone: h the multiple of
1024 nearest (128 N / 12)^(1/3) (so that L comes near h / 128, the aspect of GPT-3
and Llama), at least 1024; heads of 128 (a = h / 128); L the multiple of 4
nearest (N - 2 V h - seq h) / (12 h^2 + 13 h), at least 4; seq 4096 and V 32000
unless given (7e9 gives 32 x 4096, 6.7e9 parameters; 70e9 68 x 9216, 69.9e9).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from distcourse.examples.gpt import GPTConfig

DTYPES = ("fp32", "bf16", "amp-bf16")
REDUCES = ("fp32", "bf16")
OPTIMIZERS = ("adamw", "adamw-fused", "sgd")
CKPT = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def count(value: object, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return value


def _choice(value: object, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def from_plain(cls: type, data: dict[str, Any]) -> Any:
    """cls(**data), refusing unknown keys by name (a typo must not pass silently)."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"{cls.__name__}: unknown keys {unknown}; known {sorted(known)}"
        )
    return cls(**data)


@dataclass(frozen=True)
class ModelSpec:
    """A TinyGPT-shaped model: blocks, width, heads, sequence length, vocabulary;
    with experts > 0, a mixture of experts (top_k of them a token, each taking at
    most capacity_factor x its even share)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    experts: int = 0
    top_k: int = 1
    capacity_factor: float = 1.25

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "seq", "vocab", "top_k"):
            count(getattr(self, name), name)
        count(self.experts, "experts", 0)
        f = self.capacity_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise ValueError(f"capacity_factor must be a number > 0, got {f!r}")
        if self.experts and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} is more than experts={self.experts}")
        if self.hidden % self.heads:
            raise ValueError(
                f"hidden={self.hidden} is not divisible by heads={self.heads}"
            )

    @property
    def params(self) -> int:
        """L (12 h^2 + 13 h) + 2 V h + seq h + 2 h (+ the experts, E > 0)."""
        L, h, E = self.layers, self.hidden, self.experts
        dense = L * (12 * h * h + 13 * h) + 2 * self.vocab * h + self.seq * h + 2 * h
        return dense + (L * ((E - 1) * (8 * h * h + 5 * h) + h * E) if E else 0)

    def config(self) -> GPTConfig:
        """The same shape as examples.gpt's GPTConfig (block_size = seq)."""
        return GPTConfig(
            vocab=self.vocab,
            block_size=self.seq,
            n_layer=self.layers,
            n_head=self.heads,
            n_embd=self.hidden,
        )

    @classmethod
    def from_config(cls, cfg: GPTConfig) -> ModelSpec:
        return cls(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.block_size, cfg.vocab)

    @classmethod
    def from_params(
        cls, params: float, seq: int = 4096, vocab: int = 32000
    ) -> ModelSpec:
        """A shape of about `params` parameters (the rule in the module docstring)."""
        if not params >= 1e6:
            raise ValueError(f"params must be at least 1e6, got {params!r}")
        h = max(1024, 1024 * round((128 * params / 12) ** (1 / 3) / 1024))
        rest = params - 2 * vocab * h - seq * h
        layers = max(4, 4 * round(rest / (12 * h * h + 13 * h) / 4))
        return cls(layers, h, h // 128, seq, vocab)

    def to_dict(self) -> dict[str, Any]:
        """Every field; the MoE keys only with experts > 0 (a dense model's dict
        stays chapter 10's)."""
        out = asdict(self)
        if not self.experts:
            for key in ("experts", "top_k", "capacity_factor"):
                del out[key]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        return from_plain(cls, data)


@dataclass(frozen=True)
class DTypePolicy:
    """How a step stores and computes: fp32 throughout; bf16 weights with an fp32
    master (Megatron-LM's mixed precision); or fp32 weights under bf16 autocast.

    Bytes per parameter (AdamW; SGD keeps no moments):
        fp32      weights 4, gradients 4, optimizer 8 (two moments)       = 16
        bf16      weights 2, gradients 2, optimizer 12 (fp32 master 4 +
                  two fp32 moments 8)                                     = 16
        amp-bf16  weights 4, gradients 4, optimizer 8 (the weights are
                  the master; autocast casts them each forward)           = 16
    What activations weigh is per tensor (`parallel.tensor.dtypes.Precision`, on
    the hardware's device: `Hardware.precision`). `reduce` is the dtype gradients
    cross the wire in (data-parallel reduction). `optimizer`: "adamw" is torch's
    default implementation (foreach on a GPU, one tensor at a time on a CPU),
    "adamw-fused" its fused kernel (`AdamW(fused=True)`), "sgd" plain SGD.
    """

    dtype: str = "fp32"
    reduce: str = "fp32"
    optimizer: str = "adamw"

    def __post_init__(self) -> None:
        _choice(self.dtype, "dtype", DTYPES)
        _choice(self.reduce, "reduce", REDUCES)
        _choice(self.optimizer, "optimizer", OPTIMIZERS)

    @property
    def weight_bytes(self) -> int:
        return 2 if self.dtype == "bf16" else 4

    @property
    def grad_bytes(self) -> int:
        return self.weight_bytes

    @property
    def reduce_bytes(self) -> int:
        return 4 if self.reduce == "fp32" else 2

    @property
    def adam(self) -> bool:
        """AdamW, in either implementation: two moments and a step counter."""
        return self.optimizer != "sgd"

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer state per parameter: moments (AdamW 8) + fp32 master (bf16 4)."""
        moments = 8 if self.adam else 0
        return moments + (4 if self.dtype == "bf16" else 0)

    @property
    def step_bytes(self) -> int:
        """AdamW's step counter: one fp32 scalar per parameter tensor it steps."""
        return 4 if self.adam else 0

    @property
    def matmul_dtype(self) -> str:
        """The dtype matmuls run in, whose rate `Hardware.rate` gives."""
        return "fp32" if self.dtype == "fp32" else "bf16"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DTypePolicy:
        return from_plain(cls, data)


@dataclass(frozen=True)
class PlanLayout:
    """Degrees (dp x tp x pp x ep x cp GPUs) and how each rank runs its part.

    `bucket_view`: the gradients are views into DDP's buckets (no second copy in
    the reduce dtype; ZeRO 0 and 1 only). `reshard` (ZeRO-3 only): FSDP's
    reshard_after_forward; False keeps every gathered parameter from forward to
    backward (one all-gather a micro-batch instead of two, `plan.timing`).
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batches: int = 1
    zero: int = 0
    sp: bool = False
    ckpt: str = "none"
    schedule: str = "1f1b"
    virtual: int = 1
    bucket_view: bool = False
    ep: int = 1
    cp: int = 1
    reshard: bool = True

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batches", "virtual", "ep", "cp"):
            count(getattr(self, name), name)
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ValueError(
                f"zero (the ZeRO stage) must be 0, 1, 2 or 3, got {self.zero!r}"
            )
        for name in ("sp", "bucket_view", "reshard"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name} must be true or false, got {getattr(self, name)!r}"
                )
        _choice(self.ckpt, "ckpt", CKPT)
        _choice(self.schedule, "schedule", SCHEDULES)

    @property
    def gpus(self) -> int:
        """dp x tp x pp x ep x cp, as `hybrid.layout.Layout.world`."""
        return self.dp * self.tp * self.pp * self.ep * self.cp

    @property
    def shares(self) -> int:
        """The batch's shares: dp x ep (expert-parallel ranks hold other tokens)."""
        return self.dp * self.ep

    @property
    def name(self) -> str:
        """'dp x tp x pp', e.g. '8x8x1'; ep and cp above 1 follow: '8x8x1 ep2'."""
        extra = "".join(
            f" {a}{getattr(self, a)}" for a in ("ep", "cp") if getattr(self, a) > 1
        )
        return f"{self.dp}x{self.tp}x{self.pp}{extra}"

    def to_dict(self) -> dict[str, Any]:
        """Every field; ep and cp only above 1, reshard only when false (chapter
        10's dict otherwise)."""
        out = asdict(self)
        for key in ("ep", "cp"):
            if out[key] == 1:
                del out[key]
        if out["reshard"]:
            del out["reshard"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanLayout:
        return from_plain(cls, data)

"""The layouts `--plan_search` considers for an experiment on N nodes: meshes (ICI x DCN over
stage, replica, data, context, mdl), rematerialisation policies, gradient accumulation,
pipeline microbatches and the experts' mesh axis, each checked by the experiment's own
validation; and a quick analytic estimate of each (memory per device, step time) to rank
them before the best few are compiled. Only this package knows hyperparameter names; the
time model is paxloom/runner/planning/step_time.py.
"""

import dataclasses
import itertools
import math

from paxloom.core import mesh_axes
from paxloom.core.errors import UserError
from paxloom.launch.plan import REMAT_LADDER, fdl_flags
from paxloom.runner.planning import links, step_time

STAGE, REPLICA, DATA, CONTEXT, MDL = range(5)
# Short names of the axes in a layout's label (PP, DP, FSDP, CP, TP).
SHORT = ("PP", "DP", "FSDP", "CP", "TP")
LONG_SEQUENCE = 8192  # a context axis is tried from this MAX_SEQ_LEN on
MAX_ACCUMULATION = 8
MAX_MICROBATCH_FACTOR = 4  # microbatches per sub-batch: stages x 1, 2, 4

# Bytes of activations kept per token, per layer, per model dimension (bfloat16), by policy:
# "none" keeps every intermediate (fitted on GPT5B's 32-device XLA:GPU plans at batch 8 and
# GRADIENT_ACCUMULATION_STEPS 1 and 2: about 57; Korthikanti et al.'s 34 leaves out what
# XLA keeps in float32); save_dot* the matmul outputs (GPT5B's 8-device XLA:GPU plan: 34 GiB
# / (24 layers x 8 x 2048 tokens x 4096)); save_qkv_out_proj the attention projections;
# save_nothing each layer's input.
ACTIVATION_BYTES = {"none": 60, "save_dot_except_logits_ffn1": 22,
                    "save_dot_with_no_batch_dims": 22, "save_qkv_out_proj": 10,
                    "save_nothing": 2}
# The share of a layer's forward matmul FLOPs each policy computes again in the backward
# pass (attention's score and value matmuls counted separately: see _recompute_flops).
RECOMPUTED_MATMULS = {"none": 0.0, "save_dot_except_logits_ffn1": 1 / 3,
                      "save_dot_with_no_batch_dims": 0.0, "save_qkv_out_proj": 2 / 3,
                      "save_nothing": 1.0}
BF16 = 2


@dataclasses.dataclass(frozen=True)
class Layout:
    """One way to run the experiment: the mesh over the five axes, within a node (ici) and
    across nodes (dcn), the remat policy, gradient accumulation, the pipeline's microbatches
    per sub-batch (None without stages) and the experts' axis (None: a dense model, or one
    whose experts praxis places)."""

    ici: tuple[int, ...]
    dcn: tuple[int, ...]
    checkpoint_policy: str
    accumulation: int = 1
    num_microbatches: int | None = None
    expert_axis: str | None = None
    percore_batch_size: float = 1.0
    # What the experiment set that this layout must undo (NUM_STAGES, MICROBATCH_SIZE, ...).
    fixed: tuple[tuple[str, object], ...] = ()

    @property
    def mesh(self) -> list[int]:
        return [i * d for i, d in zip(self.ici, self.dcn, strict=True)]

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh)

    def size(self, axis: int) -> int:
        return self.ici[axis] * self.dcn[axis]

    def overrides(self) -> dict:
        """The hyperparameters that make an experiment run this layout."""
        ici, dcn = mesh_axes.written_shapes(self.ici, self.dcn)
        found = {"ICI_MESH_SHAPE": ici, "DCN_MESH_SHAPE": dcn,
                 "PERCORE_BATCH_SIZE": _number(self.percore_batch_size),
                 "CHECKPOINT_POLICY": self.checkpoint_policy,
                 "GRADIENT_ACCUMULATION_STEPS": self.accumulation}
        if self.num_microbatches is not None:
            found["NUM_MICROBATCHES"] = self.num_microbatches
        if self.expert_axis is not None:
            found["EXPERT_AXIS"] = self.expert_axis
        found.update(self.fixed)
        return found

    @property
    def label(self) -> str:
        """E.g. "DP4xFSDP8 TP1 | GA1 save_nothing": the axes larger than 1, ICI x DCN."""
        parts = []
        for axis, name in enumerate(SHORT):
            if self.size(axis) > 1:
                where = ("" if self.dcn[axis] == 1 else "n" if self.ici[axis] == 1 else
                         f"({self.ici[axis]}x{self.dcn[axis]}n)")
                parts.append(f"{name}{self.size(axis)}{where}")
        text = "x".join(parts) or "1 device"
        if self.num_microbatches is not None:
            text += f" M{self.num_microbatches}"
        if self.expert_axis not in (None, "none"):
            text += f" EP:{self.expert_axis}"
        elif self.expert_axis == "none":
            text += " EP:none"
        return f"{text} GA{self.accumulation} {self.checkpoint_policy}"

    @property
    def flags(self) -> str:
        """`--fdl.NAME=VALUE` flags, ready to paste after --fdl_config."""
        return fdl_flags(self.overrides())


def _number(value: float):
    return int(value) if float(value).is_integer() else value


def factorizations(n: int, slots: int) -> list[tuple[int, ...]]:
    """Every ordered way to write n as a product of `slots` positive factors."""
    if slots == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0
            for rest in factorizations(n // d, slots - 1)]


def _spread(factors: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    shape = [1] * 5
    for axis, f in zip(axes, factors, strict=True):
        shape[axis] = f
    return tuple(shape)


def _count(reasons: dict[str, int], reason: str, n: int = 1) -> None:
    reasons[reason] = reasons.get(reason, 0) + n


def _reason(error: UserError) -> str:
    """A validation error as a reason to count: its text up to the first number-laden
    detail, so that the same rule over different layouts counts once."""
    words = [w for w in str(error).split(";")[0].split() if not any(c.isdigit() for c in w)]
    return "the experiment refuses it: " + _short(" ".join(words))


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def _variant(exp, overrides: dict):
    return type(exp)(**{**exp.hyperparameters(), **overrides})


def _fixed(hp: dict, stages: int) -> tuple[tuple[str, object], ...]:
    """Settings of the experiment's own layout that another layout must undo."""
    fixed = []
    if hp.get("NUM_STAGES") is not None:
        fixed.append(("NUM_STAGES", None))
    if hp.get("CIRCULAR_REPEAT", 1) != 1:
        fixed.append(("CIRCULAR_REPEAT", 1))
    if stages > 1 and hp.get("MICROBATCH_SIZE") is not None:
        fixed.append(("MICROBATCH_SIZE", None))
    return tuple(fixed)


def accepts_stages(exp) -> str | None:
    """None when the experiment takes a two-stage pipeline, else why not (GLaM's GShard
    layers have no pipeline; an odd NUM_LAYERS does not split)."""
    hp = exp.hyperparameters()
    if hp["NUM_LAYERS"] % 2:
        return f"NUM_LAYERS={hp['NUM_LAYERS']} does not split into stages"
    try:
        _variant(exp, {"ICI_MESH_SHAPE": [2, 1, 1, 1], "DCN_MESH_SHAPE": [1, 1, 1, 1],
                       "PERCORE_BATCH_SIZE": 1, "GRADIENT_ACCUMULATION_STEPS": 1,
                       "NUM_MICROBATCHES": 2, **dict(_fixed(hp, 2)),
                       **({"EXPERT_AXIS": "none"} if _places_experts(exp) else {})})
    except UserError as error:
        return str(error).split(";")[0]
    return None


def _places_experts(exp) -> bool:
    """The experiment has experts whose mesh axis EXPERT_AXIS picks (Llama's mixtures;
    GLaM's GShard layers place their own)."""
    return exp.NUM_EXPERTS > 0 and "EXPERT_AXIS" not in exp.unused_hyperparameters()


def _tensor_divides(hp: dict, t: int) -> str | None:
    for name in ("NUM_HEADS", "HIDDEN_DIMS", "MODEL_DIMS", "VOCAB_SIZE"):
        if hp.get(name) and hp[name] % t:
            return f"{name} does not split over the tensor axis"
    if hp.get("NUM_KV_HEADS") and hp["NUM_KV_HEADS"] % t:
        return "NUM_KV_HEADS does not split over the tensor axis"
    return None


def enumerate_layouts(exp, nodes: int, gpus_per_node: int, global_batch: int
                      ) -> tuple[list[Layout], dict[str, int]]:
    """Every layout of `exp` on `nodes` x `gpus_per_node` devices with `global_batch`
    sequences per update that the experiment's checks accept, and per reason how many
    were left out. The tensor axis stays within a node (its all-reduces are on the
    critical path); stages only where the experiment takes them; a context axis only for
    long sequences (or when the experiment has one); an expert axis only with experts."""
    hp = exp.hyperparameters()
    devices = nodes * gpus_per_node
    pruned: dict[str, int] = {}
    if global_batch < 1:
        raise UserError(f"--plan_global_batch={global_batch}: at least 1 sequence")
    percore = global_batch / devices
    own_context = mesh_axes.axis_size(hp["ICI_MESH_SHAPE"], hp["DCN_MESH_SHAPE"],
                                      mesh_axes.CONTEXT_AXIS)
    use_context = hp["MAX_SEQ_LEN"] >= LONG_SEQUENCE or own_context > 1
    stage_refused = accepts_stages(exp)
    inner = (STAGE, REPLICA, DATA, CONTEXT, MDL) if use_context else (STAGE, REPLICA, DATA, MDL)
    outer = tuple(a for a in inner if a != MDL)
    meshes = [(_spread(i, inner), _spread(d, outer))
              for i in factorizations(gpus_per_node, len(inner))
              for d in factorizations(nodes, len(outer))]
    expert_axes: list[str | None] = [None]
    if _places_experts(exp):
        expert_axes = ["data", "replica", "none"]
    layouts = []
    for ici, dcn in meshes:
        mesh = [i * d for i, d in zip(ici, dcn, strict=True)]
        stages, tensor, context = mesh[STAGE], mesh[MDL], mesh[CONTEXT]
        if stages > 1 and stage_refused:
            _count(pruned, f"no pipeline stages: {_short(stage_refused)}")
            continue
        if stages > 1 and hp["NUM_LAYERS"] % stages:
            _count(pruned, "NUM_LAYERS does not split over the stages")
            continue
        why = _tensor_divides(hp, tensor) if tensor > 1 else None
        if why:
            _count(pruned, why)
            continue
        if context > 1 and hp["MAX_SEQ_LEN"] % (2 * context):
            _count(pruned, "MAX_SEQ_LEN does not split over the context axis")
            continue
        shards = mesh[STAGE] * mesh[REPLICA] * mesh[DATA]
        if global_batch % shards:
            _count(pruned, "the global batch does not split over the batch shards")
            continue
        fixed = _fixed(hp, stages)
        for accumulation in _powers(MAX_ACCUMULATION):
            if global_batch % (shards * accumulation):
                break
            sub_batch = global_batch // accumulation
            microbatches: list[int | None] = [None]
            if stages > 1:
                per_stage = mesh[REPLICA] * mesh[DATA]
                microbatches = [m for m in (stages * f for f in _powers(MAX_MICROBATCH_FACTOR))
                                if sub_batch % m == 0 and (sub_batch // m) % per_stage == 0]
                if not microbatches:
                    _count(pruned, "the sub-batch does not split into microbatches",
                           len(REMAT_LADDER))
                    continue
            for policy, m, axis in itertools.product(REMAT_LADDER, microbatches, expert_axes):
                if axis in ("data", "replica"):
                    size = mesh[DATA if axis == "data" else REPLICA]
                    if size == 1 or exp.NUM_EXPERTS % size:
                        continue  # the same as EXPERT_AXIS="none", or does not split
                layout = Layout(ici=ici, dcn=dcn, checkpoint_policy=policy,
                                accumulation=accumulation, num_microbatches=m,
                                expert_axis=axis, percore_batch_size=percore, fixed=fixed)
                try:
                    _variant(exp, layout.overrides())
                except UserError as error:
                    _count(pruned, _reason(error))
                    continue
                layouts.append(layout)
    return layouts, pruned


def _powers(limit: int) -> list[int]:
    return [2**k for k in range(int(math.log2(limit)) + 1)]


# ----- The analytic estimate -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the analytic estimate reads of an experiment."""

    num_layers: int
    model_dims: int
    num_heads: int
    dims_per_head: int
    kv_heads: int
    seq_len: int
    params: float  # all
    expert_params: float  # of which in experts
    active_params: float  # a token's matmul parameters (6N's N)
    layer_params: float  # a token's matmul parameters inside the decoder layers
    moe_layers: int
    experts_per_token: int
    praxis_attention: bool  # materialised [T, T] scores
    # A token's logits matmul FLOPs the chunked loss computes again in its backward pass
    # (LOSS_CHUNK_LEN shorter than the sequence); 0 for a loss in one piece.
    loss_recompute: float = 0.0

    @property
    def flops_per_token(self) -> float:
        return (6 * self.active_params
                + 12 * self.num_layers * self.num_heads * self.dims_per_head * self.seq_len)


def sizes(exp, device: str = "h100") -> Sizes:
    """The model's sizes from its hyperparameters: GPT (two feed-forward matmuls, tied
    embedding) or Llama (gated, untied) dense layers, Llama mixtures in every
    MOE_LAYER_INTERVAL-th layer, GLaM's in every other layer."""
    hp = exp.hyperparameters()
    d, h, q = hp["MODEL_DIMS"], hp["NUM_HEADS"], hp["DIMS_PER_HEAD"] or hp["MODEL_DIMS"] // hp["NUM_HEADS"]
    layers = hp["NUM_LAYERS"]
    llama = not getattr(exp, "reads_gpt_architecture", True)
    kv = hp.get("NUM_KV_HEADS") or h if llama else h
    gated = llama or bool(hp.get("USE_GATED_ACTIVATION"))
    ffn = (3 if gated else 2) * d * hp["HIDDEN_DIMS"]
    attention = 2 * d * h * q + 2 * d * kv * q
    experts = hp.get("NUM_EXPERTS") or 0
    if experts:
        glam = "EXPERT_AXIS" in exp.unused_hyperparameters()
        moe_layers = layers // 2 if glam else layers // max(hp.get("MOE_LAYER_INTERVAL", 1), 1)
        width = hp.get("MOE_HIDDEN_DIMS") or hp["HIDDEN_DIMS"]
        expert_ffn = (3 if gated or glam else 2) * d * width
        k = 2 if glam else hp.get("NUM_EXPERTS_PER_TOKEN", 2)
        shared = (3 * d * hp["MOE_SHARED_HIDDEN_DIMS"]) if hp.get("MOE_SHARED_HIDDEN_DIMS") else 0
        expert_params = moe_layers * experts * expert_ffn
        layer = layers * attention + (layers - moe_layers) * ffn + moe_layers * shared
        active_layer = layer + moe_layers * k * expert_ffn
        layer += expert_params
    else:
        moe_layers, k, expert_params = 0, 0, 0.0
        layer = active_layer = layers * (attention + ffn)
    embedding = hp["VOCAB_SIZE"] * d * (2 if llama else 1)
    impl = hp.get("ATTENTION_IMPL", "auto")
    praxis = impl in ("praxis", "xla") or impl == "auto" and not device.startswith(("h100", "h200"))
    chunked = "LOSS_CHUNK_LEN" not in exp.unused_hyperparameters() and exp.loss_chunk_len() > 0
    return Sizes(num_layers=layers, model_dims=d, num_heads=h, dims_per_head=q, kv_heads=kv,
                 seq_len=hp["MAX_SEQ_LEN"], params=layer + embedding,
                 expert_params=expert_params, active_params=active_layer + embedding,
                 layer_params=active_layer, moe_layers=moe_layers, experts_per_token=k,
                 praxis_attention=praxis,
                 loss_recompute=2.0 * hp["VOCAB_SIZE"] * d if chunked else 0.0)


def memory(s: Sizes, layout: Layout) -> tuple[float, float]:
    """(state, activations) bytes per device: float32 parameters, Adam's two moments and
    float32 gradients (16 B a parameter) over the axes that shard the weights, and each
    layer's kept activations for one pass (a pipelined stage keeps every microbatch's)."""
    stages, tensor = layout.size(STAGE), layout.size(MDL)
    weight_shards = layout.size(DATA) * layout.size(CONTEXT) * tensor * stages
    expert_shards = (layout.size(DATA if layout.expert_axis == "data" else REPLICA)
                     if layout.expert_axis in ("data", "replica") else 1)
    dense = s.params - s.expert_params
    state = 16 * (dense / weight_shards + s.expert_params / (expert_shards * tensor * stages))
    sub_batch = layout.percore_batch_size * layout.num_devices / layout.accumulation
    rows = sub_batch / (layout.size(REPLICA) * layout.size(DATA))
    tokens = rows * s.seq_len / layout.size(CONTEXT)
    per_token = ACTIVATION_BYTES[layout.checkpoint_policy] * s.model_dims
    if layout.checkpoint_policy == "none" and s.praxis_attention:
        per_token += 10 * s.num_heads * s.seq_len  # scores and probabilities, [T, T] a head
    activations = s.num_layers / stages * tokens * per_token / tensor
    return state, activations


def _axis_links(layout: Layout, axis: int) -> tuple[str, int]:
    """(links, devices of a group in one node) of a mesh axis."""
    i, d = layout.ici[axis], layout.dcn[axis]
    if d == 1:
        return "ICI", i
    if i == 1:
        return "DCN", 1
    return "ICI+DCN", i


def communication(s: Sizes, layout: Layout, ic) -> list[tuple[str, float, bool]]:
    """Per device per step: (label, seconds, asynchronous) of each collective the layout
    needs, from its bytes by ring algorithm over the axis's links (bfloat16 weights,
    gradients and activations)."""
    stages, tensor = layout.size(STAGE), layout.size(MDL)
    fsdp, dp, cp = layout.size(DATA), layout.size(REPLICA), layout.size(CONTEXT)
    steps = layout.accumulation
    global_batch = layout.percore_batch_size * layout.num_devices
    weights = BF16 * s.params / (tensor * stages)  # a stage's tensor shard, gathered whole
    tokens = global_batch * s.seq_len / (dp * fsdp * cp)  # a device's tokens per step
    found = []

    def add(what: str, axis: int, sent: float, asynchronous: bool):
        link, per_node = _axis_links(layout, axis)
        seconds = sent / links.bandwidth(link, per_node, ic)
        found.append((f"{what} over {mesh_axes.MESH_AXIS_NAMES[axis]} ({link})", seconds,
                      asynchronous))

    if fsdp > 1:
        add("all-gather of weights (FSDP)", DATA, 2 * steps * weights * (fsdp - 1) / fsdp, True)
        add("reduce-scatter of gradients (FSDP)", DATA, steps * weights * (fsdp - 1) / fsdp,
            True)
    if dp > 1:
        add("all-reduce of gradients (DP)", REPLICA,
            2 * (dp - 1) / dp * weights / (fsdp * cp), True)
    if tensor > 1:
        recomputes = RECOMPUTED_MATMULS[layout.checkpoint_policy] > 0
        count = (4 + (2 if recomputes else 0)) * s.num_layers / stages
        add("all-reduce of activations (TP)", MDL,
            count * tokens * s.model_dims * BF16 * 2 * (tensor - 1) / tensor, False)
    if stages > 1:
        m = layout.num_microbatches or stages
        rows = global_batch / steps / m / (dp * fsdp)
        add("stage-to-stage transfers (PP)", STAGE,
            2 * (m + stages - 1) * steps * rows * s.seq_len / cp * s.model_dims * BF16 / tensor,
            False)
    if cp > 1:
        add("all-gather of keys and values (CP)", CONTEXT,
            2 * 2 * s.num_layers / stages * tokens * s.kv_heads * s.dims_per_head * BF16
            * (cp - 1), False)
    if s.moe_layers and layout.expert_axis in ("data", "replica"):
        axis = DATA if layout.expert_axis == "data" else REPLICA
        e = layout.size(axis)
        add("all-to-all of tokens (EP)", axis,
            4 * s.moe_layers / stages * tokens * s.model_dims * BF16 * s.experts_per_token
            * (e - 1) / e, False)
    return found


def _recompute_flops(s: Sizes, layout: Layout, tokens_per_device: float) -> float:
    """FLOPs per device per step the policy computes again in the backward pass."""
    share = RECOMPUTED_MATMULS[layout.checkpoint_policy]
    attention = 4 * s.num_layers * s.num_heads * s.dims_per_head * s.seq_len
    recomputed = 2 * s.layer_params * share
    if layout.checkpoint_policy != "none":  # attention's batched matmuls are never saved
        recomputed += attention
    return (recomputed + s.loss_recompute) * tokens_per_device


def bubble(layout: Layout) -> float:
    stages = layout.size(STAGE)
    if stages == 1:
        return 0.0
    m = layout.num_microbatches or stages
    return (stages - 1) / (m + stages - 1)


def analytic(exp, layout: Layout, device: str, calibration=None
             ) -> tuple[float, "step_time.Estimate"]:
    """(memory bytes per device, step-time estimate) of `exp` run with `layout` on
    `device` (a DEVICE_KINDS key), from hyperparameters alone: nothing compiles.
    `calibration`: the device's own (efficiency.py) unless given."""
    s = sizes(exp, device)
    state, activations = memory(s, layout)
    tokens_per_step = layout.percore_batch_size * layout.num_devices * s.seq_len
    flops_per_token = s.flops_per_token
    model_flops = flops_per_token * tokens_per_step / layout.num_devices
    estimate = step_time.from_terms(
        model_flops=model_flops,
        recompute_flops=_recompute_flops(s, layout, tokens_per_step / layout.num_devices),
        activation_bytes=activations * layout.accumulation,
        comm=communication(s, layout, links.interconnect(device)), bubble=bubble(layout),
        device_key=device, model_dims=s.model_dims,
        tokens_per_pass=tokens_per_pass(s, layout), tokens_per_step=tokens_per_step,
        flops_per_token=flops_per_token, num_devices=layout.num_devices,
        tensor_parallel=layout.size(MDL), calibration=calibration)
    return state + activations, estimate


def tokens_per_pass(s: Sizes, layout: Layout) -> float:
    """The tokens a device's matmuls take at a time (Plan.tokens_per_pass): its rows of a
    sub-batch, of one microbatch when pipelined, times its share of the sequence."""
    sub_batch = layout.percore_batch_size * layout.num_devices / layout.accumulation
    rows = sub_batch / (layout.num_microbatches or 1) / (layout.size(REPLICA) * layout.size(DATA))
    return rows * s.seq_len / layout.size(CONTEXT)


def memory_bound(exp, layout: Layout, device: str) -> tuple[float, float]:
    """(state, activations) bytes per device, for the pruning rule."""
    return memory(sizes(exp, device), layout)


def gpus_per_node(device: str) -> int:
    return links.interconnect(device).gpus_per_node


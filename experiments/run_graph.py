"""Hyperparameters -> the run as a Fiddle graph (built into a core.spec.RunSpec).

Everything the run will do is visible in this graph before it starts: main.py
writes it to job_log_dir and `--print_config` shows it.
"""


import fiddle as fdl

from layers import attention, fp8, lora, stack
from layers.stack import transformer_layer_template
from paxloom.core import mesh_axes, spec
from paxloom.core.errors import UserError
from paxloom.core.log import log
from paxloom.core.mesh_axes import CONTEXT_AXIS, full_shape
from paxloom.core.target import TargetDevice, this_process
from paxloom.runner.state import optimizer, partitioning


def build_run_config(exp, data_dir: str | None = None, vocab_path: str | None = None,
                     cache_dir: str | None = None, target: TargetDevice | None = None
                     ) -> fdl.Config:
    target = target or this_process()
    mesh = fdl.Config(spec.MeshSpec, ici_mesh_shape=full_shape(exp.ICI_MESH_SHAPE),
                      dcn_mesh_shape=full_shape(exp.DCN_MESH_SHAPE))
    # The experiment says what the model is; the pipeline stages and the sharding for the
    # mesh come last, once.
    model = _with_attention_impl(exp, exp.model_template(), target)
    if exp.USE_LORA:
        model = _with_lora(exp, model)
    if exp.USE_FP8:
        model = _with_fp8(model, target)
    pipeline = _pipeline(exp)
    if pipeline is not None:
        model.lm_tpl.stacked_transformer_tpl = stack.pipelined(
            model.lm_tpl.stacked_transformer_tpl, num_stages=exp.num_stages(),
            circular_repeat=exp.CIRCULAR_REPEAT, num_microbatches=exp.NUM_MICROBATCHES,
            microbatch_size=exp.MICROBATCH_SIZE, stream_io=exp.STREAM_IO)
    model = partitioning.shard_model(model, spec.mesh_size(mesh))
    if mesh_axes.axis_size(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE, CONTEXT_AXIS) > 1:
        attention.use_context_parallelism(model.lm_tpl, exp.CONTEXT_PARALLEL_STRATEGY)
    schedule = _schedule(exp)
    opt = fdl.Config(
        optimizer.adamw,
        schedule=schedule,
        beta1=exp.ADAM_BETA1,
        beta2=exp.ADAM_BETA2,
        epsilon=exp.ADAM_EPSILON,
        epsilon_root=exp.ADAM_EPSILON_ROOT,
        clip_threshold=exp.ADAM_CLIP_THRESHOLD,
        weight_decay=exp.WEIGHT_DECAY,
        clip_gradient_norm_to_value=exp.CLIP_GRADIENT_NORM_TO_VALUE,
    )
    if exp.USE_LORA:  # only the adapters train: no moments, clipping or decay for the rest
        opt = fdl.Config(optimizer.train_only, tx=opt, trainable=lora.ADAPTER_RULE)
    if exp.USE_FP8:  # the scaling state is the backward pass's to update, not Adam's
        opt = fdl.Config(optimizer.overwrite_with_gradient, tx=opt,
                         overwritten=fp8.SCALING_STATE_RULE)
    settings = exp.data_settings(data_dir=data_dir, vocab_path=vocab_path, cache_dir=cache_dir)
    return fdl.Config(
        spec.RunSpec,
        name=type(exp).__name__,
        model=model,
        optimizer=opt,
        learning_rate=schedule,
        mesh=mesh,
        loop=fdl.Config(
            spec.LoopSpec,
            max_steps=exp.MAX_STEPS, summary_interval_steps=exp.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=exp.EVAL_INTERVAL_STEPS,
            checkpoint_every_n_steps=exp.CHECKPOINT_EVERY_N_STEPS,
            checkpoint_max_to_keep=exp.CHECKPOINT_MAX_TO_KEEP,
            skip_nonfinite_steps=exp.SKIP_NONFINITE_STEPS,
            percore_batch_size=exp.PERCORE_BATCH_SIZE, random_seed=exp.RANDOM_SEED,
            gradient_accumulation_steps=exp.GRADIENT_ACCUMULATION_STEPS,
        ),
        model_shape=fdl.Config(spec.ModelShape, num_layers=exp.NUM_LAYERS,
                               num_heads=exp.NUM_HEADS, dims_per_head=exp.DIMS_PER_HEAD,
                               seq_len=exp.MAX_SEQ_LEN, vocab_size=exp.VOCAB_SIZE,
                               expert_share=(exp.NUM_EXPERTS_PER_TOKEN / exp.NUM_EXPERTS
                                             if exp.NUM_EXPERTS else 1.0),
                               num_experts=exp.NUM_EXPERTS,
                               expert_axis=(None if "EXPERT_AXIS" in exp.unused_hyperparameters()
                                            else exp.EXPERT_AXIS),
                               max_segments=exp.MAX_SEGMENTS_PER_SEQ),
        make_train_input=exp.train_dataset(settings),
        evals=exp.evaluations(settings),
        tokenizer=exp.dataset().tokenizer(settings),
        initial_weights=_initial_weights(exp),
        pipeline=pipeline,
    )


def _pipeline(exp) -> fdl.Config | None:
    """The pipeline schedule of a mesh with several stages (checked in exp.validate)."""
    stages = exp.num_stages()
    if stages == 1:
        return None
    return fdl.Config(spec.PipelineSpec, num_stages=stages,
                      num_microbatches=exp.batch_layout().num_microbatches,
                      circular_repeat=exp.CIRCULAR_REPEAT)


def _schedule(exp) -> fdl.Config:
    """Pax's LR_SCHEDULE: 'constant' (praxis schedules.Constant: LEARNING_RATE, LR_COS_*
    unused) or 'linear_rampup_cosine_decay' (experiments/pax_compat.py refuses the others)."""
    if exp.LR_SCHEDULE == "constant":
        return fdl.Config(optimizer.constant, learning_rate=exp.LEARNING_RATE)
    return fdl.Config(
        optimizer.linear_rampup_cosine_decay,
        learning_rate=exp.LEARNING_RATE, warmup_steps=exp.LR_COS_WARMUP,
        decay_start=exp.LR_COS_DECAY_START, decay_end=exp.LR_COS_DECAY_END,
        min_ratio=exp.LR_COS_MIN_RATIO, peak=exp.LR_COS_MAX,
    )


def _initial_weights(exp) -> fdl.Config | None:
    """CHECKPOINT_RESTORE_PATH and its ignore rules, plus Pax LoRAMixin's rule for the
    adapters (Pax replaces the rules with it; here a user's own rules still apply)."""
    if not exp.CHECKPOINT_RESTORE_PATH:
        return None
    rules = list(exp.CHECKPOINT_IGNORE_RULES or [])
    if exp.USE_LORA and lora.ADAPTER_RULE not in rules:  # the adapters start at zero
        rules.append(lora.ADAPTER_RULE)
    # FP8 scaling state starts fresh (a bfloat16 checkpoint has none; an FP8 one's scales
    # describe the source run's activations).
    if exp.USE_FP8 and fp8.SCALING_STATE_RULE not in rules:
        rules.append(fp8.SCALING_STATE_RULE)
    return fdl.Config(spec.InitialWeights, path=exp.CHECKPOINT_RESTORE_PATH, ignore_rules=rules)


def _with_fp8(model, target: TargetDevice):
    """The template with FP8 matmuls (layers/fp8.py), where the target has FP8 tensor
    cores (compute capability 8.9: Ada, Hopper and newer); on a CPU, for tests, with a
    note that it is emulated. A plan for a GPU without them (an A100: --plan_device) is
    refused as the run would be; a graph only printed (--print_config) is not."""
    if target.platform == "gpu" and not target.fp8_tensor_cores and not target.printed:
        if target.planned:
            raise UserError(f"USE_FP8=True needs FP8 tensor cores (Ada, Hopper or newer) and "
                            f"the planned {target.kind} has none: plan with "
                            f"--plan_device=h100 or h200, or set --fdl.USE_FP8=False")
        raise UserError(f"USE_FP8=True needs FP8 tensor cores (Ada, Hopper or newer); "
                        f"this {target.kind} has none: set --fdl.USE_FP8=False")
    if target.platform != "gpu":
        log(f"USE_FP8 on {target.platform}: FP8 numerics are emulated, slowly (for tests); "
            f"it is a speed-up only on GPUs with FP8 tensor cores")
    return fp8.use_fp8(model)


def _with_lora(exp, model):
    """The template with LORA_RANK adapters on LORA_TARGET_LAYERS (layers/lora.py); like
    every template change, before sharding."""
    try:
        return lora.add_lora(model, exp.LORA_RANK, exp.LORA_TARGET_LAYERS)
    except ValueError as e:
        raise UserError(f"USE_LORA: {e}") from None


def _with_attention_impl(exp, model, target: TargetDevice):
    """The template with ATTENTION_IMPL's attention (layers/attention.py), decided here,
    before tracing, because it depends on the devices the run will trace for: this
    process's, or the GPU that --mode=plan plans for."""
    platform, hopper = target.platform, target.hopper_or_newer
    dropout = exp.DROPOUT_PROB if exp.ATTEN_DROPOUT_PROB is None else exp.ATTEN_DROPOUT_PROB
    # The fused kernels have no logit cap (validate refuses naming one with ATTEN_LOGIT_CAP).
    choice = "praxis" if exp.ATTEN_LOGIT_CAP > 0 else exp.ATTENTION_IMPL
    kv_heads = getattr(exp, "NUM_KV_HEADS", None) or exp.NUM_HEADS
    settings = dict(packed_input=exp.PACKED_INPUT, hopper_or_newer=hopper,
                    dtype=exp.FPROP_DTYPE, grouped_kv=kv_heads < exp.NUM_HEADS)
    context_shards = mesh_axes.axis_size(exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE, CONTEXT_AXIS)
    try:
        impl = attention.resolve(choice, platform=platform, atten_dropout_prob=dropout,
                                 head_dim=exp.DIMS_PER_HEAD, context_shards=context_shards,
                                 device_checks=not target.printed, **settings)
        layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
        attention.use_attention_impl(
            layer, impl, hopper_or_newer=hopper,
            pallas_interpret=not target.planned and platform != "gpu",
            max_segments=exp.MAX_SEGMENTS_PER_SEQ, packed_input=exp.PACKED_INPUT)
    except ValueError as e:
        raise UserError(str(e)) from None
    if platform == "gpu":
        case = attention.case_of(context=context_shards > 1, **settings)
        note = attention.start_note(choice, impl, case)
        if note:
            log(note)
    note = attention.packed_gqa_note(layer)
    if note:
        log(note)
    return model

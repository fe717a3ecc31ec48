"""Registry, hyperparameter declarations, override parsing and their error messages."""

import dataclasses
import re
import sys
import textwrap

import pytest
from praxis import pax_fiddle

import experiments
from experiments import overrides, registry
from experiments.base import BaseExperiment
from experiments.groups import CHOICES
from paxloom.core.errors import UserError


def test_builtin_experiments_are_registered():
    names = experiments.registered()
    for name in ("GPT126M", "GPT5B", "GPT175B", "Synthetic126M", "Synthetic5B",
                 "Synthetic175B", "Tiny"):
        assert name in names
    assert experiments.resolve("experiments.GPT5B") is names["GPT5B"]


def test_no_two_experiment_names_differ_only_in_case():
    """Pax's LLaMA7B and Paxloom's Llama-2-shaped Llama2_7B: a name typed with the other's
    case must not silently run the other experiment."""
    lowered = {}
    for name in experiments.registered():
        assert name.lower() not in lowered, (name, lowered.get(name.lower()))
        lowered[name.lower()] = name


# Literals from paxml's paxml/contrib/gpu/scripts_gpu/configs.py (GPT126M, GPT5B, GPT175B)
# and what those classes inherit from paxml's TransformerLmSpmdAdam/Adafactor.
REFERENCE = {
    "GPT126M": dict(
        NUM_LAYERS=12, NUM_HEADS=12, MODEL_DIMS=768, HIDDEN_DIMS=3072, DIMS_PER_HEAD=64,
        INIT_STD=0.023, SOFTMAX_INIT_STD=0.023, LEARNING_RATE=6e-4, LR_COS_WARMUP=636,
        LR_COS_DECAY_START=637, LR_COS_DECAY_END=500000, MAX_STEPS=600000,
        PERCORE_BATCH_SIZE=4, ICI_MESH_SHAPE=[8, 1, 1], USE_REPEATED_LAYER=False,
        CHECKPOINT_POLICY="none", INPUT_DROPOUT_PROB=0.0, VOCAB_SIZE=50304,
        SUMMARY_INTERVAL_STEPS=100, EVAL_INTERVAL_STEPS=100, CHECKPOINT_EVERY_N_STEPS=5000,
        CHECKPOINT_MAX_TO_KEEP=10),
    "GPT5B": dict(
        NUM_LAYERS=24, NUM_HEADS=32, MODEL_DIMS=4096, HIDDEN_DIMS=16384, DIMS_PER_HEAD=128,
        INIT_STD=0.01, SOFTMAX_INIT_STD=0.01, LEARNING_RATE=1.6e-4, LR_COS_WARMUP=115,
        LR_COS_DECAY_START=116, LR_COS_DECAY_END=62500, MAX_STEPS=75000,
        PERCORE_BATCH_SIZE=8, ICI_MESH_SHAPE=[1, 8, 1], USE_REPEATED_LAYER=True,
        CHECKPOINT_POLICY="save_dot_with_no_batch_dims", INPUT_DROPOUT_PROB=0.1,
        VOCAB_SIZE=50304, SUMMARY_INTERVAL_STEPS=10, EVAL_INTERVAL_STEPS=100,
        CHECKPOINT_EVERY_N_STEPS=250, CHECKPOINT_MAX_TO_KEEP=10),
    "GPT175B": dict(
        NUM_LAYERS=96, NUM_HEADS=96, MODEL_DIMS=12288, HIDDEN_DIMS=49152, DIMS_PER_HEAD=128,
        INIT_STD=0.023, SOFTMAX_INIT_STD=0.023, LEARNING_RATE=2e-5, LR_COS_WARMUP=265,
        LR_COS_DECAY_START=266, LR_COS_DECAY_END=108600, MAX_STEPS=75000,
        PERCORE_BATCH_SIZE=6, ICI_MESH_SHAPE=[1, 8, 1], USE_REPEATED_LAYER=True,
        CHECKPOINT_POLICY="save_nothing", INPUT_DROPOUT_PROB=0.0, VOCAB_SIZE=50257,
        SUMMARY_INTERVAL_STEPS=10, EVAL_INTERVAL_STEPS=100, CHECKPOINT_EVERY_N_STEPS=100,
        CHECKPOINT_MAX_TO_KEEP=10),
}
# Shared by all three.
REFERENCE_GPT = dict(
    MAX_SEQ_LEN=2048, PACKED_INPUT=True, FPROP_DTYPE="bfloat16", LAYERNORM_EPSILON=1e-5,
    ADAM_BETA1=0.9, ADAM_BETA2=0.95, ADAM_EPSILON=1e-8, WEIGHT_DECAY=0.1,
    CLIP_GRADIENT_NORM_TO_VALUE=1.0, LR_COS_MIN_RATIO=0.1, DROPOUT_PROB=0.0,
    EMBEDDING_LOOKUP_STYLE="matmul")


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_gpt_hyperparameters_are_the_reference_values(name):
    exp = experiments.resolve(f"experiments.{name}")()
    for key, value in {**REFERENCE_GPT, **REFERENCE[name]}.items():
        assert getattr(exp, key) == value, f"{name}.{key}"


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_gpt_model_graph_is_the_reference_model(name):
    """What configure_gpt3_task and GPT126M.task() set, read from the built Fiddle graph."""
    from praxis.layers import activations, attentions, embedding_softmax, normalizations

    from layers.stack import transformer_layer_template

    exp = experiments.resolve(f"experiments.{name}")()
    model = exp.run_config().model
    ref = REFERENCE[name]
    assert model.params_init.method == "gaussian" and model.params_init.scale == ref["INIT_STD"]
    assert model.apply_eval_sample_weights is True
    lm = model.lm_tpl
    softmax = lm.softmax_tpl
    # Tied; praxis's class with the training loss over chunks of the sequence (layers/softmax.py).
    assert issubclass(softmax.cls, embedding_softmax.SharedEmbeddingSoftmax)
    assert softmax.loss_chunk_len == 512
    assert softmax.params_init.scale == ref["SOFTMAX_INIT_STD"]
    assert softmax.scale_sqrt_depth is False and softmax.soft_cap_logits is None
    assert softmax.feed_forward_tpl.has_bias is False
    assert softmax.lookup_style == "matmul" and lm.position_emb_tpl.lookup_style == "matmul"
    assert lm.position_emb_tpl.cls is embedding_softmax.TrainablePositionalEmbedding
    assert lm.position_emb_tpl.max_seq_length == 2048
    layer = transformer_layer_template(lm.stacked_transformer_tpl)
    for ln in (lm.final_ln_tpl, layer.ln_tpl, layer.tr_fflayer_tpl.ln_tpl):
        assert ln.cls is normalizations.LayerNorm
        assert ln.epsilon == 1e-5 and ln.reductions_in_fp32 is True
    attention = layer.tr_atten_tpl
    assert attention.cls is attentions.DotProductAttention
    assert attention.use_bias is True and attention.internal_enable_per_dim_scale is False
    assert attention.combine_qkv is True and attention.atten_logit_cap <= 0
    assert attention.weight_split_dims_mapping.proj == ["data", "mdl", None]
    ffn = layer.tr_fflayer_tpl
    assert ffn.activation_tpl.cls is activations.GELU and ffn.activation_tpl.approximate is True
    assert ffn.has_bias is True and ffn.use_gated_activation is False
    assert layer.norm_policy == "pre"


def test_print_config_shows_the_reference_values(capsys):
    from paxloom.launch.record import config_report

    exp = experiments.resolve("experiments.GPT126M")()
    text = config_report(exp, exp.run_config())
    for line in ("INIT_STD = 0.023", "SOFTMAX_INIT_STD = 0.023", "LR_COS_WARMUP = 636",
                 "LR_COS_DECAY_START = 637", "LR_COS_DECAY_END = 500000",
                 "CHECKPOINT_POLICY = 'none'"):
        assert line in text, line
    assert "model.lm_tpl.softmax_tpl = ChunkedSharedEmbeddingSoftmax" in text
    assert "reductions_in_fp32: bool = True" in text
    assert "scale_sqrt_depth: bool = False" in text and "combine_qkv: bool = True" in text


# Literals from paxml's configs.py (LLaMA7B, LLaMA13B, LLaMA70B) and what they inherit:
# llama_utils.BaseLLaMA, c4.TransformerLmSpmdAdam (over TransformerLmSpmdAdafactor),
# tasks.BoolQDataset, lora_utils.LoRAMixin, checkpoint_utils.CheckpointRestoreMixin.
REFERENCE_LLAMA = {
    "LLaMA7B": dict(NUM_LAYERS=32, MODEL_DIMS=4096, NUM_HEADS=32, NUM_KV_HEADS=32,
                    HIDDEN_DIMS=11008, PERCORE_BATCH_SIZE=16, DCN_MESH_SHAPE=[1, 1, 1]),
    "LLaMA13B": dict(NUM_LAYERS=40, MODEL_DIMS=5120, NUM_HEADS=40, NUM_KV_HEADS=40,
                     HIDDEN_DIMS=13824, PERCORE_BATCH_SIZE=8, DCN_MESH_SHAPE=[1, 1, 1]),
    "LLaMA70B": dict(NUM_LAYERS=80, MODEL_DIMS=8192, NUM_HEADS=64, NUM_KV_HEADS=8,
                     HIDDEN_DIMS=28672, PERCORE_BATCH_SIZE=4, DCN_MESH_SHAPE=[1, 2, 1]),
}
REFERENCE_LLAMA_SHARED = dict(
    VOCAB_SIZE=32000, DIMS_PER_HEAD=128, ICI_MESH_SHAPE=[1, 8, 1], FPROP_DTYPE="bfloat16",
    LAYERNORM_EPSILON=1e-5, PACKED_INPUT=False, MAX_SEQ_LEN=4096, DATASET="boolq",
    USE_REPEATED_LAYER=False, CHECKPOINT_POLICY="save_nothing", LEARNING_RATE=1e-3,
    ADAM_BETA1=0.9, ADAM_BETA2=0.99, ADAM_EPSILON=1e-6, WEIGHT_DECAY=1e-3,
    CLIP_GRADIENT_NORM_TO_VALUE=5.0, LR_COS_WARMUP=4000, LR_COS_DECAY_START=4001,
    LR_COS_DECAY_END=300000, LR_COS_MIN_RATIO=0.1, SUMMARY_INTERVAL_STEPS=100,
    EVAL_INTERVAL_STEPS=100, CHECKPOINT_EVERY_N_STEPS=5000, CHECKPOINT_MAX_TO_KEEP=10,
    USE_LORA=False, LORA_RANK=8, LORA_TARGET_LAYERS="all", CHECKPOINT_RESTORE_PATH=None,
    CHECKPOINT_IGNORE_RULES=None)


@pytest.mark.parametrize("name", sorted(REFERENCE_LLAMA))
def test_pax_llama_experiments_print_the_reference_values(name):
    from praxis.layers import multi_query_attention, normalizations

    from layers.stack import transformer_layer_template
    from paxloom.launch.record import config_report

    exp = experiments.resolve(f"paxml.contrib.gpu.scripts_gpu.configs.{name}")()
    assert type(exp) is experiments.resolve(f"experiments.{name}")
    config = exp.run_config()
    text = config_report(exp, config)  # what --print_config prints
    for key, value in {**REFERENCE_LLAMA_SHARED, **REFERENCE_LLAMA[name]}.items():
        assert f"{key} = {value!r}" in text.splitlines(), f"{name}.{key}"
    layer = transformer_layer_template(config.model.lm_tpl.stacked_transformer_tpl)
    assert layer.ln_tpl.cls is normalizations.RmsNorm and layer.ln_tpl.epsilon == 1e-5
    assert config.model.lm_tpl.packed_input is False
    grouped = issubclass(layer.tr_atten_tpl.cls, multi_query_attention.MultiQueryDotProductAttention)
    assert grouped == (name == "LLaMA70B")
    if grouped:
        assert layer.tr_atten_tpl.num_kv_heads == 8
    else:
        assert layer.tr_atten_tpl.combine_qkv is True


def test_every_experiment_documents_its_command():
    for name, cls in experiments.registered().items():
        assert "python main.py --fdl_config=experiments." + name in (cls.__doc__ or ""), name


@pytest.mark.parametrize("doc,sentence", [
    ("Llama 3.1 8B shape (RoPE theta 500000,\n    a 128256-token vocabulary).\n    More.",
     "Llama 3.1 8B shape (RoPE theta 500000, a 128256-token vocabulary)."),
    ("GPT-3 XL's width (Brown et al. 2020). Not Pax's.", "GPT-3 XL's width (Brown et al. 2020)."),
    ("46.7B parameters, as configs.Pile5B and `a = b. c` say. More.",
     "46.7B parameters, as configs.Pile5B and `a = b. c` say."),
    ("No full stop\n\nA second paragraph.", "No full stop"),
    (None, ""),
])
def test_summary_is_the_docstrings_whole_first_sentence(doc, sentence):
    assert registry.summary(type("Exp", (), {"__doc__": doc})) == sentence


def test_list_experiments_shows_each_first_sentence_whole(capsys):
    from paxloom.main import list_experiments

    assert list_experiments(None) == 0
    listed = capsys.readouterr().out
    # Wrapped under the names' column: a continuation line starts with spaces.
    entries = re.split(r"\n(?=experiments\.)", listed.strip())
    for entry, (name, cls) in zip(entries, registry.registered().items(), strict=True):
        shown_name, _, text = " ".join(entry.split()).partition(" ")
        assert shown_name == f"experiments.{name}"
        assert text == registry.summary(cls) and text.endswith("."), name
    for cut in ("RoPE theta 500000 with its \"llama3\" scaling", "split 8 ways"):
        assert cut in " ".join(listed.split())
    assert max(map(len, listed.splitlines())) <= 100


def test_unknown_experiment_names_near_match():
    with pytest.raises(UserError, match="no experiment named GPT5X.*did you mean GPT5B"):
        experiments.resolve("experiments.GPT5X")


def test_misspelt_subclass_attribute_is_an_error_at_class_creation():
    with pytest.raises(UserError, match="LR_COS_MIN_RATO.*did you mean LR_COS_MIN_RATIO"):
        class Typo(BaseExperiment):  # noqa: F841
            LR_COS_MIN_RATO = 0.1


def test_wrong_type_in_subclass_is_an_error():
    with pytest.raises(UserError, match="NUM_LAYERS.*is int"):
        class Bad(BaseExperiment):  # noqa: F841
            NUM_LAYERS = "twelve"


def test_annotation_declares_a_new_hyperparameter():
    class WithKnob(BaseExperiment):
        MY_KNOB: int = 3

    assert WithKnob(MY_KNOB=5).MY_KNOB == 5
    assert "MY_KNOB" in WithKnob.hyperparameter_types()
    assert "MY_KNOB" not in BaseExperiment.hyperparameter_types()


def test_overrides_parse_python_literals():
    rest, raw, paths = overrides.split([
        "main.py", "--fdl.ICI_MESH_SHAPE=[1,8,1]", "--fdl.PERCORE_BATCH_SIZE=0.5",
        '--fdl.FPROP_DTYPE="bfloat16"', "--fdl.USE_REPEATED_LAYER=True", "--job_log_dir=/tmp/x",
        "--fdl.loop.max_steps=3"])
    assert rest == ["main.py", "--job_log_dir=/tmp/x"]
    assert paths == {"loop.max_steps": "3"}  # a path in the Fiddle graph, not a hyperparameter
    values = overrides.hyperparameter_values(raw, BaseExperiment.hyperparameter_types())
    assert values == {"ICI_MESH_SHAPE": [1, 8, 1], "PERCORE_BATCH_SIZE": 0.5,
                      "FPROP_DTYPE": "bfloat16", "USE_REPEATED_LAYER": True}
    exp = BaseExperiment(**values)
    assert exp.PERCORE_BATCH_SIZE == 0.5 and exp.FPROP_DTYPE == "bfloat16"


def test_bare_word_is_accepted_for_string_hyperparameters_only():
    declared = BaseExperiment.hyperparameter_types()
    assert overrides.hyperparameter_values({"FPROP_DTYPE": "bfloat16"}, declared) == {
        "FPROP_DTYPE": "bfloat16"}
    with pytest.raises(UserError, match=r"--fdl.NUM_LAYERS=abc: not a Python literal"):
        overrides.hyperparameter_values({"NUM_LAYERS": "abc"}, declared)


@pytest.mark.parametrize("raw,value", [
    ("True", True), ("False", False), ("true", True), ("FALSE", False), ("yes", True),
    ("No", False), ("1", True), ("0", False)])
def test_bool_overrides_take_what_a_user_types(raw, value):
    declared = BaseExperiment.hyperparameter_types()
    assert overrides.hyperparameter_values({"USE_FP8": raw}, declared) == {"USE_FP8": value}
    config = experiments.resolve("experiments.Tiny")().run_config()
    overrides.apply_to_graph(config, {"model.lm_tpl.packed_input": raw})
    assert config.model.lm_tpl.packed_input is value
    # A user's `bool | None` hyperparameter also takes None.
    assert overrides.hyperparameter_values({"MINE": raw}, {"MINE": bool | None}) == {"MINE": value}
    assert overrides.hyperparameter_values({"MINE": "None"}, {"MINE": bool | None}) == {"MINE": None}


@pytest.mark.parametrize("raw", ["maybe", "2", '"yes"', "", "None"])
def test_other_bool_overrides_are_one_line_naming_true_or_false(raw):
    declared = BaseExperiment.hyperparameter_types()
    with pytest.raises(UserError) as info:
        overrides.hyperparameter_values({"USE_FP8": raw}, declared)
    assert str(info.value) == f"--fdl.USE_FP8={raw}: not a bool; write True or False"
    with pytest.raises(UserError, match=r"^--fdl.model.lm_tpl.packed_input=.*write True or False$"):
        overrides.apply_to_graph(experiments.resolve("experiments.Tiny")().run_config(),
                                 {"model.lm_tpl.packed_input": raw})


def test_override_without_value_is_an_error():
    with pytest.raises(UserError, match="--fdl.NAME=VALUE"):
        overrides.split(["--fdl.NUM_LAYERS"])


@pytest.mark.parametrize("name,value,message", [
    ("NUM_LAYRES", 2, r"no hyperparameter NUM_LAYRES \(did you mean NUM_LAYERS"),
    ("learning_rate", 0.1, r"no hyperparameter learning_rate \(did you mean LEARNING_RATE\?"),
    ("NUM_LAYERS", 2.5, r"--fdl.NUM_LAYERS=2.5 has type float, but NUM_LAYERS is int"),
    ("NUM_LAYERS", True, r"has type bool, but NUM_LAYERS is int"),
    ("ICI_MESH_SHAPE", [1, "8", 1], r"ICI_MESH_SHAPE is list\[int\]"),
    ("FPROP_DTYPE", "bf16", r"not one of float32, bfloat16"),
    ("ICI_MESH_SHAPE", [8, 1], r"must be three positive sizes"),
    ("NUM_LAYERS", 0, r"NUM_LAYERS=0 must be positive"),
    ("LR_COS_WARMUP", 500, r"LR_COS_WARMUP \(500\) <= LR_COS_DECAY_START"),
    ("ATTEN_DROPOUT_PROB", "high", r"ATTEN_DROPOUT_PROB is float or None \(e.g. 0.5\)"),
    ("DROPOUT_PROB", 1.5, r"DROPOUT_PROB=1.5 must be a probability in \[0, 1\)"),
    ("ATTENTION_IMPL", "flashy", r"not one of praxis, xla, cudnn, pallas, flash, auto"),
    ("LEARNING_RATE", float("inf"), r"LEARNING_RATE=inf must be a positive number"),
    ("LEARNING_RATE", 0, r"LEARNING_RATE=0.0 must be a positive number"),
    ("CHECKPOINT_MAX_TO_KEEP", -1, r"CHECKPOINT_MAX_TO_KEEP and CHECKPOINT_EVERY_N_STEPS must"),
])
def test_bad_overrides_give_one_line_errors(name, value, message):
    with pytest.raises(UserError, match=message) as info:
        BaseExperiment(**{name: value})
    assert "\n" not in str(info.value)


def test_an_int_is_a_fine_float():
    exp = BaseExperiment(LEARNING_RATE=1)
    assert exp.LEARNING_RATE == 1.0 and isinstance(exp.LEARNING_RATE, float)


def test_optional_hyperparameters_take_none_or_their_type():
    declared = BaseExperiment.hyperparameter_types()
    values = overrides.hyperparameter_values(
        {"ATTEN_DROPOUT_PROB": "None", "RELU_DROPOUT_PROB": "0"}, declared)
    exp = BaseExperiment(**values)
    assert exp.ATTEN_DROPOUT_PROB is None
    assert exp.RELU_DROPOUT_PROB == 0.0 and isinstance(exp.RELU_DROPOUT_PROB, float)


def test_checkpoint_policy_choices_are_praxis_names():
    from praxis.layers import checkpoint_policy

    for name in CHOICES["CHECKPOINT_POLICY"]:
        if name != "none":
            checkpoint_policy.AutodiffCheckpointType(name)


def test_user_subclass_in_own_module(tmp_path, monkeypatch):
    (tmp_path / "my_exps.py").write_text(textwrap.dedent("""
        from experiments.gpt import GPT126M

        class MyGPT(GPT126M):
            NUM_LAYERS = 4
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = experiments.resolve("my_exps.MyGPT")
        assert cls().NUM_LAYERS == 4 and cls().MODEL_DIMS == 768
        with pytest.raises(UserError, match="has no class MyGTP.*did you mean MyGPT"):
            experiments.resolve("my_exps.MyGTP")
        with pytest.raises(UserError, match="cannot import no_such_module"):
            experiments.resolve("no_such_module.X")
    finally:
        sys.modules.pop("my_exps", None)


@pytest.mark.parametrize("source,message", [
    ("raise RuntimeError('no GPU quota')\n",
     r"importing broken_exps failed: RuntimeError: no GPU quota$"),
    ("class A(:\n    pass\n", r"importing broken_exps failed: SyntaxError: .*broken_exps.py, line 1"),
])
def test_a_broken_experiment_module_is_one_line(source, message, tmp_path, monkeypatch):
    (tmp_path / "broken_exps.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(UserError, match=message) as info:
            experiments.resolve("broken_exps.MyGPT")
        assert "\n" not in str(info.value)
    finally:
        sys.modules.pop("broken_exps", None)


def test_the_pax_gpu_configs_module_names_resolve_to_the_same_experiments():
    assert experiments.resolve("paxml.contrib.gpu.scripts_gpu.configs.Pile126M") is (
        experiments.resolve("experiments.Pile126M"))


def test_run_config_is_a_fiddle_graph_that_builds():
    from praxis import pax_fiddle

    run = pax_fiddle.build(experiments.resolve("experiments.Tiny")().run_config())
    assert run.name == "Tiny"
    assert run.loop.max_steps == 800
    assert type(run.model).__name__ == "LanguageModel"
    assert run.make_train_input is not None


def test_the_docs_document_every_hyperparameter():
    from tests.support.paths import REPO_ROOT

    reference = (REPO_ROOT / "docs" / "reference" / "hyperparameters.md").read_text()
    for name in BaseExperiment.hyperparameter_types():
        assert f"| `{name}` |" in reference, f"the hyperparameter reference lacks {name}"


def test_dotted_overrides_set_fields_of_the_fiddle_graph():
    exp = experiments.resolve("experiments.Tiny")()
    config = exp.run_config()
    changes = overrides.apply_to_graph(config, {
        "model.lm_tpl.stacked_transformer_tpl.num_layers": "3", "loop.max_steps": "7",
        "evals[0].name": "held_out", "optimizer.schedule.learning_rate": "1"})
    assert changes[0] == "model.lm_tpl.stacked_transformer_tpl.num_layers: 2 -> 3"
    assert config.model.lm_tpl.stacked_transformer_tpl.num_layers == 3
    assert config.loop.max_steps == 7 and config.evals[0].name == "held_out"
    assert config.optimizer.schedule.learning_rate == 1.0  # an int is a fine float
    run = pax_fiddle.build(config)
    assert run.model.lm_tpl.stacked_transformer_tpl.num_layers == 3


@pytest.mark.parametrize("path,value,message", [
    ("model.lm_tpl.stacked_transformer_tpl.num_layer", "3",
     r"StackedTransformer\) has no field num_layer \(did you mean num_layers"),
    ("learning_rat", "0.1", r"RunSpec\) has no field learning_rat \(did you mean LEARNING_RATE\?"),
    ("learning_rate", "0.1", r"learning_rate is a Config of linear_rampup_cosine_decay, not a "
                             r"value.*did you mean LEARNING_RATE"),
    ("loop.max_steps", '"many"', r"--fdl.loop.max_steps='many': the field holds int \(800\)"),
    ("loop.max_steps", "True", r"the field holds int \(800\), not bool"),
    ("evals[5].name", "x", r"evals has 2 items; index 5 is out of range"),
    ("loop.max_steps.x", "1", r"loop.max_steps is 800, which has no field x"),
    ("loop.-x", "1", r"'-x' is not a field name"),
])
def test_bad_dotted_overrides_give_one_line_errors(path, value, message):
    exp = experiments.resolve("experiments.Tiny")()
    with pytest.raises(UserError, match=message) as info:
        overrides.apply_to_graph(exp.run_config(), {path: value}, exp.hyperparameter_types())
    assert "\n" not in str(info.value)


def _applying(text: str) -> dict[str, str]:
    """--print_config's "## Hyperparameters" section as {name: printed value}."""
    section = text.split("## Hyperparameters\n", 1)[1].split("\n\n", 1)[0]
    return dict(line.split(" = ", 1) for line in section.splitlines())


@pytest.mark.parametrize("name", sorted(registry.registered()))
def test_print_config_lists_as_applying_only_what_the_graph_reads(name):
    """For every registered experiment, the feed-forward activation and the attention
    biases --print_config lists as applying are the graph's; what the model does not read
    (a Llama's or GLaM's GPT architecture names) is listed apart."""
    from layers import gpt
    from layers.stack import transformer_layer_template
    from paxloom.launch.record import config_report

    exp = registry.registered()[name]()
    model = exp.model_template()
    applying = _applying(config_report(exp, exp.run_config()))
    layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
    activation = layer.tr_fflayer_tpl.activation_tpl.cls
    # A name listed as applying must be the graph's (a Llama's SiLU-gated, bias-free layers
    # failed this while their GELU and biases were listed with the rest).
    if "ACTIVATION_CLS" in applying:
        assert activation is gpt.activation_class(exp.ACTIVATION_CLS), name
    if "USE_BIAS" in applying:
        assert layer.tr_atten_tpl.use_bias == exp.USE_BIAS, name
    assert not set(applying) & set(exp.unused_hyperparameters()), name


def _printed_or_refused(name: str, values: dict[str, str], target) -> str:
    """What main.py --print_config does with --fdl.NAME=VALUE `values`, built for `target`:
    the printed report, or the one-line refusal."""
    from paxloom.launch import record, resolve

    try:
        exp, selection = resolve.experiment(resolve.Selection(fdl_config=name), values)
        return record.config_report(exp, resolve.run_graph(exp, selection, {}, target))
    except UserError as error:
        return f"refused: {error}"


@pytest.mark.parametrize("name", sorted(registry.registered()))
def test_print_config_on_a_cpu_shows_what_only_a_gpu_runs(name):
    """--print_config builds the graph to show it, not to run it: on this CPU it prints every
    experiment, with ATTENTION_IMPL='cudnn' wherever a plan for an H100 takes it; what the
    settings themselves rule out (float32 for cuDNN, GLaM's position biases) is refused as
    the plan refuses it."""
    from paxloom.core.target import this_process
    from paxloom.runner.planning.plan import target_device

    printed = this_process(printed=True)
    assert printed.platform == "cpu"
    default = _printed_or_refused(f"experiments.{name}", {}, printed)
    assert not default.startswith("refused"), default
    cudnn = {"ATTENTION_IMPL": '"cudnn"'}
    shown = _printed_or_refused(f"experiments.{name}", cudnn, printed)
    planned = _printed_or_refused(f"experiments.{name}", cudnn, target_device("h100"))
    if planned.startswith("refused"):
        assert shown == planned
    else:
        assert "ATTENTION_IMPL = 'cudnn'" in shown, shown
        assert "attention_impl: str = 'cudnn'" in shown


def test_print_config_shows_fp8_for_a_gpu_without_fp8_tensor_cores():
    """Printing is not refused for lack of FP8 tensor cores (an A100's); running there is."""
    from paxloom.core.target import TargetDevice

    a100 = TargetDevice(platform="gpu", kind="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))
    fp8 = {"USE_FP8": "True"}
    assert "USE_FP8 = True" in _printed_or_refused("experiments.Tiny", fp8,
                                                   dataclasses.replace(a100, printed=True))
    assert "needs FP8 tensor cores" in _printed_or_refused("experiments.Tiny", fp8, a100)

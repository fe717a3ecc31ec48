"""Registry, hyperparameter declarations, override parsing and their error messages."""

import sys
import textwrap

import pytest

import experiments
from experiments.base import CHOICES, BaseExperiment
from main import parse_override_values, split_overrides
from runner.errors import UserError


def test_builtin_experiments_are_registered():
    names = experiments.registered()
    for name in ("GPT126M", "GPT5B", "GPT175B", "Synthetic126M", "Synthetic5B",
                 "Synthetic175B", "Tiny"):
        assert name in names
    assert experiments.resolve("experiments.GPT5B") is names["GPT5B"]


def test_reference_meshes_and_sizes():
    gpt126m, gpt5b, gpt175b = (experiments.resolve(f"experiments.{n}")()
                               for n in ("GPT126M", "GPT5B", "GPT175B"))
    assert gpt126m.ICI_MESH_SHAPE == [8, 1, 1]
    assert gpt5b.ICI_MESH_SHAPE == [1, 8, 1] and gpt175b.ICI_MESH_SHAPE == [1, 8, 1]
    assert (gpt126m.NUM_LAYERS, gpt126m.MODEL_DIMS, gpt126m.NUM_HEADS) == (12, 768, 12)
    assert (gpt175b.NUM_LAYERS, gpt175b.MODEL_DIMS) == (96, 12288)
    for exp in (gpt126m, gpt5b, gpt175b):
        assert exp.ADAM_BETA2 == 0.95 and exp.WEIGHT_DECAY == 0.1
        assert exp.CLIP_GRADIENT_NORM_TO_VALUE == 1.0 and exp.LAYERNORM_EPSILON == 1e-5


def test_every_experiment_documents_its_command():
    for name, cls in experiments.registered().items():
        assert "python main.py --fdl_config=experiments." + name in (cls.__doc__ or ""), name


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
    rest, raw = split_overrides(["main.py", "--fdl.ICI_MESH_SHAPE=[1,8,1]",
                                 "--fdl.PERCORE_BATCH_SIZE=0.5", '--fdl.FPROP_DTYPE="bfloat16"',
                                 "--fdl.USE_REPEATED_LAYER=True", "--job_log_dir=/tmp/x"])
    assert rest == ["main.py", "--job_log_dir=/tmp/x"]
    values = parse_override_values(raw, BaseExperiment.hyperparameter_types())
    assert values == {"ICI_MESH_SHAPE": [1, 8, 1], "PERCORE_BATCH_SIZE": 0.5,
                      "FPROP_DTYPE": "bfloat16", "USE_REPEATED_LAYER": True}
    exp = BaseExperiment(**values)
    assert exp.PERCORE_BATCH_SIZE == 0.5 and exp.FPROP_DTYPE == "bfloat16"


def test_bare_word_is_accepted_for_string_hyperparameters_only():
    declared = BaseExperiment.hyperparameter_types()
    assert parse_override_values({"FPROP_DTYPE": "bfloat16"}, declared) == {
        "FPROP_DTYPE": "bfloat16"}
    with pytest.raises(UserError, match=r"--fdl.NUM_LAYERS=abc: not a Python literal"):
        parse_override_values({"NUM_LAYERS": "abc"}, declared)


def test_override_without_value_is_an_error():
    with pytest.raises(UserError, match="--fdl.NAME=VALUE"):
        split_overrides(["--fdl.NUM_LAYERS"])


@pytest.mark.parametrize("name,value,message", [
    ("NUM_LAYRES", 2, r"no hyperparameter NUM_LAYRES \(did you mean NUM_LAYERS"),
    ("NUM_LAYERS", 2.5, r"--fdl.NUM_LAYERS=2.5 has type float, but NUM_LAYERS is int"),
    ("NUM_LAYERS", True, r"has type bool, but NUM_LAYERS is int"),
    ("ICI_MESH_SHAPE", [1, "8", 1], r"ICI_MESH_SHAPE is list\[int\]"),
    ("FPROP_DTYPE", "bf16", r"not one of float32, bfloat16"),
    ("ICI_MESH_SHAPE", [8, 1], r"must be three positive sizes"),
    ("NUM_LAYERS", 0, r"NUM_LAYERS=0 must be positive"),
    ("LR_COS_WARMUP", 500, r"LR_COS_WARMUP \(500\) <= LR_COS_DECAY_START"),
])
def test_bad_overrides_give_one_line_errors(name, value, message):
    with pytest.raises(UserError, match=message) as info:
        BaseExperiment(**{name: value})
    assert "\n" not in str(info.value)


def test_an_int_is_a_fine_float():
    exp = BaseExperiment(LEARNING_RATE=1)
    assert exp.LEARNING_RATE == 1.0 and isinstance(exp.LEARNING_RATE, float)


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


def test_run_config_is_a_fiddle_graph_that_builds():
    from praxis import pax_fiddle

    run = pax_fiddle.build(experiments.resolve("experiments.Tiny")().run_config())
    assert run.name == "Tiny"
    assert run.loop.max_steps == 800
    assert type(run.model).__name__ == "LanguageModel"
    assert run.make_train_input is not None


def test_readme_documents_every_hyperparameter():
    from tests.data_fixtures import REPO_ROOT

    readme = (REPO_ROOT / "README.md").read_text()
    for name in BaseExperiment.hyperparameter_types():
        assert f"| `{name}` |" in readme, f"README's hyperparameter table lacks {name}"

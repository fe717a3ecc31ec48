"""A MaxText user's vocabulary: the table of MaxText settings and their Paxloom names
(paxloom/core/maxtext_names.py) against the code and the docs page, the errors that name the
Paxloom equivalent of a MaxText spelling, and `python -m paxloom.tools.from_maxtext`, which
turns a MaxText config (its base_config chain and key=value overrides) into an experiment
that resolves, prints, plans and trains."""

import re
import textwrap
from pathlib import Path

import pytest

import experiments
from experiments import registry
from experiments.groups import CHOICES
from experiments.llama import LlamaBase
from paxloom.core import maxtext_names, mesh_axes
from paxloom.core.errors import UserError
from paxloom.tools import from_maxtext
from tasks import datasets
from tests.support.paths import REPO_ROOT
from tests.support.processes import assert_one_line, run_main, session_env

PAGE = REPO_ROOT / "docs" / "guides" / "from-maxtext.md"


# ----- the table --------------------------------------------------------------------------


def test_the_docs_page_shows_the_codes_table():
    lines = PAGE.read_text(encoding="utf-8").split("## The table", 1)[1].splitlines()
    shown = [line for line in lines[:next(i for i, line in enumerate(lines[1:], 1)
                                          if line.startswith("## "))]
             if line.startswith("|")]
    expected = maxtext_names.markdown_table().splitlines()
    assert shown == expected, (
        "docs/guides/from-maxtext.md's table differs from paxloom/core/maxtext_names.py; "
        "paste the output of: .venv/bin/python -c 'from paxloom.core import maxtext_names; "
        "print(maxtext_names.markdown_table())'")


def _main_flags() -> set[str]:
    source = (REPO_ROOT / "paxloom" / "launch" / "flags.py").read_text(encoding="utf-8")
    return set(re.findall(r'DEFINE_\w+\(\s*"(\w+)"', source))


# Values of every kind a MaxText config holds, for the conversions that take any.
_ODD_VALUES = (1, 2, -1, 0, 0.5, True, False, "", "x", None, ["text"], ["silu", "linear"])


def test_every_paxloom_name_the_table_gives_exists():
    """Each name of the Paxloom column and each name a conversion yields is a declared
    hyperparameter (of the GPT or the Llama family) or a flag of main.py; the choices it
    translates to are the hyperparameter's; no conversion fails but with a reason."""
    declared = set(LlamaBase.hyperparameter_types()) | set(
        experiments.BaseExperiment.hyperparameter_types())
    flags = _main_flags()

    def exists(name: str) -> bool:
        return name[2:] in flags if name.startswith("--") else name in declared

    for setting in maxtext_names.SETTINGS:
        named = re.findall(r"`(-*[A-Za-z_]\w*)`", setting.paxloom)
        names = [n for n in named if n.isupper() or n.startswith("--")]
        assert setting.paxloom == "none" or names, setting
        assert all(exists(n) for n in names), (setting.maxtext, names)
        if setting.convert is None:
            continue
        values = list(setting.values or ()) + list(_ODD_VALUES)
        for family in maxtext_names.FAMILIES:
            ctx = maxtext_names.Context(family=family)
            for value in values:
                try:
                    mapped = maxtext_names.convert(setting, value, ctx)
                except maxtext_names.NoEquivalent as error:
                    assert str(error), (setting.maxtext, value)
                    continue
                assert all(exists(n) for n in mapped.values), (setting.maxtext, mapped)
    for table, name in ((maxtext_names.REMAT_POLICIES, "CHECKPOINT_POLICY"),
                        (maxtext_names.ATTENTION_KERNELS, "ATTENTION_IMPL")):
        assert {v for v, _ in table.values() if v is not None} <= set(CHOICES[name])
    assert {v for v, _ in maxtext_names.DATASET_TYPES.values() if v} <= set(datasets.registered())
    assert set(maxtext_names.MODEL_EXPERIMENTS.values()) <= set(experiments.registered())
    for name in maxtext_names.FAMILY_EXPERIMENTS.values():
        experiments.resolve(name)
    assert {a for a, _ in maxtext_names.MESH_AXES.values() if a} <= set(
        mesh_axes.MESH_AXIS_NAMES)


def test_a_recipe_translates_as_maxtext_reads_it():
    """The mesh axes multiply into one shape each (-1 filling the node), the schedule follows
    `steps`, MaxText's 1 expert is a dense model."""
    config = {"ici_fsdp_parallelism": -1, "ici_tensor_parallelism": 2,
              "dcn_data_parallelism": 4, "ici_expert_parallelism": 1, "steps": 1000,
              "warmup_steps_fraction": 0.05, "num_experts": 1}
    ctx = maxtext_names.Context(config, num_nodes=4)
    got = {}
    for key, value in config.items():
        got.update(maxtext_names.convert(maxtext_names.BY_NAME[key], value, ctx).values)
    assert got == {"ICI_MESH_SHAPE": [1, 4, 2], "DCN_MESH_SHAPE": [4, 1, 1], "MAX_STEPS": 1000,
                   "LR_COS_WARMUP": 50, "LR_COS_DECAY_START": 50, "LR_COS_DECAY_END": 1000,
                   "NUM_EXPERTS": 0}


def test_a_misspelt_class_attribute_in_maxtexts_spelling_is_named():
    with pytest.raises(UserError, match=r"MaxText's per_device_batch_size=4 is "
                                        r"PERCORE_BATCH_SIZE = 4 in Paxloom"):
        type("Mine", (experiments.BaseExperiment,), {"PER_DEVICE_BATCH_SIZE": 4})
    with pytest.raises(UserError, match=r"\(did you mean NUM_LAYERS"):  # other typos as before
        experiments.BaseExperiment(NUM_LAYRES=2)


# ----- the errors, through main.py ---------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("args,message", [
    (["per_device_batch_size=4"], "is --fdl.PERCORE_BATCH_SIZE=4 in Paxloom"),
    (["--per_device_batch_size=4"], "is --fdl.PERCORE_BATCH_SIZE=4 in Paxloom"),
    (["--fdl.per_device_batch_size=4", "--print_config"], "is --fdl.PERCORE_BATCH_SIZE=4"),
    (["--fdl.PER_DEVICE_BATCH_SIZE=4"], "is --fdl.PERCORE_BATCH_SIZE=4 in Paxloom"),
    (["--fdl.CHECKPOINT_POLICY=full"], "remat_policy=full is --fdl.CHECKPOINT_POLICY=save_nothing"),
    (["--fdl.ICI_FSDP_PARALLELISM=8"], "is --fdl.ICI_MESH_SHAPE=[1,8,1] in Paxloom"),
    (["--load_parameters_path=/ckpt/llama"], "is --fdl.CHECKPOINT_RESTORE_PATH=/ckpt/llama"),
    (["--fdl.ATTENTION_IMPL=cudnn_flash_te"], "is --fdl.ATTENTION_IMPL=cudnn in Paxloom"),
    (["--fdl.MAX_TARGET_LENGTH=8192"], "is --fdl.MAX_SEQ_LEN=8192 in Paxloom"),
    (["--fdl.REMAT_POLICY=full"], "is --fdl.CHECKPOINT_POLICY=save_nothing in Paxloom"),
    (["quantization=fp8"], "MaxText's quantization=fp8 is --fdl.USE_FP8=True in Paxloom"),
])
def test_maxtexts_spelling_gets_its_paxloom_equivalent_in_one_line(args, message):
    out = run_main("--fdl_config=experiments.Tiny", *args)
    assert_one_line(out, message)
    assert "Traceback" not in out.stderr and "did you mean" not in out.stderr


# ----- from_maxtext ------------------------------------------------------------------------

BASE_YML = """\
# A few of MaxText's configs/base.yml defaults.
run_name: ""
model_name: "default"
decoder_block: "llama2"
dtype: "bfloat16"
weight_dtype: float32
base_emb_dim: 2048
base_num_query_heads: 16
base_num_kv_heads: 16
base_mlp_dim: 7168
base_num_decoder_layers: 16
head_dim: 128
num_experts: 1
num_experts_per_tok: 1
megablox: true
sparse_matmul: true
capacity_factor: -1.0
remat_policy: 'full'
scan_layers: true
attention: 'autoselected'
quantization: ""
logits_dot_in_fp32: false
fused_mlp: false
dcn_data_parallelism: -1
dcn_fsdp_parallelism: 1
ici_data_parallelism: 1
ici_fsdp_parallelism: -1
ici_tensor_parallelism: 1
ici_expert_parallelism: 1
vocab_size: 32_000
per_device_batch_size: 12.0
max_target_length: 2048
dataset_type: tfds
steps: 150_001
learning_rate: 3.e-5
learning_rate_final_fraction: 0.1
warmup_steps_fraction: 0.1
enable_checkpointing: true
checkpoint_period: 10_000
"""

LLAMA_MODEL_YML = """\
base_config: "base.yml"
model_name: "llama3.1-8b"
base_emb_dim: 4096
base_num_query_heads: 32
base_num_kv_heads: 8
base_num_decoder_layers: 32
base_mlp_dim: 14336
head_dim: 128
mlp_activations: ["silu","linear"]
vocab_size: 128256
enable_dropout: false
normalization_layer_epsilon: 1.0e-5
rope_max_timescale: 500_000
decoder_block: "llama2"
"""

# FSDP within the node and across two: the weights split 8 ways.
LLAMA_RECIPE_YML = """\
base_config: "models/llama3.1-8b.yml"
run_name: "llama31-fsdp"
ici_fsdp_parallelism: 4
dcn_fsdp_parallelism: 2
per_device_batch_size: 4
max_target_length: 8192
remat_policy: full
attention: cudnn_flash_te
weight_dtype: bfloat16
dataset_type: synthetic
steps: 1000
enable_checkpointing: false
"""

MIXTRAL_MODEL_YML = """\
base_config: "base.yml"
model_name: "mixtral-8x7b"
base_emb_dim: 4096
base_num_query_heads: 32
base_num_kv_heads: 8
base_mlp_dim: 14336
base_moe_mlp_dim: 14336
base_num_decoder_layers: 32
head_dim: 128
vocab_size: 32000
num_experts: 8
num_experts_per_tok: 2
rope_max_timescale: 1_000_000
decoder_block: "mixtral"
"""

# The experts over the node's 8 GPUs (expert parallelism).
MIXTRAL_RECIPE_YML = """\
base_config: "models/mixtral-8x7b.yml"
run_name: "mixtral-ep"
ici_expert_parallelism: 8
per_device_batch_size: 1
max_target_length: 4096
attention: cudnn_flash_te
remat_policy: minimal_with_context
megablox: true
capacity_factor: 1.0
use_ring_of_experts: true
dataset_type: synthetic
max_segments_per_seq: 32
"""

# Shrunk for a CPU, as MaxText's command-line overrides.
TINY = ["base_num_decoder_layers=2", "base_emb_dim=64", "base_num_query_heads=4",
        "base_num_kv_heads=2", "head_dim=16", "base_mlp_dim=128", "max_target_length=64",
        "vocab_size=512", "per_device_batch_size=1", "steps=3"]
# ... and runnable there: attention, dtype (and the mesh) of one CPU process.
ON_CPU = ["attention=dot_product", "dtype=float32"]


def write_configs(root: Path) -> Path:
    (root / "configs" / "models").mkdir(parents=True)
    for name, text in (("base.yml", BASE_YML), ("models/llama3.1-8b.yml", LLAMA_MODEL_YML),
                       ("models/mixtral-8x7b.yml", MIXTRAL_MODEL_YML),
                       ("llama3.1-8b-fsdp.yml", LLAMA_RECIPE_YML),
                       ("mixtral-ep.yml", MIXTRAL_RECIPE_YML)):
        (root / "configs" / name).write_text(text)
    return root / "configs"


def translate(config: Path, overrides: list[str], output: Path) -> str:
    from_maxtext.main(["from_maxtext", str(config), *overrides, f"--output={output}"])
    return output.read_text()


@pytest.fixture
def own_registry(monkeypatch, tmp_path):
    """The registry as it is, restored after the test; tmp_path importable."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.syspath_prepend(str(tmp_path))


def test_a_dense_llama_recipe_with_fsdp_across_nodes(tmp_path, own_registry):
    configs = write_configs(tmp_path)
    text = translate(configs / "llama3.1-8b-fsdp.yml", TINY, tmp_path / "my_llama.py")
    assert "from experiments.llama import Llama31_8B" in text
    assert "class Llama3_1_8bFsdp(Llama31_8B):" in text  # model_name llama3.1-8b's shape
    assert "--job_log_dir=runs/llama31-fsdp --noenable_checkpoint_saving" in text
    # Each translated setting under its MaxText name; overrides win over the files.
    for line in ("# ici_fsdp_parallelism: 4\n    ICI_MESH_SHAPE = [1, 4, 1]",
                 "DCN_MESH_SHAPE = [1, 2, 1]", "# per_device_batch_size: 1\n    "
                 "PERCORE_BATCH_SIZE = 1", "CHECKPOINT_POLICY = 'save_nothing'",
                 "ATTENTION_IMPL = 'cudnn'", "NUM_KV_HEADS = 2", "MAX_SEQ_LEN = 64",
                 "LEARNING_RATE = 3e-05", "DATASET = 'synthetic'", "MAX_STEPS = 3",
                 "ROPE_MAX_WAVELENGTH = 500000.0"):
        assert line in text, line
    # Each setting without an equivalent, with the table's reason.
    unmapped = text.split("# Not translated", 1)[1]
    assert "# weight_dtype: bfloat16; Paxloom keeps parameters (and Adam's moments) in " \
           "float32" in unmapped
    assert "# megablox: True; MaxText's megablox kernel is not wired into Paxloom" in unmapped
    assert "and 2 more settings of base.yml at MaxText's defaults" in unmapped
    exp = experiments.resolve("my_llama.Llama3_1_8bFsdp")()
    assert (exp.ICI_MESH_SHAPE, exp.DCN_MESH_SHAPE, exp.NUM_LAYERS, exp.ROPE_SCALING_TYPE) == (
        [1, 4, 1], [1, 2, 1], 2, "llama3")
    assert exp.batch_layout().global_batch == 8


def test_a_mixtral_recipe_with_expert_parallelism(tmp_path, own_registry):
    configs = write_configs(tmp_path)
    text = translate(configs / "mixtral-ep.yml", [*TINY, "base_moe_mlp_dim=64"],
                     tmp_path / "my_mixtral.py")
    assert "class MixtralEp(Mixtral8x7B):" in text
    for line in ("NUM_EXPERTS = 8", "NUM_EXPERTS_PER_TOKEN = 2", "MOE_HIDDEN_DIMS = 64",
                 "ICI_MESH_SHAPE = [1, 8, 1]", "# ici_expert_parallelism: 8\n    "
                 "EXPERT_AXIS = 'data'", "CAPACITY_FACTOR = 1.0",
                 "CHECKPOINT_POLICY = 'save_dot_except_logits'"):
        assert line in text, line
    unmapped = text.split("# Not translated", 1)[1]
    assert "# megablox: True; MaxText's megablox kernel is not wired into Paxloom" in unmapped
    assert ("# use_ring_of_experts: True; not in Paxloom's table of MaxText settings"
            in unmapped)
    exp = experiments.resolve("my_mixtral.MixtralEp")()
    assert exp.expert_shards() == 8 and exp.NUM_EXPERTS == 8


def test_config_mistakes_are_one_line(tmp_path):
    configs = write_configs(tmp_path)
    (configs / "orphan.yml").write_text('base_config: "nowhere.yml"\nsteps: 3\n')
    (configs / "broken.yml").write_text("steps: [3\n")
    for args, message in (
            ([str(configs / "orphan.yml")], "its base_config 'nowhere.yml' is neither beside"),
            ([str(configs / "broken.yml")], "broken.yml:2: not YAML"),
            ([str(configs / "base.yml"), "steps"], "'steps': MaxText's overrides look like "
                                                   "key=value"),
            ([str(configs / "llama3.1-8b-fsdp.yml"), "base_num_kv_heads=3"],
             "the translated experiment is refused: NUM_HEADS=32 must be a multiple of "
             "NUM_KV_HEADS=3")):
        with pytest.raises(UserError, match=re.escape(message)) as info:
            from_maxtext.main(["from_maxtext", *args])
        assert "\n" not in str(info.value)


@pytest.mark.process
def test_the_written_experiment_prints_through_main(tmp_path):
    configs = write_configs(tmp_path)
    translate(configs / "llama3.1-8b-fsdp.yml", TINY, tmp_path / "my_llama.py")
    out = run_main("--fdl_config=my_llama.Llama3_1_8bFsdp", "--print_config",
                   env=session_env(PYTHONPATH=f"{tmp_path}:{REPO_ROOT}"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "# my_llama.Llama3_1_8bFsdp" in out.stdout
    assert "ICI_MESH_SHAPE = [1, 4, 1]\nDCN_MESH_SHAPE = [1, 2, 1]" in out.stdout
    assert "global batch = PERCORE_BATCH_SIZE 1 x 8 devices = 8 sequences" in out.stdout


def _plan_and_train(tmp_path: Path, recipe: str, module: str, name: str,
                    extra: list[str], cpu_mesh: list[str]) -> None:
    configs = write_configs(tmp_path)
    env = session_env(PYTHONPATH=f"{tmp_path}:{REPO_ROOT}")
    translate(configs / recipe, [*TINY, *extra], tmp_path / f"{module}.py")
    out = run_main(f"--fdl_config={module}.{name}", "--mode=plan", "--plan_compiler=cpu",
                   env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "planned in" in out.stdout, out.stdout[-3000:]
    # As a MaxText user would rerun it on one CPU process: overrides on the command line.
    translate(configs / recipe, [*TINY, *extra, *ON_CPU, *cpu_mesh],
              tmp_path / f"{module}_cpu.py")
    job = tmp_path / "job"
    out = run_main(f"--fdl_config={module}_cpu.{name}", f"--job_log_dir={job}", env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"step +3 \| loss \d", out.stdout + out.stderr), out.stdout[-3000:]


@pytest.mark.process
@pytest.mark.slow  # --mode=plan and 3 steps of training: about 2 minutes on 2 busy cores
def test_the_llama_recipe_plans_and_trains(tmp_path):
    _plan_and_train(tmp_path, "llama3.1-8b-fsdp.yml", "my_llama", "Llama3_1_8bFsdp", [],
                    ["ici_fsdp_parallelism=8", "dcn_fsdp_parallelism=1"])


@pytest.mark.process
@pytest.mark.slow  # as the Llama one, with experts: 2-4 minutes
def test_the_mixtral_recipe_plans_and_trains(tmp_path):
    _plan_and_train(tmp_path, "mixtral-ep.yml", "my_mixtral", "MixtralEp",
                    ["base_moe_mlp_dim=64"], [])


def test_the_tools_help_lists_its_flags(capsys):
    from_maxtext.main(["from_maxtext", "--help"])
    out = capsys.readouterr().out
    assert all(f"--{flag}" in out for flag in ("output", "class_name", "gpus_per_node",
                                                "num_nodes"))
    assert textwrap.dedent(from_maxtext.__doc__).split("\n")[0] in out

"""The flags of a Paxloom run that starts from a Hugging Face model directory.

    python -m paxloom.tools.import_hf --hf_dir=hf/tinyllama

prints, one per line, the `--fdl_config` of the matching family (a GPT2LMHeadModel is the
GPT of experiments.base.BaseExperiment; a LlamaForCausalLM, Qwen3ForCausalLM,
MixtralForCausalLM, Qwen2MoeForCausalLM or Qwen3MoeForCausalLM
experiments.llama.LlamaBase, the Qwen3 classes with USE_QK_NORM=True, the mixtures with
NUM_EXPERTS and the other mixture-of-experts flags),
the `--fdl.NAME=VALUE` sizes that give it the checkpoint's parameters,
`--fdl.CHECKPOINT_RESTORE_PATH` (the run's parameters start from the checkpoint) and, when
the directory has one, `--vocab_path` its tokenizer.json. Add the rest of the run:

    python main.py $(python -m paxloom.tools.import_hf --hf_dir=hf/tinyllama) \\
        --fdl.DATASET='"text"' --data_dir=my_texts --job_log_dir=runs/tinyllama-ft

It is the inverse of paxloom/tools/export_hf.py (both map names through paxloom/runner/state/hf_format.py):
a directory export wrote maps back onto the model it came from, RoPE scaling included
(Llama 3.x's "llama3", "linear", "yarn"). What Paxloom does not model (a "dynamic" or
"longrope" RoPE scaling, biases in a Llama, an untied GPT-2, ...) is refused with one line
naming the config.json key (exit status 2). Nothing is read but config.json; the flags
are checked by building the experiment and comparing its model with the config.
"""

import os

from absl import flags

import experiments
from layers import architecture
from paxloom.core.errors import UserError
from paxloom.runner.state import hf_format
from paxloom.tools import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "A Hugging Face model directory (config.json and "
                    "model.safetensors, as save_pretrained writes it).")

# hf_format's family -> the experiment whose model it is.
EXPERIMENTS = {"gpt": "experiments.base.BaseExperiment", "llama": "experiments.llama.LlamaBase"}
TOKENIZER = "tokenizer.json"


def run_flags(hf_dir: str) -> list[str]:
    """The flags of a run whose model is the checkpoint's and whose parameters start from it."""
    family, hyperparameters = hf_format.hyperparameters(hf_dir)
    if not hf_format.is_hf_model_dir(hf_dir):
        raise UserError(f"--hf_dir={hf_dir} has a {hf_format.CONFIG} but no "
                        f"{hf_format.WEIGHTS} or {hf_format.WEIGHTS_INDEX}: save the model "
                        f"with save_pretrained (safetensors)")
    experiment = experiments.resolve(EXPERIMENTS[family])(**hyperparameters)
    # The flags must rebuild exactly the checkpoint's model: check them as a run would.
    try:
        arch = architecture.architecture_of(experiment.model_template())
    except architecture.UnsupportedModel as error:
        raise UserError(f"{EXPERIMENTS[family]}'s model cannot be read from a checkpoint: "
                        f"{error}") from None
    hf_format.check_config(hf_dir, arch)
    path = os.path.abspath(hf_dir)
    out = [f"--fdl_config={EXPERIMENTS[family]}"]
    out += [f"--fdl.{name}={value!r}" for name, value in hyperparameters.items()]
    out.append(f"--fdl.CHECKPOINT_RESTORE_PATH={path}")
    if os.path.isfile(os.path.join(path, TOKENIZER)):
        out.append(f"--vocab_path={os.path.join(path, TOKENIZER)}")
    return out


def main(argv: list[str]) -> None:
    cli.parse_flags(argv)
    if not FLAGS.hf_dir:
        raise UserError("--hf_dir is required (python -m paxloom.tools.import_hf --hf_dir=DIR)")
    print("\n".join(run_flags(FLAGS.hf_dir)))


if __name__ == "__main__":
    cli.run(main)

"""Export a checkpoint to a Hugging Face `transformers` model directory.

    python -m paxloom.tools.export_hf --job_log_dir=runs/tiny-DATE --output=hf/tiny [--step=N]

The GPT family (layers/gpt.py) becomes a `GPT2LMHeadModel`, the Llama family
(layers/llama.py) a `LlamaForCausalLM`, or with a mixture of experts (layers/moe.py) a
`MixtralForCausalLM` (every layer, renormalised top-k) or a `Qwen2MoeForCausalLM` (a
gated shared expert, mixtures every Nth layer); with QK-norm (USE_QK_NORM,
layers/qk_norm.py) a `Qwen3ForCausalLM`, or with a mixture a `Qwen3MoeForCausalLM`. The
target follows from the model itself (learned positions and LayerNorm, or rotary
positions and RMSNorm, its query/key norms and its experts). The directory holds
config.json, model.safetensors (float32, as trained) and, for a model trained on text,
the run's own tokenizer (its graph's `tokenizer` node, the object training encoded with) as
tokenizer files that encode exactly as training did (paxloom/tools/hf_tokenizer.py): a
SentencePiece model converted, a Hugging Face tokenizer.json copied; encodings start with
the token training documents started with (ADD_BOS, paxloom/core/framing.py), which is
config.json's bos_token_id. A run whose weights came from a Hugging Face model (directly or
through the runs it started from: the run record's `origin`) gets that model's own
max_position_embeddings, RoPE entries, EOS and pad ids back wherever the run kept what
they describe (hf_format.with_origin); a model trained from scratch has the run's own. Load
it with:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("hf/tiny")
    tokenizer = AutoTokenizer.from_pretrained("hf/tiny")

praxis details are translated, not approximated (paxloom/runner/state/hf_format.py holds the
names and layouts, beside the import's): norm scales stored as offsets from 1 become the
multipliers themselves (layers/architecture.py); q, k, v go to GPT-2's
combined `c_attn` (Conv1D [in, out], q then k then v, heads in order) or Llama's separate
projections; praxis's query scale is folded into the query weights (with QK-norm, into
the query norm's scale) wherever it differs from the target's 1/sqrt(head dim); praxis's
RoPE rotates the two halves of each head as Llama's rotate_half does, so q and k need no
permutation. What a target cannot express
(an embedding scale, a bias on the output layer, an untied GPT output layer, ...) is
refused with one line (exit status 2).

The weights are written with safetensors' numpy API: exporting needs neither torch nor
transformers.
"""

import json
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
from absl import flags
from safetensors.numpy import save_file

import experiments
from layers.architecture import canonical_weights
from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from paxloom.launch import record
from paxloom.runner.inference import model as inference
from paxloom.runner.state import hf_format
from paxloom.tools import cli
from tasks.vocab import Vocabulary

FLAGS = flags.FLAGS
flags.DEFINE_string("job_log_dir", None, "The training run's directory (hyperparameters.json, "
                    "checkpoints/).")
flags.DEFINE_integer("step", None, "Checkpoint step to export; default: the latest.")
flags.DEFINE_string("output", None, "Directory to write (must not exist, or be empty).")
flags.DEFINE_string("vocab_path", None, "The tokenizer the run was trained with; default: "
                    "$VOCAB_PATH, else the one the run recorded (hyperparameters.json), else "
                    "the experiment's own (the sample corpus's).")


def export(job_log_dir: str, output: str, step: int | None = None,
           vocab_path: str | None = None) -> Path:
    """Write the Hugging Face directory `output` from job_log_dir's checkpoint; return it.
    Without `vocab_path`, the vocabulary the run recorded it trained with."""
    exp, recorded_vocab_path, origin = _experiment(job_log_dir)
    config = exp.run_config(vocab_path=vocab_path or recorded_vocab_path)  # exp stops here
    arch = inference.run_architecture(config, "export")
    target = hf_format.target(arch)
    hf_format.check_representable(arch, target)  # before the (slow) read of the weights
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--output={output} exists and is not an empty directory; choose "
                        f"another or remove it")
    _check_creatable(out, output)
    model = inference.load(config, job_log_dir, what="export",
                           restore_checkpoint_step=step, devices=[_host_device()])
    weights = canonical_weights(jax.device_get(model.params), arch)
    tokenizer = model.tokenizer
    special = {} if tokenizer is None else {"bos_token_id": framing_of(tokenizer).start_id,
                                            "eos_token_id": tokenizer.eos_id}
    if getattr(tokenizer, "pad_id", None) is not None:
        special["pad_token_id"] = tokenizer.pad_id
    if target == hf_format.GPT2:
        hf_config, tensors = hf_format.gpt2_config(arch), hf_format.gpt2_tensors(arch, weights)
    else:
        hf_config = hf_format.llama_config(arch, model.max_seq_len)
        tensors = hf_format.llama_tensors(arch, weights)
    hf_config.update(special, architectures=[target], dtype="float32")
    hf_config = hf_format.with_origin(hf_config, origin, arch)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)  # safetensors makes the file private (0600); shareable like the others
    os.chmod(out / "model.safetensors", 0o666 & ~umask)
    files = ["config.json", "model.safetensors"]
    if tokenizer is not None:
        files += _write_tokenizer(tokenizer, out,
                                  hf_config.get("max_position_embeddings", model.max_seq_len))
    count = sum(int(np.prod(v.shape)) for v in tensors.values())
    print(f"wrote {target} ({count:,} parameters, step {model.step} of {model.checkpoint}) "
          f"to {out}: {', '.join(files)}")
    return out


def _check_creatable(out: Path, output: str) -> None:
    """--output can be created and written (before the slow read of the weights, and
    before anything is written): its nearest existing directory takes a probe directory."""
    existing = out.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--output={output}: {existing} is a file, not a directory; choose "
                        f"another output directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".export-probe-", dir=existing))
    except OSError as error:
        raise UserError(f"--output={output}: cannot create it in {existing} "
                        f"({error.strerror}); choose a writable directory") from None


def _write_tokenizer(tokenizer, out: Path, max_seq_len: int) -> list[str]:
    """The run's tokenizer as Hugging Face tokenizer files in `out`, its encodings starting
    as training documents did; their names. A SentencePiece model (tasks/vocab.py) is
    converted; any other tokenizer is a Hugging Face one, whose tokenizer.json (`.path`) is
    copied, its own post-processor kept when that already adds just the start token."""
    from paxloom.tools import hf_tokenizer

    start = framing_of(tokenizer).start_id
    if isinstance(tokenizer, Vocabulary):
        return hf_tokenizer.write(tokenizer.path, out, max_seq_len, start_id=start)
    template = getattr(tokenizer, "template", None)  # tasks/tokenizer.py: (before, after)
    return hf_tokenizer.copy(tokenizer.path, out, eos_id=tokenizer.eos_id,
                             model_max_length=max_seq_len,
                             pad_id=getattr(tokenizer, "pad_id", None), start_id=start,
                             keep_template=template is not None
                             and list(template[0]) == [start] and not template[1])


def _host_device():
    """The weights are read into host memory, never onto an accelerator (there may be none
    free, or too little memory)."""
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS excludes the CPU
        return jax.local_devices()[0]


def _experiment(job_log_dir: str):
    """(the run's experiment on one device, the vocabulary path it recorded, its origin:
    the Hugging Face model its weights come from, or None), from its hyperparameters.json:
    the weights are read onto the host whatever mesh wrote them."""
    path = os.path.join(job_log_dir, "hyperparameters.json")
    if not os.path.isfile(path):
        raise UserError(f"--job_log_dir={job_log_dir} has no hyperparameters.json: not a "
                        f"training run's directory")
    run = record.read_record(path)
    if run is None:
        raise UserError(f"{path} is not a run record (its experiment and hyperparameters)")
    one_device = {"ICI_MESH_SHAPE": [1, 1, 1], "DCN_MESH_SHAPE": [1, 1, 1]}
    exp = experiments.resolve(run["experiment"])(**{**run["hyperparameters"], **one_device})
    return (exp, (run.get("data_locations") or {}).get("vocab_path"),
            record.recorded_origin(run))


def main(argv: list[str]) -> None:
    cli.parse_flags(argv)
    for name in ("job_log_dir", "output"):
        if not FLAGS[name].value:
            raise UserError(f"--{name} is required (python -m paxloom.tools.export_hf "
                            f"--job_log_dir=RUN --output=DIR)")
    export(FLAGS.job_log_dir, FLAGS.output, FLAGS.step,
           FLAGS.vocab_path or os.environ.get("VOCAB_PATH"))


if __name__ == "__main__":
    cli.run(main)

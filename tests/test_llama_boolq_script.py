"""paxml's run_llama_boolq.sh (scripts_gpu/, its module paths changed only) run as it is, and
what it needs: BoolQ from TFDS's super_glue/boolq under TFDS_DATA_DIR, read without
TensorFlow (tasks/tfds.py, tasks/boolq.py), and Pax's 'constant' learning-rate schedule.

The script passes no flags of the caller's, so the tiny model's --fdl. overrides come from a
`python3` first on PATH that appends them to main.py's command line; it also makes `import
tensorflow` fail, as on GPU machines that have none. The rest is the script's own variables.
EVAL_ONLY=1 evaluates a Pax job directory too (a converted LLaMA's, as Pax users pass it).
The docs' "BoolQ on a CPU" runs it with nothing of the tests': experiments.LLaMABoolQTiny, and
the BoolQ sample and vocabulary of `python -m tasks.sample_corpus --boolq_dir=DIR`.
"""

import json
import re
import shlex
import sys

import fiddle as fdl
import numpy as np
import pytest

import experiments
from paxloom.core.errors import UserError
from tasks import boolq
from tests.support import docs_examples
from tests.support.data import make_docs, write_tfds_boolq, write_tfrecord
from tests.support.paths import REPO_ROOT
from tests.support.pax_checkpoints import write_pax_checkpoint
from tests.support.processes import isolated_env, run_command
from tests.support.tiny import TINY_MODEL, model_flags

SCRIPT = REPO_ROOT / "scripts_gpu" / "run_llama_boolq.sh"
NUM_DEV = 12
# The tiny model in the script's float32 steps: its own MAX_SEQ_LEN, MAX_STEPS, batch and mesh
# come from the script's variables (SCRIPT_VARS); no evaluation during training.
TINY = model_flags(MAX_SEQ_LEN=None, NUM_KV_HEADS=8, FPROP_DTYPE="float32",
                   EVAL_INTERVAL_STEPS=0, SUMMARY_INTERVAL_STEPS=2)
SCRIPT_VARS = dict(MAX_STEPS="4", MAX_SEQ_LEN="64", PERCORE_BATCH_SIZE="1", LORA_RANK="4")
EVAL_LINE = re.compile(r"eval boolq \| accuracy [\d.]+ \| loss [\d.]+ \| num_examples \d+")


def record(i: int, label: int) -> dict:
    words = make_docs(1, seed=i, min_words=4, max_words=12)[0].replace("\n", " ")
    return {"question": f"is the river {i} golden", "passage": words, "label": label}


TRAIN = [record(i, int(i % 3 != 0)) for i in range(24)]
VALIDATION = [record(100 + i, int(i % 2 == 0)) for i in range(NUM_DEV)]


@pytest.fixture(scope="module")
def pax_boolq(tmp_path_factory):
    """TFDS_DATA_DIR with super_glue/boolq/1.0.2, and a SentencePiece model in which the
    answers are single tokens (as in LLaMA's)."""
    from tasks.train_vocab import train_sentencepiece

    root = tmp_path_factory.mktemp("pax_boolq")
    write_tfds_boolq(root / "tfds", {"train": TRAIN, "validation": VALIDATION})
    texts = make_docs(200, seed=3) + [f"question: is it?\nanswer: {w}" for w in ("yes", "no")] * 200
    vocab = train_sentencepiece(texts, 512, root / "spm.model", num_threads=1)
    return root / "tfds", vocab


# ----- BoolQ from TFDS, Pax's 'constant' schedule ----------------------------------------


def test_tfds_boolq_reads_as_superglues_jsonl(pax_boolq, tmp_path):
    """The TFDS split (shuffled over 2 shards) gives the examples of SuperGLUE's val.jsonl,
    in its order, numbered by its lines; a jsonl beside it wins, as the Pile's does."""
    tfds_dir, _ = pax_boolq
    path = boolq.boolq_file(tfds_dir, "dev")
    assert path.endswith("super_glue/boolq/1.0.2/super_glue-validation.tfrecord")
    jsonl = tmp_path / "val.jsonl"
    jsonl.write_text("".join(json.dumps({**r, "idx": i, "label": bool(r["label"])}) + "\n"
                             for i, r in enumerate(VALIDATION)))
    assert boolq.read_boolq(path) == boolq.read_boolq(jsonl)
    assert len(boolq.read_boolq(boolq.boolq_file(tfds_dir, "train"))) == len(TRAIN)
    (tfds_dir / "boolq").mkdir()
    (tfds_dir / "boolq" / "dev.jsonl").write_text(jsonl.read_text())
    try:
        assert boolq.boolq_file(tfds_dir, "dev") == str(tfds_dir / "boolq" / "dev.jsonl")
    finally:
        (tfds_dir / "boolq" / "dev.jsonl").unlink()
        (tfds_dir / "boolq").rmdir()


def test_bad_tfds_boolq_is_one_line(pax_boolq, tmp_path):
    tfds_dir, _ = pax_boolq
    shard = next((tfds_dir / "super_glue" / "boolq" / "1.0.2").glob("super_glue-train.*"))
    data = tmp_path / "super_glue" / "boolq" / "1.0.2"
    data.mkdir(parents=True)
    (data / "super_glue-train.tfrecord-00000-of-00001").write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(UserError, match=r"00000-of-00001 is truncated or corrupt at record "
                                        r"\d+ \(its TFRecord checksum does not match\)") as e:
        boolq.read_boolq(boolq.boolq_file(tmp_path, "train"))
    assert "\n" not in str(e.value)
    # paxml's Pile build, bytes features only: no idx, no label.
    write_tfrecord(data / "super_glue-validation.tfrecord-00000-of-00001",
                   [{"question": "q", "passage": "p"}])
    with pytest.raises(UserError, match=r"record 1 is not a super_glue/boolq example .*it has "
                                        r"\['passage', 'question'\]") as e:
        boolq.read_boolq(boolq.boolq_file(tmp_path, "dev"))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"no BoolQ dev split under --data_dir=.*nor TFDS "
                                        r"shards .*super_glue-validation.tfrecord-\*") as e:
        boolq.boolq_file(tmp_path / "nothing", "dev")
    assert "\n" not in str(e.value)


def test_pax_constant_schedule_is_the_learning_rate_throughout():
    tiny = experiments.resolve("experiments.Tiny")
    schedule = fdl.build(tiny(LR_SCHEDULE="constant", LEARNING_RATE=0.01).run_config()
                         .learning_rate)
    assert [float(schedule(step)) for step in (0, 1, 10, 10_000)] == pytest.approx([0.01] * 4)
    cosine = fdl.build(tiny(LEARNING_RATE=0.01).run_config().learning_rate)
    assert float(cosine(0)) == 0.0  # the default still ramps up
    with pytest.raises(UserError, match="LR_SCHEDULE='linear_rampup_exponential_decay': "
                                        "Paxloom has only"):
        tiny(LR_SCHEDULE="linear_rampup_exponential_decay")


# ----- the script --------------------------------------------------------------------------


def script_env(tmp_path, tfds_dir, vocab, **variables) -> dict[str, str]:
    """The script's environment: 8 fake CPU devices, TFDS_DATA_DIR and VOCAB_PATH, the tiny
    model's `python3` first on PATH, TensorFlow unimportable, and `variables`."""
    shim = tmp_path / "bin" / "python3"
    if not shim.exists():
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@" {shlex.join(TINY)}\n')
        shim.chmod(0o755)
        no_tf = tmp_path / "no_tf" / "tensorflow"
        no_tf.mkdir(parents=True)
        (no_tf / "__init__.py").write_text('raise ImportError("no TensorFlow on this machine")\n')
    env = isolated_env(8, compilation_cache=str(tmp_path / "jax_cache"))
    env.update(PATH=f"{shim.parent}:{env['PATH']}",
               PYTHONPATH=f"{tmp_path / 'no_tf'}:{env['PYTHONPATH']}",
               TFDS_DATA_DIR=str(tfds_dir), VOCAB_PATH=str(vocab),
               LOG_DIR=str(tmp_path / "llama"), **SCRIPT_VARS, **variables)
    return env


def run_script(tmp_path, env) -> str:
    """bash run_llama_boolq.sh, from a directory that is not the clone (`python3 -m main`
    finds main.py as an installed Paxloom's); its output (training and evaluation)."""
    out = run_command(["bash", str(SCRIPT)], env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout + out.stderr


def pax_llama_params(seed: int) -> dict:
    """Random parameters of the tiny LLaMA in Pax's names and shapes (saxml's
    convert_llama_ckpt.py: combined QKV, direct RMSNorm scales)."""
    rng = np.random.default_rng(seed)
    d, f, n, h, v = (TINY_MODEL[k] for k in ("MODEL_DIMS", "HIDDEN_DIMS", "NUM_HEADS",
                                               "DIMS_PER_HEAD", "VOCAB_SIZE"))

    def w(*shape, mean=0.0):
        return (mean + 0.2 * rng.standard_normal(shape)).astype(np.float32)

    layers = {f"x_layers_{i}": {
        "self_attention": {"combined_qkv": {"w": w(3, d, n, h)}, "post": {"w": w(d, n, h)}},
        "layer_norm": {"scale": w(d, mean=1)},
        "ff_layer": {"layer_norm": {"scale": w(d, mean=1)},
                     "ffn_layer1_gate": {"linear": {"w": w(d, f)}},
                     "ffn_layer1": {"linear": {"w": w(d, f)}},
                     "ffn_layer2": {"linear": {"w": w(f, d)}}}}
        for i in range(TINY_MODEL["NUM_LAYERS"])}
    return {"lm": {"embedding_lookup": {"emb_var": w(v, d)},
                   "softmax": {"logits_ffn": {"linear": {"w": w(d, v)}}},
                   "final_ln": {"scale": w(d, mean=1)}, "transformer": layers}}


@pytest.mark.process
def test_eval_only_on_a_pax_job_directory(pax_boolq, tmp_path):
    """EVAL_ONLY=1 on a Pax job directory (a converted LLaMA: checkpoints/checkpoint_00000000/),
    with LoRA's flags as the script passes them: its weights, the adapters at zero."""
    tfds_dir, vocab = pax_boolq
    pax_job = tmp_path / "pax_llama"
    write_pax_checkpoint(pax_job, pax_llama_params(0), step=0, dtype=np.float16)
    out = run_script(tmp_path, script_env(tmp_path, tfds_dir, vocab, EVAL_ONLY="1", USE_LORA="1",
                                          CHECKPOINT_RESTORE_PATH=str(pax_job)))
    assert f"note: {pax_job} is a Pax job directory: evaluating its checkpoint" in out
    assert re.search(rf"initialised \d+ of \d+ parameters from Pax checkpoint "
                     rf"{re.escape(str(pax_job))}/checkpoints; \d+ keep their initialisation", out)
    assert re.search(r"step +0 \| " + EVAL_LINE.pattern, out)  # the starting weights
    assert len((pax_job / "boolq_predictions.jsonl").read_text().splitlines()) == NUM_DEV


@pytest.mark.process
@pytest.mark.slow  # five main.py runs, about 30 s on 2 cores
def test_full_then_lora_from_the_restore_path_then_eval_only(pax_boolq, tmp_path):
    tfds_dir, vocab = pax_boolq
    log_dir = tmp_path / "llama"

    # Full fine-tuning: linear_rampup_cosine_decay with LR_COS_WARMUP, on one node
    # (the script's [1,2,1] DCN default is two).
    full = run_script(tmp_path, script_env(tmp_path, tfds_dir, vocab, LR_COS_WARMUP="2",
                                           DCN_MESH_SHAPE="[1,1,1]"))
    full_job = log_dir / "llama-LLaMA7B-mbs-1-te-0-lora-0"
    assert "step      4 | loss" in full and EVAL_LINE.search(full)
    assert f"evaluating step 4 (experiments.llama.LLaMA7B) from {full_job}/checkpoints/4" in full
    assert (log_dir / "logs" / "llama-LLaMA7B-mbs-1-te-0-lora-0.txt").is_file()

    # LoRA with Pax's constant schedule, from the restore path as the script writes it
    # (CHECKPOINT_RESTORE_PATH + /checkpoints), then --mode=eval on the job directory.
    lora = run_script(tmp_path, script_env(tmp_path, tfds_dir, vocab, USE_LORA="1",
                                           CHECKPOINT_RESTORE_PATH=str(full_job)))
    lora_job = log_dir / "llama-LLaMA7B-mbs-1-te-0-lora-1"
    assert re.search(rf"initialised \d+ of \d+ parameters from checkpoint step 4 of "
                     rf"{re.escape(str(full_job))}/checkpoints; \d+ keep their initialisation",
                     lora)
    assert re.findall(r"step +\d+ \| loss [\d.]+ \| lr (\S+)", lora) == ["1.000e-04"] * 2
    assert f"evaluating step 4 (experiments.llama.LLaMA7B) from {lora_job}/checkpoints/4" in lora
    predictions = (lora_job / "boolq_predictions.jsonl").read_text().splitlines()
    assert len(predictions) == NUM_DEV
    log = (log_dir / "logs" / "llama-LLaMA7B-mbs-1-te-0-lora-1.txt").read_text()
    assert "step      4 | loss" in log and EVAL_LINE.search(log)  # tee, then tee -a

    # EVAL_ONLY=1: --mode=eval on the restore path itself, no training.
    eval_only = run_script(tmp_path, script_env(tmp_path, tfds_dir, vocab, USE_LORA="1",
                                                EVAL_ONLY="1",
                                                CHECKPOINT_RESTORE_PATH=str(lora_job)))
    assert "| loss" not in eval_only.split("eval boolq")[0]
    assert f"evaluating step 4 (experiments.llama.LLaMA7B) from {lora_job}/checkpoints/4" in \
        eval_only
    assert EVAL_LINE.search(eval_only)[0] == EVAL_LINE.search(lora)[0]  # the same checkpoint


@pytest.mark.process
@pytest.mark.slow  # the docs' commands: the sample, then two main.py runs; 35-55 s on 2 cores
def test_the_docs_boolq_on_a_cpu_runs_as_written(tmp_path):
    """docs/guides/trained-weights.md's "BoolQ on a CPU", from a copy of the clone, as
    tests/test_docs.py runs the page's examples; and what the page says it prints: the
    answers' tokens, BoolQ's accuracy over the 100 validation examples, no library INFO
    lines (orbax's, praxis's) among them."""
    (block,) = [b for b in docs_examples.all_blocks()[0]
                if b.path == "docs/guides/trained-weights.md" and b.mark is None
                and "run_llama_boolq.sh" in b.text]
    clone = docs_examples.copy_repository(str(tmp_path / "clone"))
    out = docs_examples.run_block(block, clone, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert re.search(r"the answers 'yes' and 'no' are the single tokens \d+ and \d+", out.stdout)
    evaluation = EVAL_LINE.search(out.stdout)
    assert evaluation and evaluation[0].endswith("num_examples 100"), out.stdout[-3000:]
    info = re.findall(r"^I\d{4} [\d:.]+ +\d+ \w+\.py:\d+\] .*", out.stdout + out.stderr, re.M)
    assert not info, "\n".join(info[:20])
    job = tmp_path / "clone" / "runs" / "llama-cpu" / "llama-LLaMABoolQTiny-mbs-2-te-0-lora-1"
    assert len((job / "boolq_predictions.jsonl").read_text().splitlines()) == 100

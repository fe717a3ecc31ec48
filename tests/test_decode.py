"""--mode=decode: the cached decoder against praxis's forward pass, greedy decoding against
step-by-step argmax, sampling, long prompts, a learnt pattern, and bad input on the command
line."""

import json
import os

import jax
import numpy as np
import pytest

import experiments
from experiments.llama import LlamaBase
from layers import architecture, cached_lm
from layers.stack import transformer_layer_template
from paxloom.core.errors import UserError
from paxloom.launch import decode as launch_decode
from paxloom.runner.inference import decode
from paxloom.runner.inference import model as inference
from paxloom.runner.inference.generate import SamplingOptions
from tests.support.inference import greedy_reference, praxis_logits, save_job, save_state
from tests.support.processes import run_main
from tests.support.tiny import TINY
from tests.support.training import make_trainer, run_steps

pytestmark = pytest.mark.usefixtures("compilation_cache")

# A mesh with data, FSDP and tensor parallelism: decoding runs where training ran.
MESH = dict(ICI_MESH_SHAPE=[2, 2, 2])
FAMILIES = {
    "gpt": (experiments.BaseExperiment, {}),
    "llama_gqa": (LlamaBase, dict(NUM_KV_HEADS=4)),  # 8 query heads in 4 groups
    # DotProductAttention's combined projection without biases, on heads wider than
    # MODEL_DIMS / NUM_HEADS (praxis scales queries by the latter); layers stored stacked.
    "llama_mha_repeated": (LlamaBase, dict(NUM_KV_HEADS=8, DIMS_PER_HEAD=16,
                                           USE_REPEATED_LAYER=True)),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """family -> (exp, job_dir, params, trainer) of a checkpoint of a tiny model with random
    parameters (tests/support/inference.py), saved once per module."""
    saved = {}

    def get(family):
        if family not in saved:
            experiment, overrides = FAMILIES[family]
            exp = experiment(**{**TINY, **MESH, **overrides})
            job_dir = tmp_path_factory.mktemp(family)
            params, trainer = save_job(job_dir, exp)
            saved[family] = exp, str(job_dir), params, trainer
        return saved[family]

    return get


@pytest.fixture(scope="module")
def gpt(jobs):
    """(the GPT's InferenceModel, its trainer and checkpoint parameters)."""
    exp, job_dir, params, trainer = jobs("gpt")
    model = inference.load(exp.run_config(), job_dir, what="test")
    return model, trainer, params


def run_decode(exp, job_dir, prompts, **kwargs):
    """--mode=decode as main.py runs it: the launcher, with the experiment's graph."""
    options = decode.DecodeOptions(job_log_dir=job_dir, prompts=prompts, **kwargs)
    return launch_decode.run(exp, exp.run_config(), options)


PROMPTS = ["5 6 7", "100 3 400 17 9 23 250 11", "42"]
STEPS = 10


def ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


@pytest.mark.parametrize("family", ["gpt", "llama_gqa"])
def test_greedy_decoding_equals_argmax_of_the_praxis_forward_pass(jobs, family):
    exp, job_dir, params, trainer = jobs(family)
    records = run_decode(exp, job_dir, PROMPTS, max_decode_steps=STEPS)
    expected = greedy_reference(trainer, params, [ids(p) for p in PROMPTS], steps=STEPS)
    assert [ids(r["continuation"]) for r in records] == expected
    assert all(r["tokens"] == STEPS and r["stop"] == "max_decode_steps" for r in records)
    written = [json.loads(line) for line in open(os.path.join(job_dir, "decode_outputs.jsonl"))]
    assert written == records


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_logits_equal_praxis_logits_prefill_and_steps(jobs, family):
    """Prefill a left-padded batch, then feed tokens one at a time: every position's logits
    equal praxis's full forward pass."""
    exp, _, params, trainer = jobs(family)
    arch = architecture.architecture_of(exp.run_config().model)
    sequences = [ids("3 1 4 1 5 9 2 6 5 3"), ids("2 7 1 8 2 8 1 8 2 8"), ids("9 9 8")]
    prefill = [2, 6, 1]  # tokens of each row run together before stepping
    expected = praxis_logits(trainer, params, sequences)
    weights = architecture.canonical_weights(jax.device_get(params), arch)
    prompt_len = max(prefill)
    first = np.array([prompt_len - n for n in prefill], np.int32)
    prompt = np.zeros((3, prompt_len), np.int32)
    for row, (seq, n) in enumerate(zip(sequences, prefill, strict=True)):
        prompt[row, prompt_len - n:] = seq[:n]
    positions = np.maximum(np.arange(prompt_len)[None] - first[:, None], 0)
    cache = cached_lm.init_cache(arch, 3, prompt_len + 10, np.float32)
    forward = jax.jit(cached_lm.forward, static_argnums=0)
    hidden, cache = forward(arch, weights, prompt, positions, cache, 0, first)
    got = [list(cached_lm.logits(weights, hidden[row, prompt_len - n:]))
           for row, n in enumerate(prefill)]
    for step in range(max(len(s) for s in sequences) - min(prefill)):
        token = np.array([s[min(n + step, len(s) - 1)] for s, n in zip(sequences, prefill,
                                                                      strict=True)], np.int32)
        position = np.array([n + step for n in prefill], np.int32)
        hidden, cache = forward(arch, weights, token[:, None], position[:, None], cache,
                                prompt_len + step, first)
        for row, n in enumerate(prefill):
            if n + step < len(sequences[row]):
                got[row].append(cached_lm.logits(weights, hidden[row, 0]))
    for row in range(3):
        np.testing.assert_allclose(np.stack(got[row]), expected[row], rtol=1e-4, atol=1e-4)


def test_sampling_is_reproducible_with_a_seed_and_independent_of_batching(gpt):
    model = gpt[0]

    def sample(seed, batch_size=16, temperature=1.0):
        options = SamplingOptions(temperature=temperature, top_k=100, top_p=0.95, seed=seed)
        return [r["continuation"] for r in decode.continue_prompts(
            model, PROMPTS, max_decode_steps=STEPS, options=options, batch_size=batch_size)]

    first = sample(3)
    assert sample(3) == first
    assert sample(3, batch_size=1) == first  # each prompt draws from its own keys
    assert sample(4) != first
    greedy = decode.continue_prompts(model, PROMPTS, max_decode_steps=STEPS,
                                     options=SamplingOptions())
    assert first != [r["continuation"] for r in greedy]


def test_prompts_longer_than_max_seq_len_are_cut_from_the_left(gpt, capsys):
    model, trainer, params = gpt
    long_prompt = " ".join(str(i % 500) for i in range(model.max_seq_len + 10))
    (record,) = decode.continue_prompts(model, [long_prompt], max_decode_steps=STEPS,
                                        options=SamplingOptions())
    assert (f"prompt 0: {model.max_seq_len + 10} tokens, cut from the left to the last "
            f"{model.max_seq_len}") in capsys.readouterr().out
    # The context is full: one token, predicted from the prompt's last MAX_SEQ_LEN tokens.
    assert record["prompt_tokens"] == model.max_seq_len and record["stop"] == "max_seq_len"
    (expected,) = greedy_reference(trainer, params, [ids(long_prompt)[-model.max_seq_len:]], 1)
    assert ids(record["continuation"]) == expected


def test_a_prompt_in_chunks_continues_as_it_does_whole_with_less_memory(gpt):
    """Chunked prefill (--prefill_chunk_len): prompts of 40, 17 and 3 tokens (a batch
    padded to 48 slots) entered 16 or 32 tokens at a time (32: padded to 64 slots) continue
    as praxis's forward pass predicts; each chunk's attention scores replace the prompt's."""
    model, trainer, params = gpt
    rng = np.random.default_rng(0)
    prompts = [" ".join(str(t) for t in rng.integers(0, 500, n)) for n in (40, 17, 3)]
    expected = greedy_reference(trainer, params, [ids(p) for p in prompts], steps=STEPS)
    for chunk in (0, 16, 32):
        records = decode.continue_prompts(model, prompts, max_decode_steps=STEPS,
                                          options=SamplingOptions(), prefill_chunk=chunk)
        assert [ids(r["continuation"]) for r in records] == expected, chunk
    temp = {key[-1]: program.memory_analysis().temp_size_in_bytes
            for key, program in model.programs.items() if key[:2] == (3, 48)}
    assert temp[16] < temp[0], temp
    with pytest.raises(UserError, match="--prefill_chunk_len=-1: must be >= 0"):
        decode.continue_prompts(model, prompts, max_decode_steps=STEPS,
                                options=SamplingOptions(), prefill_chunk=-1)


@pytest.mark.slow  # 300 training steps: 15-30 s on 2 cores
def test_a_model_trained_on_a_pattern_completes_it(tmp_path):
    """Trained on arithmetic progressions (tasks/synthetic.py) until it has learnt them,
    the model continues new ones, greedily, to the end."""
    settings = dict(ICI_MESH_SHAPE=[1, 1, 1], VOCAB_SIZE=64, MAX_SEQ_LEN=32,
                    PERCORE_BATCH_SIZE=32, LEARNING_RATE=1e-2, LR_COS_WARMUP=20,
                    LR_COS_DECAY_START=20, LR_COS_DECAY_END=300)
    one_device = jax.devices()[:1]
    trainer = make_trainer(tmp_path, devices=one_device, **settings)
    losses, state = run_steps(trainer, 300)
    assert np.mean(losses[-10:]) < 0.2, losses[::25]
    exp = experiments.BaseExperiment(**{**TINY, **settings})
    save_state(tmp_path, exp, trainer, state)
    model = inference.load(exp.run_config(), str(tmp_path), what="test", devices=one_device)
    records = decode.continue_prompts(model, ["5 6 7 8", "10 13 16", "40 45 50 55"],
                                      max_decode_steps=6, options=SamplingOptions())
    assert [r["continuation"] for r in records] == [
        "9 10 11 12 13 14", "19 22 25 28 31 34", "60 1 6 11 16 21"]  # modulo VOCAB_SIZE


@pytest.mark.process
@pytest.mark.parametrize("args,message", [
    (["--job_log_dir=/tmp/paxloom-no-such-run", "--prompt=x"],
     "--mode=decode needs a checkpoint, and /tmp/paxloom-no-such-run/checkpoints has none"),
    (["--job_log_dir=/tmp/unused", "--prompts_file=/tmp/paxloom-no-prompts.txt"],
     "--prompts_file=/tmp/paxloom-no-prompts.txt: no such file"),
    (["--job_log_dir=/tmp/unused", "--prompt=x", "--max_decode_steps=0"],
     "--max_decode_steps=0: must be at least 1"),
    (["--job_log_dir=/tmp/unused", "--prompt=x", "--temperature=1", "--top_p=1.5"],
     "--top_p=1.5: must be in (0, 1]"),
    (["--job_log_dir=/tmp/unused", "--prompt=x", "--temperature=-1"],
     "--temperature=-1.0: must be >= 0"),
])
def test_bad_decode_input_is_one_line_and_exit_2(args, message):
    out = run_main("--fdl_config=experiments.Tiny", "--mode=decode", *args)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_prompt_file_formats(tmp_path):
    (tmp_path / "p.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b", "id": 2}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"text": "b"}\n')
    assert decode.read_prompts(["x"], str(tmp_path / "p.txt")) == ["x", "first line",
                                                                    "second line"]
    assert decode.read_prompts([], str(tmp_path / "p.jsonl")) == ["a", "b"]
    with pytest.raises(UserError, match='line 2: expected an object with a "prompt" string'):
        decode.read_prompts([], str(tmp_path / "bad.jsonl"))


def test_other_bad_decode_settings():
    with pytest.raises(UserError, match="--top_k and --top_p restrict sampling, which "
                                        "--temperature=0"):
        SamplingOptions(top_k=5)
    with pytest.raises(UserError, match="--top_k=-1: must be >= 0"):
        SamplingOptions(temperature=1.0, top_k=-1)
    with pytest.raises(UserError, match="--mode=decode needs prompts"):
        decode.read_prompts([], None)


def test_a_model_the_decoder_does_not_reproduce_is_refused():
    model = experiments.BaseExperiment(**TINY).model_template()
    layer = transformer_layer_template(model.lm_tpl.stacked_transformer_tpl)
    layer.tr_atten_tpl.internal_enable_per_dim_scale = True
    with pytest.raises(architecture.UnsupportedModel,
                       match="attention has a learned per-dimension query scale"):
        architecture.architecture_of(model)

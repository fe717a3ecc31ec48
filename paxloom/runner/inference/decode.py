"""--mode=decode: continue prompts with a trained model, from its checkpoint.

Prompts come from --prompt (repeatable) and --prompts_file (one per line, or a .jsonl file
of {"prompt": ...} objects). Each is encoded as training encoded documents (starting with
the token that opens a document's segment: EOS, which plays BOS, or the BOS under ADD_BOS;
paxloom/core/framing.py), cut from the left to the model's context (MAX_SEQ_LEN), and
continued by paxloom/runner/inference/generate.py in batches of --decode_batch_size. Continuations go to the
console and, with token counts and speed, to job_log_dir/decode_outputs.jsonl.

A run without a tokenizer (DATASET="synthetic") reads and writes token ids:
--prompt="5 7 9".

This is the runtime: it sees the run's graph and a DecodeOptions, never the experiment
(paxloom/launch/decode.py is the launcher).
"""

import dataclasses
import json
import os
import time

import jax
import numpy as np

from paxloom.core.errors import UserError
from paxloom.core.framing import framing_of
from paxloom.core.log import log
from paxloom.runner.inference import model as inference
from paxloom.runner.inference.generate import STOPPED, SamplingOptions, make_generate

OUTPUTS_FILE = "decode_outputs.jsonl"
# Prompt lengths are padded up to a multiple of this, so batches of similar prompts share
# one compiled program.
PROMPT_LENGTH_BUCKET = 16
# --prefill_chunk_len's default: a prompt longer than this enters the cache in chunks of
# this many tokens (MaxText's and vLLM's chunked prefill use 256 to 2048).
PREFILL_CHUNK_LEN = 1024


def read_prompts(prompts: list[str], prompts_file: str | None) -> list[str]:
    """--prompt values, then the prompts of --prompts_file; UserError if there are none."""
    texts = list(prompts)
    if prompts_file:
        if not os.path.isfile(prompts_file):
            raise UserError(f"--prompts_file={prompts_file}: no such file")
        try:
            with open(prompts_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(f"--prompts_file={prompts_file}: cannot read it as UTF-8 text "
                            f"({error})") from None
        jsonl = prompts_file.endswith(".jsonl")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if not jsonl:
                texts.append(line)
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UserError(f"--prompts_file={prompts_file}, line {number}: not JSON "
                                f"({error.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                raise UserError(f"--prompts_file={prompts_file}, line {number}: expected an "
                                f'object with a "prompt" string')
            texts.append(record["prompt"])
    if not texts:
        raise UserError("--mode=decode needs prompts: --prompt=\"...\" (repeatable) or "
                        "--prompts_file=FILE")
    return texts


class TokenIds:
    """The 'vocabulary' of a model trained on token ids: prompts are ids separated by spaces."""

    eos_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError:
            raise UserError(f"prompt {text!r}: this experiment trains on token ids and has no "
                            f"vocabulary; write prompts as ids (--prompt=\"5 7 9\"), or pass "
                            f"--vocab_path") from None
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise UserError(f"prompt {text!r}: token ids must be in [0, {self.vocab_size})")
        return ids

    def continuation(self, prompt_ids: list[int], ids: list[int]) -> str:
        return " ".join(str(i) for i in ids)


class TextTokenizer:
    """A text tokenizer (core.data.Tokenizer: SentencePiece, tasks/vocab.py, or a
    Hugging Face tokenizer.json) as decode uses it."""

    def __init__(self, tokenizer):
        self.tokenizer, self.eos_id = tokenizer, tokenizer.eos_id
        self.framing = framing_of(tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.framing.prompt(self.tokenizer.encode(text))  # as training documents start

    def continuation(self, prompt_ids: list[int], ids: list[int]) -> str:
        # Decoded together with the prompt: SentencePiece drops a leading space from a
        # text's first piece, which would glue the continuation to the prompt. (The EOS
        # or BOS that starts a prompt decodes to nothing.)
        prompt = self.tokenizer.decode(prompt_ids)
        whole = self.tokenizer.decode(prompt_ids + ids)
        return whole[len(prompt):] if whole.startswith(prompt) else self.tokenizer.decode(ids)


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
    """What --mode=decode is asked to do, from the command line's flags."""

    job_log_dir: str  # the run's directory: its checkpoints; decode_outputs.jsonl goes here
    prompts: tuple[str, ...] = ()  # --prompt
    prompts_file: str | None = None  # --prompts_file
    max_decode_steps: int = 64  # --max_decode_steps
    sampling: SamplingOptions = SamplingOptions()  # --temperature, --top_k, --top_p, --decode_seed
    batch_size: int = 16  # --decode_batch_size
    prefill_chunk_len: int = PREFILL_CHUNK_LEN  # --prefill_chunk_len
    vocab_path: str | None = None  # --vocab_path: the launcher builds the graph with it
    restore_checkpoint_dir: str | None = None  # --restore_checkpoint_dir
    restore_checkpoint_step: int | None = None  # --restore_checkpoint_step

    def __post_init__(self):
        object.__setattr__(self, "prompts", tuple(self.prompts))  # a list from the flags


def run(config, options: DecodeOptions) -> list[dict]:
    """Continue every prompt with the model of the run graph `config` (a RunSpec's
    fdl.Config); print the continuations, write decode_outputs.jsonl, return its records."""
    _check_limits(options.max_decode_steps, options.batch_size, options.prefill_chunk_len)
    texts = read_prompts(list(options.prompts), options.prompts_file)
    model = inference.load(config, options.job_log_dir, what="--mode=decode",
                           restore_checkpoint_dir=options.restore_checkpoint_dir,
                           restore_checkpoint_step=options.restore_checkpoint_step)
    records = continue_prompts(model, texts, max_decode_steps=options.max_decode_steps,
                               options=options.sampling, batch_size=options.batch_size,
                               prefill_chunk=options.prefill_chunk_len)
    _show(records)
    if jax.process_index() == 0:
        path = os.path.join(options.job_log_dir, OUTPUTS_FILE)
        try:  # a new job directory (decoding starting weights) is made here
            os.makedirs(options.job_log_dir, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        except OSError as error:
            raise UserError(f"cannot write {path} ({error.strerror}); the continuations are "
                            f"printed above") from None
        log(f"wrote {len(records)} continuation(s) to {path}")
    return records


def continue_prompts(model: inference.InferenceModel, texts: list[str], *,
                     max_decode_steps: int, options: SamplingOptions,
                     batch_size: int = 16, prefill_chunk: int = PREFILL_CHUNK_LEN
                     ) -> list[dict]:
    """One record per prompt: its continuation, token count, speed and why it stopped.
    Prompts longer than `prefill_chunk` tokens (0: none) enter the cache in chunks."""
    _check_limits(max_decode_steps, batch_size, prefill_chunk)
    tokenizer = (TokenIds(model.arch.vocab_size) if model.tokenizer is None
                 else TextTokenizer(model.tokenizer))
    encoded = [_fit_context(i, tokenizer.encode(text), model.max_seq_len)
               for i, text in enumerate(texts)]
    log(f"decoding {len(texts)} prompt(s) with step {model.step} of {model.checkpoint}: "
        f"{_sampling_summary(options)}, at most {max_decode_steps} tokens each")
    steps = min(max_decode_steps, model.max_seq_len)  # a prompt has at least one token
    batch = min(batch_size, len(texts))  # every batch the same size: one program
    records, elapsed = [], 0.0
    for start in range(0, len(texts), batch):
        rows = list(range(start, min(start + batch, len(texts))))
        prompt_len = _padded_length(max(len(encoded[r]) for r in rows), model.max_seq_len,
                                    prefill_chunk)
        prompts = np.zeros((batch, prompt_len), np.int32)  # left-padded with 0
        lengths = np.ones(batch, np.int32)  # rows past the last prompt: one padding token
        for i, r in enumerate(rows):
            prompts[i, prompt_len - len(encoded[r]):] = encoded[r]
            lengths[i] = len(encoded[r])
        inputs = (model.params, prompts, lengths, np.arange(start, start + batch, dtype=np.int32),
                  np.int32(options.seed))
        program = _program(model, inputs, steps=steps, eos_id=tokenizer.eos_id, options=options,
                           prefill_chunk=prefill_chunk)
        began = time.perf_counter()
        with jax.set_mesh(model.mesh):
            tokens = np.asarray(jax.device_get(jax.block_until_ready(program(*inputs))))
        seconds = time.perf_counter() - began
        elapsed += seconds
        for i, r in enumerate(rows):
            records.append(_record(texts[r], encoded[r], tokens[i], tokenizer, seconds,
                                   max_decode_steps, model.step))
    total = sum(r["tokens"] for r in records)
    log(f"generated {total} tokens in {elapsed:.2f}s: {total / elapsed:,.1f} tokens/s "
        f"(compilation excluded)")
    return records


def _padded_length(longest: int, max_seq_len: int, prefill_chunk: int) -> int:
    """A batch's prompt length: its longest prompt's, padded up to PROMPT_LENGTH_BUCKET
    (at most MAX_SEQ_LEN), and, when longer than a prefill chunk, to whole chunks (the
    left padding is masked: the cache only gets the slots)."""
    length = min(-(-longest // PROMPT_LENGTH_BUCKET) * PROMPT_LENGTH_BUCKET, max_seq_len)
    if 0 < prefill_chunk < length:
        length = -(-length // prefill_chunk) * prefill_chunk
    return length


def _check_limits(max_decode_steps: int, batch_size: int, prefill_chunk: int) -> None:
    if max_decode_steps < 1:
        raise UserError(f"--max_decode_steps={max_decode_steps}: must be at least 1")
    if batch_size < 1:
        raise UserError(f"--decode_batch_size={batch_size}: must be at least 1")
    if prefill_chunk < 0:
        raise UserError(f"--prefill_chunk_len={prefill_chunk}: must be >= 0 (0: the whole "
                        f"prompt at once)")


def _program(model: inference.InferenceModel, inputs: tuple, *, steps: int,
             eos_id: int | None, options: SamplingOptions, prefill_chunk: int):
    """The compiled generation program for these input shapes, compiled once per model."""
    batch, prompt_len = inputs[1].shape
    key = (batch, prompt_len, steps, eos_id, dataclasses.replace(options, seed=0),
           prefill_chunk)
    if key not in model.programs:
        began = time.perf_counter()
        generate = make_generate(
            model.arch, mesh=model.mesh, param_shardings=model.param_shardings, batch=batch,
            prompt_len=prompt_len, steps=steps, max_seq_len=model.max_seq_len, eos_id=eos_id,
            options=options, prefill_chunk=prefill_chunk)
        with jax.set_mesh(model.mesh):
            model.programs[key] = generate.lower(*inputs).compile()
        log(f"compiled generation for {batch} x {prompt_len}-token prompts in "
            f"{time.perf_counter() - began:.1f}s")
    return model.programs[key]


def _fit_context(index: int, ids: list[int], max_seq_len: int) -> list[int]:
    """The prompt's last MAX_SEQ_LEN tokens (the model's context), saying so when cut."""
    if not ids:
        raise UserError(f"prompt {index} is empty")
    if len(ids) > max_seq_len:
        log(f"prompt {index}: {len(ids)} tokens, cut from the left to the last {max_seq_len} "
            f"(MAX_SEQ_LEN)")
        return ids[-max_seq_len:]
    return ids


def _record(text: str, prompt_ids: list[int], row: np.ndarray, tokenizer, seconds: float,
            max_decode_steps: int, step: int) -> dict:
    ids = [int(t) for t in row if t != STOPPED]
    if ids and tokenizer.eos_id is not None and ids[-1] == tokenizer.eos_id:
        ids, stop = ids[:-1], "eos"
    elif len(ids) < max_decode_steps:
        stop = "max_seq_len"  # the context was full
    else:
        stop = "max_decode_steps"
    return {
        "prompt": text,
        "continuation": tokenizer.continuation(prompt_ids, ids),
        "tokens": len(ids),
        "tokens_per_s": round(len(ids) / seconds, 2) if seconds > 0 else None,
        "stop": stop,
        "prompt_tokens": len(prompt_ids),
        "checkpoint_step": step,
    }


def _sampling_summary(options: SamplingOptions) -> str:
    if options.greedy:
        return "greedy"
    limits = [f"top_k {options.top_k}"] if options.top_k else []
    limits += [f"top_p {options.top_p}"] if options.top_p < 1 else []
    return ", ".join([f"sampling at temperature {options.temperature}", *limits,
                      f"seed {options.seed}"])


def _show(records: list[dict]) -> None:
    for i, r in enumerate(records):
        log(f"--- [{i}] {r['prompt']}")
        log(f"{r['continuation']}")
        log(f"    ({r['tokens']} tokens, {r['tokens_per_s']} tokens/s, stopped: {r['stop']})")

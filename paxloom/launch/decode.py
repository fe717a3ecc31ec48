"""--mode=decode's launcher: an experiment and its run graph in, the decoding runtime
(paxloom/runner/inference/decode.py) called with the graph and the command line's options.

The experiment stops here: decoding needs nothing of it that the graph does not hold (the
model, the mesh, the sizes in `model_shape`, the run's `name` and its `tokenizer`)."""

import fiddle as fdl
from praxis import pax_fiddle

from paxloom.launch import record
from paxloom.runner.inference import decode
from paxloom.runner.inference.decode import DecodeOptions


def run(exp, config: fdl.Config | None, options: DecodeOptions) -> list[dict]:
    """Continue options' prompts with `exp`'s model, as its graph `config` says (default:
    exp.run_config(), with options.vocab_path); return decode_outputs.jsonl's records."""
    if config is None:
        config = exp.run_config(vocab_path=options.vocab_path)
    if config.tokenizer is not None:  # the vocabulary the checkpoints were trained with
        record.check_vocabulary(pax_fiddle.build(config.tokenizer),
                                options.restore_checkpoint_dir or options.job_log_dir,
                                options.vocab_path)
    return decode.run(config, options)

"""The tiny model the tests train, as hyperparameters and as main.py's --fdl. flags."""

# Its shapes: a model every test mesh can shard (8 heads split over up to 8 TP devices).
TINY_MODEL = dict(NUM_LAYERS=2, MODEL_DIMS=64, HIDDEN_DIMS=256, NUM_HEADS=8, DIMS_PER_HEAD=8,
                  MAX_SEQ_LEN=64, VOCAB_SIZE=512)
# ... trained in float32 on synthetic data, without evaluations during training.
TINY = dict(TINY_MODEL, FPROP_DTYPE="float32", DATASET="synthetic", EVAL_INTERVAL_STEPS=0)

# Four steps on Pile-format data with a 512-piece vocabulary, evaluated once at the end, the
# learning rate warm from step 2 on: with TINY, a short run of the reference GPT's recipe.
SHORT_PILE_RUN = dict(DATASET="pile", VOCAB_SIZE=512, MAX_STEPS=4, SUMMARY_INTERVAL_STEPS=2,
                      EVAL_INTERVAL_STEPS=4, EVAL_BATCHES=1, LR_COS_WARMUP=1,
                      LR_COS_DECAY_START=1, LR_COS_DECAY_END=4)


def fdl_flags(**hparams) -> list[str]:
    """main.py's flags setting each hyperparameter: --fdl.NAME=repr(value)."""
    return [f"--fdl.{name}={value!r}" for name, value in hparams.items()]


def _with(base: dict, overrides: dict) -> dict:
    return {name: value for name, value in {**base, **overrides}.items() if value is not None}


def tiny(**overrides) -> dict:
    """TINY with `overrides` (a value of None leaves that hyperparameter at the experiment's)."""
    return _with(TINY, overrides)


def tiny_flags(**overrides) -> list[str]:
    """tiny(**overrides) as main.py's --fdl. flags."""
    return fdl_flags(**tiny(**overrides))


def model_flags(**overrides) -> list[str]:
    """Only the tiny model's shapes (with `overrides`) as --fdl. flags: the tiny model in an
    experiment's own dtype, data and schedule."""
    return fdl_flags(**_with(TINY_MODEL, overrides))

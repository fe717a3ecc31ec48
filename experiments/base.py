"""BaseExperiment: every hyperparameter, declared once with its type and default.

An experiment is a class whose UPPER_CASE attributes are hyperparameters, declared in
groups (experiments/groups.py) and checked by experiments/hyperparameters.py: a subclass
may only *assign* declared names, and a user declares a new one by annotating it
(`MY_KNOB: int = 3`).

`run_config()` turns the hyperparameters into the whole run as a Fiddle graph:
model, optimizer with its schedule, input, evaluations, mesh and loop settings.
It reads the experiment and never mutates it. The methods below are the seams a
subclass overrides: the model, the data, the callbacks.
"""

import os
import typing

import fiddle as fdl

from experiments import groups
from experiments.hyperparameters import Hyperparameters
from paxloom.core import batch, mesh_axes
from paxloom.core.errors import UserError

if typing.TYPE_CHECKING:
    from praxis import pax_fiddle

    from paxloom.core import data
    from paxloom.core.target import TargetDevice

class BaseExperiment(groups.Model, groups.Architecture, groups.Parallelism, groups.Pipeline,
                     groups.MixtureOfExperts,
                     groups.Optimizer, groups.Data, groups.StartingWeights, groups.LoRA,
                     groups.Loop, groups.PaxDefaults, Hyperparameters):
    """Defaults describe a tiny GPT that trains on one CPU; subclasses set real sizes."""

    CHOICES = groups.CHOICES

    def validate(self) -> None:
        super().validate()
        if type(self).dataset is BaseExperiment.dataset:
            self.dataset()  # an unregistered DATASET fails now, with its near match
        if self.NUM_EXPERTS and type(self).model_template is BaseExperiment.model_template:
            raise UserError(f"NUM_EXPERTS={self.NUM_EXPERTS}: the GPT family has no mixture "
                            f"of experts; use a Llama-family experiment (e.g. "
                            f"experiments.MixtralTiny) or Pax's GLaM experiments")

    def batch_layout(self) -> batch.BatchLayout:
        """Global batch, sub-batches and microbatches on this mesh (paxloom/core/batch.py), or
        UserError naming what to change."""
        mesh = mesh_axes.mesh_size(self.ICI_MESH_SHAPE, self.DCN_MESH_SHAPE)
        return batch.layout(self.PERCORE_BATCH_SIZE, mesh, self.GRADIENT_ACCUMULATION_STEPS,
                            num_microbatches=self.NUM_MICROBATCHES,
                            microbatch_size=self.MICROBATCH_SIZE)

    # --- The model seam -------------------------------------------------------------

    def model_template(self) -> "pax_fiddle.Config":
        """The model: an unsharded praxis LanguageModel config (here, the Pax GPU GPT).

        Override it to build another family (experiments/llama.py), or call super()
        and swap a layer template (attention, feed-forward, norm). Sharding for the
        mesh is added afterwards by the runtime (paxloom/runner/state/partitioning.py).
        """
        from layers import gpt

        return gpt.gpt_model(
            self.transformer_stack(),
            model_dims=self.MODEL_DIMS, vocab_size=self.VOCAB_SIZE, max_seq_len=self.MAX_SEQ_LEN,
            packed_input=self.PACKED_INPUT, fprop_dtype=self.FPROP_DTYPE,
            init_std=self.INIT_STD, softmax_init_std=self.SOFTMAX_INIT_STD,
            layernorm_epsilon=self.LAYERNORM_EPSILON,
            embedding_lookup_style=self.EMBEDDING_LOOKUP_STYLE,
            loss_chunk_len=self.loss_chunk_len(),
            # Pax's GPT layer options
            activation=self.ACTIVATION_CLS, use_gated_activation=self.USE_GATED_ACTIVATION,
            use_bias=self.USE_BIAS, atten_logit_cap=self.ATTEN_LOGIT_CAP,
            separate_embedding=self.SEPARATE_EMBEDDING,
            trainable_position_emb=self.TRAINABLE_POSITION_EMB,
            trainable_pe_max_seq_len=self.TRAINABLE_PE_MAX_SEQ_LEN,
            combine_qkv=self.COMBINE_QKV, softmax_cap_logits=self.SOFTMAX_CAP_LOGITS,
        )

    def loss_chunk_len(self) -> int:
        """LOSS_CHUNK_LEN as the model builders take it: 0 where one chunk would hold the
        whole sequence, so that such a model keeps praxis's own softmax class."""
        return self.LOSS_CHUNK_LEN if self.LOSS_CHUNK_LEN < self.MAX_SEQ_LEN else 0

    def transformer_stack(self) -> "pax_fiddle.Config":
        """The stack of decoder layers with praxis's default layers (layers/stack.py)."""
        from layers import stack

        return stack.transformer_stack(
            num_layers=self.NUM_LAYERS, model_dims=self.MODEL_DIMS, hidden_dims=self.HIDDEN_DIMS,
            num_heads=self.NUM_HEADS, dims_per_head=self.DIMS_PER_HEAD,
            packed_input=self.PACKED_INPUT, use_repeated_layer=self.USE_REPEATED_LAYER,
            checkpoint_policy_name=self.CHECKPOINT_POLICY, dropout=self.dropout(),
        )

    def dropout(self) -> dict:
        """The stack's dropout probabilities, as praxis StackedTransformer's fields."""
        return dict(dropout_prob=self.DROPOUT_PROB, input_dropout_prob=self.INPUT_DROPOUT_PROB,
                    atten_dropout_prob=self.ATTEN_DROPOUT_PROB,
                    residual_dropout_prob=self.RESIDUAL_DROPOUT_PROB,
                    relu_dropout_prob=self.RELU_DROPOUT_PROB)

    # --- The data seam -------------------------------------------------------------

    def dataset(self) -> "data.Dataset":
        """What the run trains and evaluates on (paxloom/core/data.py's Dataset protocol).

        Default: the dataset registered under DATASET (tasks/datasets.py). Override it to
        train on your own files (`tasks.text.TextFiles(train="data/*.jsonl.gz", ...)`) or
        to return any dataset of your own.
        """
        from tasks import datasets

        return datasets.lookup(self.DATASET)

    def data_settings(self, data_dir: str | None = None, vocab_path: str | None = None,
                      cache_dir: str | None = None) -> "data.DataSettings":
        """The hyperparameters a dataset reads, and where the flags say data live. Without
        a --vocab_path, a run that starts from a Hugging Face model directory encodes with
        that model's own tokenizer.json. UserError when the starting weights fix another
        VOCAB_SIZE (before any tokenizer check, which would name another size)."""
        from paxloom.core import data

        weights_vocab = None
        if self.CHECKPOINT_RESTORE_PATH:
            from paxloom.runner.state import initial_weights

            weights_vocab = initial_weights.vocab_size(self.CHECKPOINT_RESTORE_PATH,
                                                       self.CHECKPOINT_IGNORE_RULES or [])
        if weights_vocab is not None and weights_vocab[0] != self.VOCAB_SIZE:
            size, where = weights_vocab
            raise UserError(f"VOCAB_SIZE={self.VOCAB_SIZE}, but the starting weights' "
                            f"vocabulary has {size} ids ({where}); set "
                            f"--fdl.VOCAB_SIZE={size}")
        if vocab_path is None and self.CHECKPOINT_RESTORE_PATH:
            model_tokenizer = os.path.join(self.CHECKPOINT_RESTORE_PATH, "tokenizer.json")
            vocab_path = model_tokenizer if os.path.isfile(model_tokenizer) else None

        return data.DataSettings(
            seq_len=self.MAX_SEQ_LEN, vocab_size=self.VOCAB_SIZE,
            seed=self.TRAIN_INPUT_RANDOM_SEED, packed=self.PACKED_INPUT,
            max_segments=self.MAX_SEGMENTS_PER_SEQ,
            eval_batches=self.EVAL_BATCHES, lambada_eval=self.LAMBADA_EVAL,
            lambada_max_examples=self.LAMBADA_MAX_EXAMPLES,
            validation_files=self.VALIDATION_FILES,
            validation_fraction=self.VALIDATION_FRACTION, text_field=self.TEXT_FIELD,
            add_bos=self.ADD_BOS, add_eos=self.ADD_EOS, data_dir=data_dir,
            vocab_path=vocab_path, cache_dir=cache_dir, weights_vocab=weights_vocab)

    def train_dataset(self, settings: "data.DataSettings"):
        """The train input's graph node (None: evaluation only). Default: the dataset's."""
        return self.dataset().train_input(settings)

    def evaluations(self, settings: "data.DataSettings") -> list:
        """The evaluation sets' graph nodes. Default: the dataset's; extend with super()."""
        return list(self.dataset().evaluations(settings))

    # --- The callback seam ---------------------------------------------------------

    def callbacks(self) -> list:
        """Extra training-loop callbacks (core.callbacks.Callback) for this
        experiment, beside the built-in ones the launcher adds."""
        return []

    def run_config(self, data_dir: str | None = None, vocab_path: str | None = None,
                   cache_dir: str | None = None, target: "TargetDevice | None" = None
                   ) -> fdl.Config:
        """The whole run as a Fiddle graph (see experiments/run_graph.py).

        `data_dir`, `vocab_path` and `cache_dir` (tokenized data) say where this machine
        keeps the data; they are not hyperparameters, so they come from flags.
        `target` (paxloom/core/target.py): the devices to build for, this process's by default
        (--mode=plan passes the GPU it plans for).
        """
        from experiments import run_graph

        return run_graph.build_run_config(self, data_dir=data_dir, vocab_path=vocab_path,
                                          cache_dir=cache_dir, target=target)

    @classmethod
    def command(cls) -> str:
        """The command line that runs this experiment (also in each docstring)."""
        return f"python main.py --fdl_config={cls.__module__}.{cls.__name__} --job_log_dir=runs/{cls.__name__}"

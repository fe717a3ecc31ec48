"""ADD_BOS and ADD_EOS (paxloom/core/framing.py): the tokens around every document, the same
in training batches (packed, unpacked, under a segment bound), Pile validation, Lambada,
decoding and BoolQ; the default is what the tokenizer's own post-processor does (a Llama 3
tokenizer.json puts its BOS first), and Pax's framing (no BOS, EOS after every document)
is what a SentencePiece vocabulary gets."""

import pickle

import numpy as np
import pytest
from praxis import pax_fiddle

import experiments
from paxloom.core.errors import UserError
from paxloom.core.framing import Framing, framing_of
from paxloom.runner.inference.decode import TextTokenizer
from tasks import input_pipeline
from tasks.input_pipeline import PileEvalInput, PileTrainInput
from tasks.lambada import LambadaExample, tokenize_example
from tasks.packing import pack_documents
from tasks.text_formats import expand_files
from tasks.tokenizer import load_tokenizer
from tests.support import data as fx
from tests.support.tiny import TINY

SEQ_LEN = 32
DOCS = fx.make_docs(150, seed=11, min_words=1, max_words=3)  # shorter than a row


@pytest.fixture(scope="module")
def llama3_tokenizer(tmp_path_factory):
    return fx.llama3_style_tokenizer(tmp_path_factory.mktemp("llama3_tokenizer"),
                                     fx.make_docs(200, seed=1))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fx.write_corpus(tmp_path_factory.mktemp("corpus"), "jsonl", DOCS)


def training_batch(corpus, vocab_path, **hparams):
    """(the first training batch, the run's tokenizer) of a tiny DATASET='text' run whose
    hyperparameters are `hparams`, built as a run builds them (its graph)."""
    exp = experiments.BaseExperiment(**{**TINY, "DATASET": "text", "MAX_SEQ_LEN": SEQ_LEN,
                                        "MAX_SEGMENTS_PER_SEQ": SEQ_LEN, **hparams})
    run = pax_fiddle.build(exp.run_config(data_dir=str(corpus), vocab_path=str(vocab_path)))
    return run.make_train_input(global_batch_size=8, process_rows=(0, 8)).next_batch(), \
        run.tokenizer


def in_row_starts(batch) -> np.ndarray:
    """[R, L] the positions where a document's segment opens inside a row (not at its start,
    where a row may cut a document)."""
    starts = (batch["segment_pos"] == 0) & (batch["paddings"] == 0)
    starts[:, 0] = False
    return starts


def test_a_tokenizer_json_that_adds_bos_frames_documents_with_it(llama3_tokenizer):
    tokenizer = load_tokenizer(llama3_tokenizer)
    bos, eos = (tokenizer._tok.token_to_id(t) for t in (fx.LLAMA3_BOS, fx.LLAMA3_EOS))
    assert tokenizer.template == ([bos], [])
    assert tokenizer.framing == Framing(eos_id=eos, bos_id=bos)
    assert load_tokenizer(llama3_tokenizer, add_bos=False).framing == Framing(eos_id=eos)
    framing = load_tokenizer(llama3_tokenizer, add_eos=False).framing
    assert framing.document([5, 6]) == [bos, 5, 6] and framing.prompt([5]) == [bos, 5]
    assert pickle.loads(pickle.dumps(tokenizer)).framing == tokenizer.framing  # prepare's workers


def test_pax_vocabulary_adds_no_bos_and_refuses_one_it_lacks(tmp_path_factory):
    path = fx.tiny_vocab_path(tmp_path_factory)
    vocab = load_tokenizer(path)
    assert vocab.bos_id is None and vocab.framing == Framing(eos_id=vocab.eos_id)
    assert vocab.framing.document([5, 6]) == [5, 6, vocab.eos_id]
    with pytest.raises(UserError, match=r"ADD_BOS=True: tokenizer .*tiny.model has no BOS token"
                                        r".*set --fdl.ADD_BOS=False") as info:
        load_tokenizer(path, add_bos=True)
    assert "\n" not in str(info.value)
    with pytest.raises(UserError, match="ADD_EOS=False: documents of tokenizer .* would have no "
                                        "mark where one ends"):
        load_tokenizer(path, add_eos=False)
    with pytest.raises(UserError, match="ADD_BOS=False and ADD_EOS=False"):
        experiments.BaseExperiment(ADD_BOS=False, ADD_EOS=False)


def test_a_bos_that_is_the_eos_frames_as_pax():
    assert Framing(eos_id=3, bos_id=3, add_eos=False) == Framing(eos_id=3)


@pytest.mark.parametrize("add_bos", [None, True])
def test_add_bos_puts_the_bos_first_in_training_batches(corpus, llama3_tokenizer, add_bos):
    batch, tokenizer = training_batch(corpus, llama3_tokenizer, ADD_BOS=add_bos)
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    ids, labels, weights = batch["ids"], batch["labels"], batch["weights"]
    starts = in_row_starts(batch)
    assert starts.sum() > 8  # several documents a row
    assert (ids[starts] == bos).all()  # every document opens with the BOS...
    assert ((ids == bos) <= (batch["segment_pos"] == 0)).all()  # ...and the BOS opens one
    assert (weights[labels == bos] == 0).all()  # never predicted across documents
    assert (weights[labels == eos] == 1).all() and (labels == eos).any()  # EOS is learnt
    assert (batch["paddings"] == 0).all()  # a BOS label is not padding: attention sees it

    unpacked, _ = training_batch(corpus, llama3_tokenizer, ADD_BOS=add_bos, PACKED_INPUT=False)
    assert (unpacked["ids"][:, 0] == bos).all()  # short documents: one a row, BOS first


def test_add_bos_false_and_pax_defaults_put_no_bos_in_training_batches(
        corpus, llama3_tokenizer, tmp_path_factory):
    batch, tokenizer = training_batch(corpus, llama3_tokenizer, ADD_BOS=False)
    assert not (batch["ids"] == tokenizer.bos_id).any()
    assert (batch["ids"][in_row_starts(batch)] == tokenizer.eos_id).all()  # Pax's: EOS plays BOS
    unpacked, _ = training_batch(corpus, llama3_tokenizer, ADD_BOS=False, PACKED_INPUT=False)
    assert (unpacked["ids"][:, 0] == tokenizer.eos_id).all()

    vocab_path = fx.tiny_vocab_path(tmp_path_factory)
    batch, vocab = training_batch(corpus, vocab_path)
    assert framing_of(vocab) == Framing(eos_id=vocab.eos_id)
    assert (batch["ids"][in_row_starts(batch)] == vocab.eos_id).all()
    assert (batch["weights"] == 1 - batch["paddings"]).all()  # every label trained, as Pax


def test_without_eos_documents_are_bos_then_text(corpus, llama3_tokenizer):
    batch, tokenizer = training_batch(corpus, llama3_tokenizer, ADD_EOS=False)
    assert not (batch["ids"] == tokenizer.eos_id).any()
    assert (batch["ids"][in_row_starts(batch)] == tokenizer.bos_id).all()


@pytest.mark.parametrize("small_windows", [False, True])
def test_bos_rows_under_a_segment_bound_are_those_of_the_packer(corpus, llama3_tokenizer,
                                                               small_windows, monkeypatch):
    """The training input finds its rows from the documents' ends (packed_rows); with BOS
    documents they are pack_documents' rows of the same documents, cut rows included."""
    if small_windows:
        for name, value in (("_FIRST_WINDOW", 1), ("_MAX_WINDOW", 4), ("_READ_ROWS", 1)):
            monkeypatch.setattr(input_pipeline, name, value)
    tokenizer = load_tokenizer(llama3_tokenizer)
    framing = tokenizer.framing
    files = expand_files(str(corpus))
    inp = PileTrainInput(files, tokenizer, SEQ_LEN, 4, (0, 4), seed=0, max_segments=3)
    assert inp._rows is not None and inp._rows.cut_rows > 0
    docs = [framing.document(tokenizer.encode(d)) for d in DOCS]
    want = list(pack_documents(docs, SEQ_LEN, framing.start_id, max_segments=3, lead=False))
    got = []
    for r in range(inp.num_sequences):
        start, n = inp._row_span(r)
        got.append(inp.stream.read(start, n).tolist())
    assert got == [row[:n].tolist() for row, n in want]


def test_evaluation_and_decoding_start_as_training_documents(corpus, llama3_tokenizer):
    tokenizer = load_tokenizer(llama3_tokenizer)
    bos = tokenizer.bos_id
    tokens, _ = tokenize_example(LambadaExample("the river and the", " city", 1), tokenizer,
                                 SEQ_LEN)
    assert tokens[0] == bos
    assert TextTokenizer(tokenizer).encode("the river") == [bos] + tokenizer.encode("the river")
    (batch, *_) = PileEvalInput(expand_files(str(corpus)), tokenizer, SEQ_LEN, 4, 1)
    assert batch["ids"][0, 0] == bos and (batch["ids"][in_row_starts(batch)] == bos).all()
    assert (batch["weights"][batch["labels"] == bos] == 0).all()

    pax = load_tokenizer(llama3_tokenizer, add_bos=False)
    assert tokenize_example(LambadaExample("the river", " city", 1), pax, SEQ_LEN)[0][0] == (
        pax.eos_id)
    assert TextTokenizer(pax).encode("the river")[0] == pax.eos_id

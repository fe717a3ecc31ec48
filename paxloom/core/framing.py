"""How documents are delimited in the token stream (ADD_BOS, ADD_EOS): decided once per
tokenizer, when the run's tokenizer node is built (tasks/tokenizer.py, tasks/vocab.py), and
read from it by packing, the evaluations, decoding and the Hugging Face export.

Two framings, both packed as tasks/packing.py describes:

- Pax's (no BOS): every document is `doc EOS`, and one EOS leads the stream. The EOS that
  ends a document opens the next one's segment (it plays BOS) and is trained on as the
  label of the document's last token. A SentencePiece vocabulary's default, and a
  tokenizer.json's whose post-processor adds no BOS (or adds its EOS first).
- With a BOS: every document is `BOS doc EOS` (`BOS doc` without EOS), nothing leads the
  stream, and the BOS opens each segment. No label is a BOS (its weight is 0): predicting
  the next document's start from the previous document is not learnt. The default of a
  tokenizer.json whose post-processor puts a BOS first (Llama 3's `<|begin_of_text|>`).

A prompt (decoding, Lambada's context, the exported tokenizer's encodings) starts with the
token that opens a segment: the BOS, or Pax's EOS. A tokenizer whose BOS is its EOS (GPT-2's
`<|endoftext|>`) is framed as Pax's either way.
"""

import dataclasses

from paxloom.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Framing:
    """The tokens around every document: `bos_id` before it (None: Pax's framing), EOS after
    it when `add_eos`."""

    eos_id: int
    bos_id: int | None = None
    add_eos: bool = True

    def __post_init__(self):
        if self.bos_id == self.eos_id:  # the EOS that ends one document starts the next
            object.__setattr__(self, "bos_id", None)
            object.__setattr__(self, "add_eos", True)
        if self.bos_id is None and not self.add_eos:
            raise ValueError("a framing without BOS needs EOS: nothing would mark where "
                             "documents end")

    @property
    def start_id(self) -> int:
        """The token that opens a segment, and that every prompt starts with."""
        return self.eos_id if self.bos_id is None else self.bos_id

    @property
    def leads(self) -> bool:
        """Whether the stream starts with one start_id before the first document (Pax's
        leading EOS); with a BOS every document brings its own."""
        return self.bos_id is None

    @property
    def unlabelled_id(self) -> int | None:
        """The label that gets weight 0 (the BOS), or None."""
        return self.bos_id

    def document(self, ids) -> list[int]:
        """A training document's tokens: `ids` (its text's encoding) with BOS and EOS."""
        head = [] if self.bos_id is None else [self.bos_id]
        return head + list(ids) + ([self.eos_id] if self.add_eos else [])

    def prompt(self, ids) -> list[int]:
        """A text to continue (a prompt, Lambada's context) as its segment starts."""
        return [self.start_id, *ids]


def framing_of(tokenizer) -> Framing:
    """The framing a tokenizer (core.data.Tokenizer) was built with: its `framing`, or Pax's
    for a tokenizer of one's own that has none."""
    framing = getattr(tokenizer, "framing", None)
    return framing if framing is not None else Framing(int(tokenizer.eos_id))


def resolve(name: str, *, eos_id: int, bos_id: int | None, template_bos: bool,
            add_bos: bool | None, add_eos: bool) -> Framing:
    """The Framing of tokenizer `name` under ADD_BOS=`add_bos` (None: `template_bos`, whether
    its own post-processor puts the BOS `bos_id` first) and ADD_EOS=`add_eos`; UserError, in
    one line, for a combination it cannot have."""
    wants_bos = template_bos if add_bos is None else add_bos
    if wants_bos and bos_id is None:
        raise UserError(f"ADD_BOS=True: tokenizer {name} has no BOS token (no bos_token in a "
                        f"tokenizer_config.json beside it, none added first by its "
                        f"post-processor, no bos_id in a SentencePiece model); set "
                        f"--fdl.ADD_BOS=False")
    framing_bos = bos_id if wants_bos else None
    if not add_eos and (framing_bos is None or framing_bos == eos_id):
        why = ("it has no BOS either" if framing_bos is None
               else "its BOS is its EOS")
        raise UserError(f"ADD_EOS=False: documents of tokenizer {name} would have no mark "
                        f"where one ends and the next begins ({why}); set --fdl.ADD_EOS=True"
                        + ("" if framing_bos is not None or bos_id is None
                           else " or --fdl.ADD_BOS=True"))
    return Framing(eos_id=eos_id, bos_id=framing_bos, add_eos=add_eos)

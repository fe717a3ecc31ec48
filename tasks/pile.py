"""Stream documents from Pile-format files: `.jsonl.zst` or `.jsonl`, one JSON object a line.

Each line is `{"text": "...", "meta": {"pile_set_name": "..."}}`; only `text` is
required, so any corpus with a `text` field works, and with a TextFormat any of the
formats of tasks/text_formats.py (jsonl.gz, parquet, Arrow, txt; another text field).
Bad lines in a training corpus are skipped and counted (a 200 GB crawl always has a
few); they are never skipped silently: the first few are logged with file:line and a
summary follows. Damage that loses data we cannot count (a corrupt or truncated zstd
stream) and a file with no documents at all raise UserError.
"""

from collections.abc import Iterator

from tasks import text_formats
from tasks.text_formats import MAX_LOGGED_BAD_LINES, ReadStats, TextFormat

__all__ = ["MAX_LOGGED_BAD_LINES", "ReadStats", "TextFormat", "iter_documents"]


def iter_documents(
    path,
    stats: ReadStats | None = None,
    with_set_name: bool = False,
    text_format: TextFormat = TextFormat(),  # noqa: B008 (frozen, so one shared default is safe)
) -> Iterator:
    """Yield the text of each good document of `path` (or `(text, pile_set_name)` pairs).

    Raises UserError for a missing file, a corrupt/truncated zstd stream, or a
    file with no documents. Pass a ReadStats to see the counts afterwards.
    """
    return text_formats.iter_documents(path, stats, text_format, with_set_name)

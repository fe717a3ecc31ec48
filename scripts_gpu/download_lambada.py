#!/usr/bin/env python3
"""Download the Lambada test set into <data_dir>/lambada/lambada_test.jsonl.

    export TFDS_DATA_DIR=/data
    python scripts_gpu/download_lambada.py [--url URL]

The default URL is the OpenAI copy of the Lambada test set (5153 passages, one
{"text": passage} a line) that the reference Pax scripts used. The download
resumes from a .part file and is renamed into place when complete; offline or
unreachable prints one line and exits with status 2. Standard library only.
"""

import json
import os
import sys
from pathlib import Path

# The shared downloader lives next to this file; make it importable however we are run.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from download_the_pile import DownloadError, fetch, make_parser, run  # noqa: E402

DEFAULT_URL = "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"
EXPECTED_EXAMPLES = 5153


def main(argv=None) -> int:
    parser = make_parser(__doc__, "lambada", ("--url", "--mirror"), DEFAULT_URL, "file URL")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    return run(_download, parser.parse_args(argv))


def _download(args) -> None:
    dest = Path(args.data_dir) / "lambada" / "lambada_test.jsonl"
    if dest.exists():
        print(f"{dest} exists, skipping")
        return
    fetch(args.url, dest, progress=not args.no_progress)
    with open(dest, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    bad = next((i for i, line in enumerate(lines, 1) if not _is_example(line)), None)
    if bad is not None:
        dest.unlink()
        raise DownloadError(
            f'{args.url} line {bad} is not a {{"text": ...}} object; deleted {dest}, check --url'
        )
    note = (
        ""
        if len(lines) == EXPECTED_EXAMPLES
        else f" (the standard test set has {EXPECTED_EXAMPLES})"
    )
    print(f"wrote {dest}: {len(lines)} passages{note}")


def _is_example(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("text"), str)


if __name__ == "__main__":
    sys.exit(main())

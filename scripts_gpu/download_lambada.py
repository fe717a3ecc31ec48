#!/usr/bin/env python3
"""Download the Lambada test set into <data_dir>/lambada/lambada_test.jsonl.

    export TFDS_DATA_DIR=/data
    python scripts_gpu/download_lambada.py [--url URL]

The default URL is the OpenAI copy of the Lambada test set (5153 passages, one
{"text": passage} a line) that the reference Pax scripts used. The download
resumes from a .part file and is renamed into place when complete; offline or
unreachable prints one line and exits with status 2. Standard library only.
"""

import argparse
import json
import os
import sys
from pathlib import Path

# The shared downloader lives next to this file; make it importable however we are run.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from download_the_pile import DownloadError, fetch  # noqa: E402

DEFAULT_URL = "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"
EXPECTED_EXAMPLES = 5153


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data_dir",
        default=os.environ.get("TFDS_DATA_DIR"),
        help="where lambada/ goes (default $TFDS_DATA_DIR)",
    )
    parser.add_argument(
        "--url",
        "--mirror",
        dest="url",
        default=DEFAULT_URL,
        help=f"file URL (default {DEFAULT_URL})",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        if not args.data_dir:
            raise DownloadError("no data directory: pass --data_dir or set TFDS_DATA_DIR")
        dest = Path(args.data_dir) / "lambada" / "lambada_test.jsonl"
        if dest.exists():
            print(f"{dest} exists, skipping")
            return 0
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
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


def _is_example(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("text"), str)


if __name__ == "__main__":
    sys.exit(main())

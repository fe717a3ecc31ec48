#!/usr/bin/env python3
"""Download The Pile into <data_dir>/pile/ (train/00..29.jsonl.zst, val.jsonl.zst, test.jsonl.zst).

    export TFDS_DATA_DIR=/data
    python scripts_gpu/download_the_pile.py                         # everything, ~460 GB
    python scripts_gpu/download_the_pile.py --splits val,test       # the eval splits only
    python scripts_gpu/download_the_pile.py --train_shards 0-1      # a first taste of train
    python scripts_gpu/download_the_pile.py --mirror https://host/path/to/pile

The default URLs are the ones the reference Pax scripts used (the-eye.eu). The
original host no longer serves The Pile, so you will likely need --mirror: any
base URL with the same layout (<base>/train/00.jsonl.zst, <base>/val.jsonl.zst,
...) works, including a file server you run yourself.

Downloads resume: bytes go to <file>.part (continued with an HTTP Range request
after an interruption) and the file gets its final name only once complete and
verified. Sizes are checked against the server's Content-Length; sha256 sums are
checked when the mirror has a SHA256SUMS.txt (the-eye published one). Being
offline or an unreachable mirror prints one line and exits with status 2.
Standard library only, so it runs before anything is installed.
"""

import argparse
import hashlib
import http.client
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

DEFAULT_MIRROR = "https://the-eye.eu/public/AI/pile"
NUM_TRAIN_SHARDS = 30
CHUNK_BYTES = 1 << 20
RETRIES = 5  # resumed attempts after a dropped connection, per file
TIMEOUT_S = 60


class DownloadError(Exception):
    """Ends the script with its one-line message and exit status 2."""


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return ""


class _Progress:
    def __init__(self, name: str, total: int | None, start: int, enabled: bool):
        self.name, self.total, self.start, self.enabled = name, total, start, enabled
        self.t0 = self.last = time.monotonic()

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not final and now - self.last < 0.5):
            return
        self.last = now
        rate = (done - self.start) / max(now - self.t0, 1e-9)
        pct = f"{100 * done / self.total:5.1f}%  " if self.total else ""
        total = f"/{_fmt_bytes(self.total)}" if self.total else ""
        sys.stderr.write(f"\r{self.name}  {pct}{_fmt_bytes(done)}{total}  {_fmt_bytes(rate)}/s   ")
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _unreachable(url: str, reason) -> DownloadError:
    host = urllib.parse.urlsplit(url).netloc
    return DownloadError(
        f"cannot reach {host} for {url} ({reason}); check the network, or pass a mirror"
    )


def _open(url: str, offset: int):
    headers = {"User-Agent": "paxloom-download/1"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)


def fetch(url: str, dest, expected_sha256: str | None = None, progress: bool = True) -> Path:
    """Download `url` to `dest`, resuming from `dest`.part; return dest. DownloadError on failure."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    total = None
    for attempt in range(RETRIES + 1):
        have = part.stat().st_size if part.exists() else 0
        try:
            response = _open(url, have)
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:
                # Range past the end: the .part may already be complete.
                content_range = e.headers.get("Content-Range", "")
                if content_range.startswith("bytes */") and int(content_range[8:]) == have:
                    total = have
                    break
                part.unlink()  # larger than the file on the server: start over
                continue
            raise DownloadError(
                f"{url}: HTTP {e.code} {e.reason}; the mirror may not have this file, pass another mirror"
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise _unreachable(url, getattr(e, "reason", e)) from None
        with response:
            length = response.headers.get("Content-Length")
            if response.status == 206:
                start = int(
                    response.headers.get("Content-Range", "bytes 0-").split()[1].split("-")[0]
                )
                if start != have:
                    raise DownloadError(
                        f"{url}: server resumed at byte {start}, not {have}; delete {part}"
                    )
                mode = "ab"
            else:  # 200: the server ignored Range, so the whole file comes again
                have, mode = 0, "wb"
            total = have + int(length) if length is not None else None
            bar = _Progress(dest.name, total, have, progress)
            done = have
            try:
                with open(part, mode) as f:
                    while chunk := response.read(CHUNK_BYTES):
                        f.write(chunk)
                        done += len(chunk)
                        bar.update(done)
            except (OSError, http.client.HTTPException) as e:
                dropped = isinstance(e, TimeoutError | ConnectionError | http.client.HTTPException)
                if not dropped:  # e.g. disk full: retrying will not help
                    raise DownloadError(f"cannot write {part} ({e})") from None
                if attempt == RETRIES:
                    raise DownloadError(
                        f"{url}: connection kept dropping ({e}); run again to resume"
                    ) from None
                sys.stderr.write(f"\n{dest.name}: connection dropped ({e}); resuming\n")
                continue
            bar.update(done, final=True)
        if total is None or done == total:
            break
        if attempt == RETRIES:
            raise DownloadError(f"{url}: got {done} of {total} bytes; run again to resume")
    size = part.stat().st_size
    if total is not None and size != total:
        raise DownloadError(f"{part} has {size} bytes, expected {total}; run again to resume")
    if expected_sha256:
        digest = _sha256(part)
        if digest != expected_sha256.lower():
            part.unlink()
            raise DownloadError(
                f"{url}: sha256 {digest} does not match {expected_sha256}; deleted it, run again"
            )
    os.replace(part, dest)
    return dest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES * 8):
            h.update(chunk)
    return h.hexdigest()


def fetch_checksums(base_url: str) -> dict[str, str]:
    """{relative path: sha256} from <base>/SHA256SUMS.txt, or {} if the mirror has none."""
    url = f"{base_url}/SHA256SUMS.txt"
    try:
        with _open(url, 0) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError:
        return {}
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise _unreachable(url, getattr(e, "reason", e)) from None
    sums = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 64:
            sums[parts[1].lstrip("*").removeprefix("./")] = parts[0].lower()
    return sums


def _shard_range(text: str) -> list[int]:
    if "-" in text:
        lo, hi = (int(x) for x in text.split("-"))
        return list(range(lo, hi + 1))
    return [int(x) for x in text.split(",")]


# make_parser and run are download_lambada.py's too: both scripts take --data_dir and a URL
# and end the same way.
def make_parser(
    doc: str, what: str, url_flags: tuple[str, ...], url_default: str, url_help: str
) -> argparse.ArgumentParser:
    """The downloaders' parser: `doc`'s first line, --data_dir for <what>/, then the URL option."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument(
        "--data_dir",
        default=os.environ.get("TFDS_DATA_DIR"),
        help=f"where {what}/ goes (default $TFDS_DATA_DIR)",
    )
    parser.add_argument(*url_flags, default=url_default, help=f"{url_help} (default {url_default})")
    return parser


def run(download, args) -> int:
    """Call download(args) and return main()'s exit status: 0; a DownloadError prints one line
    and gives 2 (no traceback); Ctrl-C gives 130, the download left to resume."""
    try:
        if not args.data_dir:
            raise DownloadError("no data directory: pass --data_dir or set TFDS_DATA_DIR")
        download(args)
    except DownloadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


def main(argv=None) -> int:
    parser = make_parser(
        __doc__,
        "pile",
        ("--mirror", "--url"),
        DEFAULT_MIRROR,
        "base URL with train/NN.jsonl.zst, val.jsonl.zst, test.jsonl.zst",
    )
    parser.add_argument(
        "--splits", default="train,val,test", help="comma-separated subset of train,val,test"
    )
    parser.add_argument(
        "--train_shards",
        default=f"0-{NUM_TRAIN_SHARDS - 1}",
        help="train shards to fetch: a range like 0-29 or a list like 0,5",
    )
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    return run(_download, parser.parse_args(argv))


def _download(args) -> None:
    splits = [s for s in args.splits.split(",") if s]
    unknown = set(splits) - {"train", "val", "test"}
    if unknown:
        raise DownloadError(f"--splits has unknown {sorted(unknown)}; use train, val, test")
    try:
        shards = _shard_range(args.train_shards)
    except ValueError:
        raise DownloadError(
            f"--train_shards={args.train_shards!r} is not a range like 0-29 or list like 0,5"
        ) from None
    base = args.mirror.rstrip("/")
    names = []
    if "train" in splits:
        names += [f"train/{i:02d}.jsonl.zst" for i in shards]
    names += [f"{s}.jsonl.zst" for s in ("val", "test") if s in splits]
    pile_dir = Path(args.data_dir) / "pile"
    todo = [n for n in names if not (pile_dir / n).exists()]
    for n in set(names) - set(todo):
        print(f"{pile_dir / n} exists, skipping")
    sums = fetch_checksums(base) if todo else {}
    if todo and not sums:
        print(f"note: {base}/SHA256SUMS.txt not available; checking sizes only")
    for name in todo:
        fetch(f"{base}/{name}", pile_dir / name, sums.get(name), progress=not args.no_progress)
        print(f"wrote {pile_dir / name}")


if __name__ == "__main__":
    sys.exit(main())

"""The download scripts against a local HTTP server on 127.0.0.1 (Range support, drops, 404s)."""

import hashlib
import http.server
import importlib.util
import json
import socket
import threading

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.processes import run_python, session_env


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts_gpu" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pile_dl = _load("download_the_pile")
lambada_dl = _load("download_lambada")


class _Server:
    """Serves `files` ({url path: bytes}); honours Range; can cut the first response short."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.cut_after: dict[str, int] = {}  # path -> bytes to send before dropping, once
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.requests.append((self.path, self.headers.get("Range")))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng := self.headers.get("Range"):
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut = server.cut_after.pop(self.path, None)
                self.wfile.write(body[start:] if cut is None else body[start : start + cut])
                if cut is not None:
                    self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _payload(n: int, seed: int) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (n // 32) + b"x" * (n % 32)


def _pile_files(server, with_sums=True):
    files = {
        "/pile/train/00.jsonl.zst": _payload(300_000, 0),
        "/pile/train/01.jsonl.zst": _payload(5_000, 1),
        "/pile/val.jsonl.zst": _payload(7_000, 2),
        "/pile/test.jsonl.zst": _payload(9_000, 3),
    }
    server.files.update(files)
    if with_sums:
        sums = "".join(
            f"{hashlib.sha256(body).hexdigest()}  ./{path.removeprefix('/pile/')}\n"
            for path, body in files.items()
        )
        server.files["/pile/SHA256SUMS.txt"] = sums.encode()
    return files


def test_pile_download_all_splits_verified(server, tmp_path):
    files = _pile_files(server)
    rc = pile_dl.main(
        [
            "--data_dir",
            str(tmp_path),
            "--mirror",
            server.url + "/pile/",
            "--train_shards",
            "0-1",
            "--no_progress",
        ]
    )
    assert rc == 0
    for path, body in files.items():
        assert (tmp_path / path.lstrip("/")).read_bytes() == body
    assert not list(tmp_path.rglob("*.part"))
    # A second run finds everything and fetches nothing.
    server.requests.clear()
    assert (
        pile_dl.main(
            ["--data_dir", str(tmp_path), "--mirror", server.url + "/pile", "--train_shards", "0-1"]
        )
        == 0
    )
    assert server.requests == []


def test_pile_download_resumes_from_part_file(server, tmp_path):
    files = _pile_files(server, with_sums=False)
    body = files["/pile/train/00.jsonl.zst"]
    part = tmp_path / "pile" / "train" / "00.jsonl.zst.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(body[:123_456])
    rc = pile_dl.main(
        [
            "--data_dir",
            str(tmp_path),
            "--mirror",
            server.url + "/pile",
            "--splits",
            "train",
            "--train_shards",
            "0",
        ]
    )
    assert rc == 0
    assert (tmp_path / "pile" / "train" / "00.jsonl.zst").read_bytes() == body
    assert ("/pile/train/00.jsonl.zst", "bytes=123456-") in server.requests


def test_fetch_resumes_after_dropped_connection(server, tmp_path):
    body = _payload(200_000, 7)
    server.files["/f.bin"] = body
    server.cut_after["/f.bin"] = 50_000
    out = pile_dl.fetch(
        server.url + "/f.bin", tmp_path / "f.bin", hashlib.sha256(body).hexdigest(), progress=False
    )
    assert out.read_bytes() == body
    assert server.requests == [("/f.bin", None), ("/f.bin", "bytes=50000-")]


def test_fetch_complete_part_file_is_finished_not_refetched(server, tmp_path):
    body = _payload(10_000, 8)
    server.files["/f.bin"] = body
    (tmp_path / "f.bin.part").write_bytes(body)
    assert (
        pile_dl.fetch(server.url + "/f.bin", tmp_path / "f.bin", progress=False).read_bytes()
        == body
    )


def test_checksum_mismatch_deletes_part_and_exits_2(server, tmp_path, capsys):
    _pile_files(server)
    server.files["/pile/val.jsonl.zst"] = b"tampered"
    rc = pile_dl.main(
        ["--data_dir", str(tmp_path), "--mirror", server.url + "/pile", "--splits", "val"]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "sha256" in err and "does not match" in err and "Traceback" not in err
    assert not (tmp_path / "pile" / "val.jsonl.zst").exists()
    assert not (tmp_path / "pile" / "val.jsonl.zst.part").exists()


def test_missing_file_on_mirror_exits_2(server, tmp_path, capsys):
    rc = pile_dl.main(
        ["--data_dir", str(tmp_path), "--mirror", server.url + "/nothing", "--splits", "val"]
    )
    assert rc == 2
    assert "HTTP 404" in capsys.readouterr().err


def test_offline_exits_2_with_one_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{_unused_port()}"
    assert pile_dl.main(["--data_dir", str(tmp_path), "--mirror", url, "--splits", "val"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot reach 127.0.0.1") and "\n" not in err


def test_no_data_dir_is_an_error(monkeypatch, capsys):
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    assert pile_dl.main(["--splits", "val"]) == 2
    assert "TFDS_DATA_DIR" in capsys.readouterr().err


def test_lambada_download(server, tmp_path, capsys):
    lines = [json.dumps({"text": f"passage number {i} ends with word"}) for i in range(12)]
    server.files["/lambada_test.jsonl"] = ("\n".join(lines) + "\n").encode()
    assert (
        lambada_dl.main(["--data_dir", str(tmp_path), "--url", server.url + "/lambada_test.jsonl"])
        == 0
    )
    dest = tmp_path / "lambada" / "lambada_test.jsonl"
    assert dest.read_text().splitlines() == lines
    assert "12 passages" in capsys.readouterr().out


def test_lambada_download_rejects_non_lambada_file(server, tmp_path, capsys):
    server.files["/x.jsonl"] = b"<html>not found</html>\n"
    assert lambada_dl.main(["--data_dir", str(tmp_path), "--url", server.url + "/x.jsonl"]) == 2
    assert not (tmp_path / "lambada" / "lambada_test.jsonl").exists()
    assert "line 1" in capsys.readouterr().err


@pytest.mark.process
def test_lambada_script_offline_no_traceback(tmp_path):
    # As a real process: the sibling import works and the user sees one line.
    url = f"http://127.0.0.1:{_unused_port()}/lambada_test.jsonl"
    proc = run_python(
        str(REPO_ROOT / "scripts_gpu" / "download_lambada.py"),
        "--data_dir",
        str(tmp_path),
        "--url",
        url,
        env=session_env(PYTHONPATH=""),
        cwd=None,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot reach") and "Traceback" not in proc.stderr

"""Downloads against a local HTTP server on 127.0.0.1: success, a checksum mismatch, a dropped
connection, mirror fallback, and a whole dataset fetched into an empty data directory."""
import gzip
import http.server
import io
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nprnn.data import datasets, sources
from nprnn.data.sources import DataUnavailable, DownloadError, download_file, fetch

import fake_data as fd

GOOD = bytes(range(256)) * 40                   # 10 KiB


class Handler(http.server.BaseHTTPRequestHandler):
    files = {}                                  # URL path -> bytes served

    def do_GET(self):
        if self.path == "/drop":                # announces 10 KiB, sends 1 KiB, hangs up
            self.send_response(200)
            self.send_header("Content-Length", str(len(GOOD)))
            self.end_headers()
            self.wfile.write(GOOD[:1024])
            self.wfile.flush()
            self.close_connection = True
            return
        data = self.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):              # keep the test output clean
        pass


@pytest.fixture
def server():
    """http://127.0.0.1:<random port>/ serving Handler.files, in a thread."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    Handler.files = {"/good.bin": GOOD}
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def leftovers(directory):
    return sorted(p.name for p in Path(directory).iterdir()) if Path(directory).exists() else []


def test_fetch_success_with_progress(server, tmp_path, capsys):
    dest = fetch(server + "good.bin", tmp_path / "good.bin", fd.md5(GOOD), progress=True)
    assert dest.read_bytes() == GOOD and leftovers(tmp_path) == ["good.bin"]
    err = capsys.readouterr().err
    assert "downloading good.bin (0.0 MB)" in err and "good.bin: done" in err


def test_progress_bar_redraws_in_place_on_a_terminal():
    from nprnn.util.progress import DownloadBar

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    out = Terminal()
    bar = DownloadBar("mnist.gz", total=2_000_000, stream=out)
    bar.update(500_000)
    bar.close(2_000_000, ok=True)
    text = out.getvalue()
    assert "\r" in text and "mnist.gz" in text and "2.00M" in text
    assert text.endswith("mnist.gz: done, 2.0 MB\n")
    assert not text.startswith("downloading")        # the two-line form is for files and pipes


def test_fetch_checksum_mismatch_leaves_nothing(server, tmp_path):
    with pytest.raises(DownloadError, match="published MD5 is 0+; the file was discarded"):
        fetch(server + "good.bin", tmp_path / "good.bin", "0" * 32, progress=False)
    assert leftovers(tmp_path) == []


def test_fetch_dropped_connection_leaves_nothing(server, tmp_path):
    with pytest.raises(DownloadError, match="IncompleteRead|closed after"):
        fetch(server + "drop", tmp_path / "drop.bin", fd.md5(GOOD), progress=False)
    assert leftovers(tmp_path) == []


def test_a_download_killed_outright_is_cleaned_up_by_the_next(server, tmp_path):
    # SIGKILL gives fetch no chance to delete its temporary file: the next download does
    code = ("import os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            "from nprnn.data.sources import temporary_name; "
            "temporary_name(Path(sys.argv[2]) / 'good.bin', 'part').write_bytes(b'half'); "
            "os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code, str(fd.REPO), str(tmp_path)])
    assert proc.returncode == -9
    live = sources.temporary_name(tmp_path / "other.bin", "part")   # this process: in progress
    live.write_bytes(b"half")
    assert len(leftovers(tmp_path)) == 2
    fetch(server + "good.bin", tmp_path / "good.bin", fd.md5(GOOD), progress=False)
    assert leftovers(tmp_path) == sorted(["good.bin", live.name])


def test_fetch_http_error_and_refused_connection(server, tmp_path):
    with pytest.raises(DownloadError, match="404"):
        fetch(server + "nothing-here", tmp_path / "x", fd.md5(GOOD), progress=False)
    closed = "http://127.0.0.1:9/x"             # the discard port: nothing listens there
    with pytest.raises(DownloadError, match="127.0.0.1:9"):
        fetch(closed, tmp_path / "x", fd.md5(GOOD), progress=False, timeout=5)
    assert leftovers(tmp_path) == []


def test_download_falls_back_to_the_mirror(server, tmp_path):
    remote = sources.RemoteFile("good.bin", fd.md5(GOOD),
                                (server + "drop", server + "missing", server + "good.bin"))
    assert download_file(remote, tmp_path, progress=False).read_bytes() == GOOD
    remote = sources.RemoteFile("good.bin", fd.md5(GOOD), (server + "drop", server + "missing"))
    with pytest.raises(DownloadError) as e:
        download_file(remote, tmp_path / "other" / "deeper", progress=False)
    assert "/drop" in str(e.value) and "/missing" in str(e.value) and "404" in str(e.value)
    assert not (tmp_path / "other").exists()           # the folders it made are gone again


def test_get_task_downloads_mnist_into_an_empty_data_dir(server, tmp_path, monkeypatch):
    arrays = fd.fake_mnist_arrays()
    for name in fd.MNIST_NAMES.values():         # what write_fake_mnist would write, served
        role = next(r for r, n in fd.MNIST_NAMES.items() if n == name)
        Handler.files["/mirror/" + name] = gzip.compress(fd.idx_bytes(arrays[role]), mtime=0)
    src = fd.fake_idx_source(tmp_path, urls=[server + "canonical/", server + "mirror/"])
    monkeypatch.setitem(sources.SOURCES, "mnist", src)
    task = datasets.get_task("mnist", data_dir=tmp_path, progress=False)
    assert task.size("train") == 60 and task.size("test") == 20
    assert leftovers(tmp_path / "mnist") == sorted(fd.MNIST_NAMES.values())
    assert task.info()["raw_files"][0]["check"] == "published MD5"


def test_offline_get_task_says_what_to_place(tmp_path, monkeypatch):
    src = fd.fake_idx_source(tmp_path, urls=["http://127.0.0.1:9/"])
    monkeypatch.setitem(sources.SOURCES, "mnist", src)
    with pytest.raises(DataUnavailable) as e:
        datasets.get_task("pmnist", data_dir=tmp_path / "mistyped", progress=False)
    msg = str(e.value)
    assert "the download failed" in msg and "127.0.0.1:9" in msg
    assert all(name in msg for name in fd.MNIST_NAMES.values())
    assert "--task mnist-sample" in msg
    assert not (tmp_path / "mistyped").exists()        # no folders left of a mistyped data_dir

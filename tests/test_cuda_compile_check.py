"""scripts/cuda_compile_check.py, CI's compile-only check of the series' CUDA sources, in the parts that
need neither nvcc nor the network: which files it compiles (from the patches), the zip reader that
fetches cuBLAS's headers out of a wheel with HTTP Range requests (against a local server), the
header cache, and what it says when it cannot go on."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import socket
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "cuda_compile_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_compile_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


cc = _load()


# --- the files, from the patches ----------------------------------------------------------------

def _patch(*paths: str, deleted: tuple[str, ...] = (), new: tuple[str, ...] = ()) -> str:
    out = ["From 0000 Mon Sep 17 00:00:00 2001", "Subject: [PATCH] x", "", "---"]
    for p in paths:
        out.append(f"diff --git a/{p} b/{p}")
        if p in deleted:
            out += ["deleted file mode 100644", f"--- a/{p}", "+++ /dev/null", "@@ -1 +0,0 @@", "-x"]
        elif p in new:
            out += ["new file mode 100644", "--- /dev/null", f"+++ b/{p}", "@@ -0,0 +1 @@", "+x"]
        else:
            out += [f"--- a/{p}", f"+++ b/{p}", "@@ -1 +1 @@", "-x", "+y",
                    # a line of a hunk that looks like a header must not count
                    " diff --git a/ggml/src/ggml-cuda/fake.cu b/ggml/src/ggml-cuda/fake.cu"]
    return "\n".join(out) + "\n"


def test_files_are_the_series_cuda_sources_and_the_dispatch(tmp_path: Path) -> None:
    cu = "ggml/src/ggml-cuda/"
    (tmp_path / "0001-a.patch").write_text(_patch("src/llama.cpp", cu + "argmax.cu", cu + "gone.cu"))
    (tmp_path / "0002-b.patch").write_text(
        _patch(cu + "small.cu", cu + "small.cuh", "ggml/src/ggml-cpu/ops.cpp", new=(cu + "small.cu", cu + "small.cuh")))
    (tmp_path / "0003-c.patch").write_text(_patch(cu + "gone.cu", deleted=(cu + "gone.cu",)))
    (tmp_path / "notes.txt").write_text(_patch(cu + "notapatch.cu"))
    assert cc.files_to_compile(tmp_path) == [cu + "argmax.cu", cu + "ggml-cuda.cu", cu + "small.cu"]
    assert cc.changed_headers(tmp_path) == [cu + "small.cuh"]


def test_no_header_no_dispatch(tmp_path: Path) -> None:
    (tmp_path / "0001-a.patch").write_text(_patch("ggml/src/ggml-cuda/argmax.cu"))
    assert cc.files_to_compile(tmp_path) == ["ggml/src/ggml-cuda/argmax.cu"]


def test_no_patches_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(cc.CheckError, match="no patches"):
        cc.files_to_compile(tmp_path)


def test_one_instance_for_a_changed_header_that_instances_instantiate(tmp_path: Path) -> None:
    d = tmp_path / "ggml/src/ggml-cuda"
    (d / "template-instances").mkdir(parents=True)
    (d / "common.cuh").write_text("#pragma once\n")
    (d / "mmq-config-x.cuh").write_text('#include "common.cuh"\n')
    (d / "mmq.cuh").write_text('#include "common.cuh"\n#include "mmq-config-x.cuh"\n')
    (d / "fattn.cuh").write_text('#include "common.cuh"\n')
    (d / "other.cuh").write_text('#include "common.cuh"\n')
    for name, header in (("fattn-instance-a.cu", "fattn.cuh"), ("mmq-instance-b.cu", "mmq.cuh"),
                         ("mmq-instance-a.cu", "mmq.cuh")):
        (d / "template-instances" / name).write_text(f'#include "../{header}"\nDECL();\n')
    headers = [f"ggml/src/ggml-cuda/{h}" for h in ("common.cuh", "mmq-config-x.cuh", "mmq.cuh", "other.cuh")]
    assert cc.instances_for(tmp_path, headers) == {
        "ggml/src/ggml-cuda/template-instances/mmq-instance-a.cu": "mmq-config-x.cuh, mmq.cuh"}


# --- a local HTTP server that answers Range requests --------------------------------------------

class _Server:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.sent = 0  # body bytes
        self.ranges: list[str] = []
        self.honour_range = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                spec = self.headers.get("Range")
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", spec or "")
                if not server.honour_range or not m:
                    self._send(200, data, {})
                    return
                server.ranges.append(spec or "")
                size = len(data)
                if m.group(1):
                    start, end = int(m.group(1)), min(size - 1, int(m.group(2)) if m.group(2) else size - 1)
                else:
                    start, end = max(0, size - int(m.group(2))), size - 1
                self._send(206, data[start:end + 1], {"Content-Range": f"bytes {start}-{end}/{size}"})

            def _send(self, code: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(code)
                for k, v in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                # Counted before the write: the client may have the body, and the test may read
                # `sent`, before this thread runs another line after it.
                server.sent += len(body)
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


HEADERS = {"cublas_v2.h": b'#include "cublas_api.h"\n' * 50, "cublas_api.h": b"/* api */\n" * 3000,
           "cublasLt.h": b"/* lt */\n" * 500}


def _wheel(big: int = 3_000_000) -> bytes:
    """A wheel-like zip: a few headers under nvidia/cu13/include/ among a large library, stored
    (incompressible) so that fetching the zip whole would show."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("nvidia/__init__.py", b"")
        zf.writestr("nvidia/cu13/lib/libcublasLt.so.13", os.urandom(big), compress_type=zipfile.ZIP_STORED)
        for name, data in HEADERS.items():
            zf.writestr(f"nvidia/cu13/include/{name}", data, compress_type=zipfile.ZIP_DEFLATED)
        zf.writestr("nvidia/cu13/include/", b"")  # a directory entry
        zf.writestr("nvidia/cu13/lib/libcublas.so.13", os.urandom(big), compress_type=zipfile.ZIP_STORED)
        zf.writestr("nvidia_cublas-13.0.2.14.dist-info/RECORD", b"x" * 1000)
    return buf.getvalue()


def test_range_reader_fetches_only_the_directory_and_the_headers(server: _Server, tmp_path: Path) -> None:
    wheel = _wheel()
    server.files["/w.whl"] = wheel
    reader = cc.RangeReader(server.url + "/w.whl", block=16 * 1024)
    assert reader.size == len(wheel)
    members = cc.extract_include_dir(reader, tmp_path / "include")
    assert sorted(members) == sorted(f"nvidia/cu13/include/{n}" for n in HEADERS)
    assert {p.name: p.read_bytes() for p in (tmp_path / "include").iterdir()} == HEADERS
    assert reader.fetched == server.sent
    assert reader.fetched < 100_000 < len(wheel), (reader.fetched, len(wheel))
    assert all(r.startswith("bytes=") for r in server.ranges) and reader.requests == len(server.ranges)


def test_range_reader_reads_like_a_file(server: _Server) -> None:
    data = bytes(range(256)) * 1000
    server.files["/f"] = data
    r = cc.RangeReader(server.url + "/f", block=1000)
    assert r.read(10) == data[:10]
    r.seek(-5, io.SEEK_END)
    assert r.read() == data[-5:]
    assert r.read(3) == b""
    r.seek(100_000)
    assert r.read(5000) == data[100_000:105_000]  # more than a block
    r.seek(10, io.SEEK_CUR)
    assert r.tell() == 105_010 and r.read(1) == data[105_010:105_011]


def test_a_server_that_ignores_range_is_refused_not_downloaded(server: _Server) -> None:
    server.files["/w.whl"] = b"x" * 1_000_000
    server.honour_range = False
    with pytest.raises(cc.RangeError, match="200"):
        cc.RangeReader(server.url + "/w.whl")


# --- the headers: from PyPI's JSON and the wheel, then from the cache ----------------------------

def _index() -> dict[str, object]:
    def wheel(version: str, tag: str = "manylinux_2_27_x86_64") -> dict[str, object]:
        return {"filename": f"nvidia_cublas-{version}-py3-none-{tag}.whl", "url": f"../../files/{version}.whl"}
    return {"info": {"version": "13.1.0.3"}, "releases": {
        "12.9.1.4": [wheel("12.9.1.4")],
        "13.0.0.19": [wheel("13.0.0.19")],
        "13.0.2.14": [wheel("13.0.2.14", "win_amd64"), wheel("13.0.2.14")],
        "13.0.9.1rc1": [wheel("13.0.9.1rc1")],
        "13.1.0.3": [wheel("13.1.0.3", "manylinux2014_aarch64"), wheel("13.1.0.3")],
        "13.2.0.1": [wheel("13.2.0.1", "win_amd64")],
    }}


def test_choose_wheel_takes_the_newest_of_nvcc_s_cuda() -> None:
    index = _index()
    base = "https://pypi.example/pypi/nvidia-cublas/json"
    name, url = cc.choose_wheel(index, (13, 0), base)
    assert name == "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl"
    assert url == "https://pypi.example/files/13.0.2.14.whl"  # relative to the index
    assert cc.choose_wheel(index, (13, 3), base)[0].startswith("nvidia_cublas-13.1.0.3-")  # no 13.3: the newest 13
    with pytest.raises(cc.CheckError, match="CUDA 14"):
        cc.choose_wheel(index, (14, 0), base)


def test_headers_are_fetched_once_then_cached(server: _Server, tmp_path: Path) -> None:
    wheel = _wheel()
    server.files["/pypi/nvidia-cublas/json"] = json.dumps(_index()).encode()
    server.files["/files/13.0.2.14.whl"] = wheel
    cache = tmp_path / "cache"
    got = cc.cublas_headers(cache, (13, 0), search=[tmp_path / "no-toolkit"],
                            index_url=server.url + "/pypi/nvidia-cublas/json")
    assert got.include == cache / "include" and (got.include / "cublas_v2.h").read_bytes() == HEADERS["cublas_v2.h"]
    assert 0 < got.downloaded < len(wheel) // 10
    marker = json.loads((cache / cc.MARKER).read_text())
    assert marker["wheel"] == "nvidia_cublas-13.0.2.14-py3-none-manylinux_2_27_x86_64.whl"
    assert not [p for p in cache.iterdir() if p.name.startswith(".fetch-")]
    server.close()  # from now on, no network
    again = cc.cublas_headers(cache, (13, 0), index_url=server.url + "/pypi/nvidia-cublas/json")
    assert again.include == got.include and again.downloaded == 0 and "cache" in again.source


def test_a_toolkit_s_own_header_is_used_first(tmp_path: Path) -> None:
    (tmp_path / "cuda-include").mkdir()
    (tmp_path / "cuda-include" / "cublas_v2.h").write_text("")
    got = cc.cublas_headers(tmp_path / "cache", (13, 0), search=[tmp_path / "none", tmp_path / "cuda-include"],
                            index_url="http://127.0.0.1:9/unused")
    assert got.include == tmp_path / "cuda-include" and not (tmp_path / "cache").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_network_and_no_cache_says_what_to_do(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(cc.CheckError) as e:
        cc.cublas_headers(cache, (13, 0), search=[], index_url=f"http://127.0.0.1:{_closed_port()}/json")
    msg = str(e.value)
    assert "cublas_v2.h" in msg and str(cache) in msg and "What to do" in msg and "--cublas-include" in msg


def test_main_without_nvcc(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cc, "find_nvcc", lambda: None)
    assert cc.main(["--skip-without-nvcc"]) == 0
    assert "skipped: no nvcc" in capsys.readouterr().out
    assert cc.main([]) == 2
    assert "no nvcc" in capsys.readouterr().err


def test_main_refuses_an_unpatched_tree(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cc, "find_nvcc", lambda: "/nonexistent/nvcc")
    (tmp_path / "patches").mkdir()
    new = "ggml/src/ggml-cuda/new.cu"
    (tmp_path / "patches" / "0001-a.patch").write_text(_patch(new, new=(new,)))
    (tmp_path / "tree" / "ggml/src/ggml-cuda").mkdir(parents=True)
    assert cc.main(["--tree", str(tmp_path / "tree"), "--patches", str(tmp_path / "patches")]) == 2
    err = capsys.readouterr().err
    assert "new.cu" in err and "series applied" in err
    assert cc.main(["--tree", str(tmp_path / "none"), "--patches", str(tmp_path / "patches")]) == 2
    assert "no llama.cpp tree" in capsys.readouterr().err


# --- one nvcc run a file, a run per architecture when it fails -----------------------------------

def _fake_nvcc(tmp_path: Path, fails_when: str = "False") -> str:
    """An nvcc that records its command line (`args`) and fails when the expression `fails_when`
    over it holds."""
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!{sys.executable}\nimport sys\nargs = ' '.join(sys.argv)\n"
                    f"open({str(tmp_path / 'calls')!r}, 'a').write(args + '\\n')\n"
                    f"sys.exit(1 if {fails_when} else 0)\n")
    nvcc.chmod(0o755)
    return str(nvcc)


def test_a_file_compiles_for_every_arch_in_one_run(tmp_path: Path) -> None:
    [r] = cc.compile_file(_fake_nvcc(tmp_path), tmp_path, "a.cu", ["86", "90"], [])
    assert r.rc == 0 and r.arches == ("86", "90")
    [call] = (tmp_path / "calls").read_text().splitlines()
    assert "arch=compute_86,code=sm_86" in call and "arch=compute_90,code=sm_90" in call


def test_a_failing_file_is_compiled_again_per_arch_to_name_the_failing_one(tmp_path: Path) -> None:
    results = cc.compile_file(_fake_nvcc(tmp_path, "'code=sm_90' in args"), tmp_path, "a.cu", ["86", "90"], [])
    assert [(r.arches, r.rc) for r in results] == [(("86",), 0), (("90",), 1)]
    assert len((tmp_path / "calls").read_text().splitlines()) == 3


def test_a_failure_of_the_run_for_every_arch_alone_still_fails(tmp_path: Path) -> None:
    nvcc = _fake_nvcc(tmp_path, "'code=sm_86' in args and 'code=sm_90' in args")
    results = cc.compile_file(nvcc, tmp_path, "a.cu", ["86", "90"], [])
    assert [(r.arches, r.rc) for r in results] == [(("86", "90"), 1), (("86",), 0), (("90",), 0)]

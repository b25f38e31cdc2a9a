"""RPC workers without running one: `--rpc` parsing, the address rules of `buun worker start`, where
the drafter goes, the reachability probe and its messages, and the command llama-server gets.
The real workers are in tests/test_worker.py and tests/test_rpc_serve.py."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import pytest

from buun_tool.base.errors import NotReadyError, UsageError
from buun_tool.server import addresses, rpc, worker
from buun_tool.server.addresses import Endpoint
from buun_tool.server.process import free_port
from buun_tool.server.rpc import Device
from tests.support.fixtures_server import run_buun as buun


def flat(text: str) -> str:
    return " ".join(text.split())


class TestEndpoints:
    def test_parse_in_order(self) -> None:
        assert addresses.parse("10.0.0.5:50052, worker-2:50053") == [Endpoint("10.0.0.5", 50052),
                                                                     Endpoint("worker-2", 50053)]
        assert addresses.join(addresses.parse("a:1,b:2")) == "a:1,b:2"

    @pytest.mark.parametrize("text", ["10.0.0.5", "10.0.0.5:", ":50052", "host:port", "a:0", "a:70000",
                                      "[::1]:50052", "::1:50052", "a:1,,b:2"])
    def test_bad_ones_say_what_is_expected(self, text: str) -> None:
        with pytest.raises(UsageError, match="--rpc") as e:
            addresses.parse(text)
        assert "HOST:PORT" in (e.value.hint or "")

    def test_a_worker_named_twice(self) -> None:
        with pytest.raises(UsageError, match="names 127.0.0.1:1 twice"):
            addresses.parse("127.0.0.1:1,127.0.0.1:1")

    @pytest.mark.parametrize(("text", "said"), [("a:1,A:1", "names a:1 twice (again as A:1)"),
                                                ("Worker-2:50052, b:2, worker-2:050052",
                                                 "names Worker-2:50052 twice (again as worker-2:50052)"),
                                                ("127.0.0.1:1,127.1:1", "names 127.0.0.1:1 twice (again as 127.1:1)"),
                                                ("0x7f.0.0.1:1,127.0.0.1:1", "names 0x7f.0.0.1:1 twice")])
    def test_a_worker_spelt_twice(self, text: str, said: str) -> None:
        """A host in another case, an address in another form: the same worker, which llama-server
        would connect to twice (it dropped only an exact repeat)."""
        with pytest.raises(UsageError) as e:
            addresses.parse(text)
        assert said in e.value.message and e.value.hint == "name each worker once"
        assert addresses.parse("a:1,a:2,b:1") == [Endpoint("a", 1), Endpoint("a", 2), Endpoint("b", 1)]


class TestBindRules:
    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "10.0.0.5", "172.16.3.4", "192.168.1.20",
                                      "169.254.10.1"])
    def test_loopback_private_and_link_local_need_no_reason(self, host: str) -> None:
        assert worker.check_bind(host, None) is None

    @pytest.mark.parametrize(("host", "what"), [("0.0.0.0", "every address of this machine"),
                                                ("8.8.8.8", "a public address"), ("100.64.1.1", "a public address")])
    def test_wildcard_and_public_are_refused_without_a_reason(self, host: str, what: str) -> None:
        with pytest.raises(UsageError) as e:
            worker.check_bind(host, None)
        assert what in e.value.message and "no authentication" in e.value.message
        assert "SSH tunnel" in (e.value.hint or "") and '--allow-public "REASON"' in (e.value.hint or "")

    def test_a_reason_lets_it_bind_and_is_kept(self) -> None:
        assert worker.check_bind("0.0.0.0", "  lab LAN behind the firewall ") == "lab LAN behind the firewall"

    @pytest.mark.parametrize("reason", ["", "   "])
    def test_an_empty_reason_is_no_reason(self, reason: str) -> None:
        with pytest.raises(UsageError, match="needs a reason"):
            worker.check_bind("0.0.0.0", reason)

    @pytest.mark.parametrize("host", ["localhost", "::1", "worker.lan", "10.0.0"])
    def test_only_ipv4_addresses(self, host: str) -> None:
        with pytest.raises(UsageError, match="not an IPv4 address"):
            worker.check_bind(host, None)

    def test_the_spec_keeps_the_reason_and_names_the_worker_by_its_port(self, fake_rpc_bin: Path) -> None:
        spec = worker.resolve("0.0.0.0", 50099, allow_public="lab", threads=4, devices="CUDA0,CUDA1", cache=True)
        assert (spec.name, spec.allow_public) == ("50099", "lab")
        assert spec.argv[1:] == ["-H", "0.0.0.0", "-p", "50099", "-t", "4", "-d", "CUDA0,CUDA1", "-c"]
        assert worker.WorkerSpec.from_json(spec.to_json()) == spec

    def test_the_cli_refuses_a_public_address(self, fake_rpc_bin: Path) -> None:
        r = buun("worker", "start", "--host", "8.8.8.8", "--port", str(free_port()))
        assert r.returncode == 2, r.stderr
        assert "8.8.8.8 is a public address" in flat(r.stderr) and "--allow-public" in flat(r.stderr)


@pytest.fixture
def fake_rpc_bin(fake_bin: Path) -> Path:
    """fake_bin's folder with a stand-in ggml-rpc-server too (only its path is used)."""
    (fake_bin / "ggml-rpc-server").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "ggml-rpc-server").chmod(0o755)
    return fake_bin


class TestPlacement:
    WORKERS = [Device("RPC0", "10.0.0.5:50052"), Device("RPC1", "10.0.0.6:50052")]

    def test_cpu_server_the_last_workers_device(self) -> None:
        p = rpc.place(self.WORKERS, [])
        assert p.draft_device == "RPC1" and "last worker" in p.why

    def test_a_local_gpu_comes_after_the_workers_and_takes_it(self) -> None:
        p = rpc.place([*self.WORKERS, Device("CUDA0", "local")], [])
        assert p.draft_device == "CUDA0" and "local GPU" in p.why

    def test_the_users_choice_stays(self) -> None:
        assert rpc.place(self.WORKERS, [("--device-draft", "RPC0")]).draft_device == "RPC0"
        assert rpc.place(self.WORKERS, [("-dev", "RPC1,RPC0")]).draft_device == "RPC0"

    def test_listed_local_first_used_workers_first(self, tmp_path: Path) -> None:
        """`--list-devices` (as a CUDA build with one worker printed it) lists CUDA0 first; the
        model uses RPC0 first, so CUDA0 holds the last layers and gets the drafter."""
        fake = tmp_path / "llama-server"
        fake.write_text("#!/bin/sh\necho 'Available devices:'\n"
                        "echo '  CUDA0: NVIDIA H100 80GB HBM3 (81079 MiB, 80552 MiB free)'\n"
                        "echo '  RPC0: 127.0.0.1:50052 (128887 MiB, 128887 MiB free)'\n")
        fake.chmod(0o755)
        devices = rpc.list_devices(str(fake), addresses.parse("127.0.0.1:50052"))
        assert devices == [Device("RPC0", "127.0.0.1:50052"), Device("CUDA0", "local")]
        assert rpc.place(devices, []).draft_device == "CUDA0"

    def test_print_cmd_takes_one_device_per_worker(self) -> None:
        assert [d.name for d in rpc.assumed_devices(addresses.parse("a:1,b:2,c:3"))] == ["RPC0", "RPC1", "RPC2"]
        assert [d.name for d in rpc.assumed_devices(addresses.parse("a:1"), 1)] == ["RPC0", "CUDA0"]


class TestReachable:
    def test_a_listening_port_answers_and_a_closed_one_does_not(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            assert rpc.probe(Endpoint("127.0.0.1", s.getsockname()[1])) is None
        assert rpc.probe(Endpoint("127.0.0.1", free_port())) == "nothing listens there"
        assert "not known" in (rpc.probe(Endpoint("no-such-host.invalid", 1)) or "")

    def test_two_names_of_one_address_are_one_worker(self) -> None:
        """localhost and 127.0.0.1 (as a launch resolves them) before any probe."""
        port = free_port()
        with pytest.raises(UsageError) as e:
            rpc.check_reachable(addresses.parse(f"localhost:{port},127.0.0.1:{port}"))
        assert f"localhost:{port} and 127.0.0.1:{port} are one worker (127.0.0.1:{port})" in e.value.message
        with pytest.raises(NotReadyError):  # other ports: two workers, neither there
            rpc.check_reachable(addresses.parse(f"localhost:{port},127.0.0.1:{free_port()}"))

    def test_the_error_names_each_worker_and_the_next_step(self) -> None:
        port = free_port()
        with pytest.raises(NotReadyError) as e:
            rpc.check_reachable([Endpoint("127.0.0.1", port)])
        assert f"worker 127.0.0.1:{port} is not reachable (nothing listens there)" in e.value.message
        hint = e.value.hint or ""
        assert f"buun worker start --port {port}" in hint and f"ssh -N -L {port}:127.0.0.1:{port}" in hint
        step = addresses.next_step("10.0.0.5:50052")
        assert "buun worker start --port 50052 --host 10.0.0.5` on that machine" in step


class TestDiagnosis:
    def test_a_worker_that_does_not_answer_or_speaks_another_version(self) -> None:
        from buun_tool.server import loglines

        f = loglines.diagnose(["/src/ggml/src/ggml-rpc/ggml-rpc.cpp:547: Failed to connect to 10.0.0.5:50052"])
        assert f and f.message == "llama-server could not connect to the worker 10.0.0.5:50052"
        assert "buun worker start --port 50052 --host 10.0.0.5" in (f.hint or "")
        f = loglines.diagnose(["E RPC server version mismatch: 6.0.0",
                               "/src/ggml-rpc.cpp:550: RPC handshake failed for 10.0.0.5:50052"])
        assert f and "the worker 10.0.0.5:50052 speak different RPC protocol versions (its RPC protocol is 6.0.0)" \
            in f.message and "`buun build` there" in (f.hint or "")


class TestCommand:
    def test_workers_come_first_and_the_drafter_goes_last(self, fake_bin: Path, tiny_files: tuple[Path, Path],
                                                           no_cards: None) -> None:
        target, draft = tiny_files
        r = buun("serve", "--print-cmd", "--model", str(target), "--draft", str(draft),
                 "--rpc", "10.0.0.5:50052,10.0.0.6:50052")
        assert r.returncode == 0, r.stderr
        argv = r.stdout.split()
        assert argv[5:7] == ["--rpc", "10.0.0.5:50052,10.0.0.6:50052"]  # before any device name is read
        assert argv[argv.index("-devd") + 1] == "RPC1"
        r = buun("serve", "--print-cmd", "--model", str(target), "--draft", str(draft), "--rpc", "10.0.0.5:50052",
                 "--", "-devd", "CUDA0")
        assert r.returncode == 0 and r.stdout.split().count("-devd") == 1 and "-devd CUDA0" in r.stdout
        assert "-devd CUDA0: the drafter shares the target's output matrix, which is on RPC0" in flat(r.stderr)

    def test_one_card_with_workers_several_refused(self, two_cards: Path, tiny_files: tuple[Path, Path]) -> None:
        target, draft = tiny_files
        args = ("serve", "--print-cmd", "--model", str(target), "--draft", str(draft), "--rpc", "10.0.0.5:50052")
        r = buun(*args, "--gpus", "1")
        assert r.returncode == 0 and "-devd CUDA0" in r.stdout, r.stderr  # the local card holds the last layers
        r = buun(*args, "--gpus", "0,1")
        assert r.returncode == 2 and "--rpc with several cards (0,1)" in flat(r.stderr)

    def test_rpc_is_buuns_own(self, fake_bin: Path, tiny_files: tuple[Path, Path]) -> None:
        target, draft = tiny_files
        r = buun("serve", "--print-cmd", "--model", str(target), "--draft", str(draft), "--", "--rpc", "a:1")
        assert r.returncode == 2 and "use `buun serve --rpc ...` instead" in flat(r.stderr)

    def test_an_unreachable_worker_stops_the_launch(self, fake_bin: Path, tiny_files: tuple[Path, Path]) -> None:
        target, draft = tiny_files
        port = free_port()
        r = buun("start", "--model", str(target), "--draft", str(draft), "--rpc", f"127.0.0.1:{port}")
        assert r.returncode == 3, r.stderr
        assert f"worker 127.0.0.1:{port} is not reachable" in flat(r.stderr)
        assert f"buun worker start --port {port}" in flat(r.stderr)

    def test_a_worker_address_that_speaks_something_else(self, llama_bin: Path, tiny_files: tuple[Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
        """Another program on the worker's port (a web server): the real llama-server aborts in
        ggml-rpc, and the error was the last lines of gdb's backtrace ("wait4.c: No such file")."""
        import threading

        monkeypatch.setenv("BUUN_LLAMA_BIN_DIR", str(llama_bin))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]

            def answer() -> None:
                with contextlib.suppress(OSError):
                    while True:
                        c, _ = s.accept()
                        with c:
                            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

            threading.Thread(target=answer, daemon=True).start()
            target, draft = tiny_files
            r = buun("start", "--model", str(target), "--draft", str(draft), "--rpc", f"127.0.0.1:{port}")
        assert r.returncode == 3, r.stderr
        text = flat(r.stderr)
        assert f"answers, but not as ggml-rpc-server does (another program on its port, or a worker that crashed) " \
            f"(--rpc 127.0.0.1:{port})" in text and "`buun worker status`" in text
        assert "wait4" not in text and "Traceback" not in text

    def test_a_program_that_is_no_worker_is_named_when_listing_times_out(self, llama_bin: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
        """`--rpc` at a web server: it reads llama-server's hello as the start of a request and waits
        for the rest, so listing the devices timed out, and the error said "a worker serves one
        llama-server at a time: stop the other server using it". The program took the connection:
        it is named as one that is no worker. A port whose connections wait unread, as in a busy
        worker's queue, keeps the busy worker's message."""
        from tests.support import fake_remote_server

        monkeypatch.setattr(rpc, "LIST_TIMEOUT", 3.0)
        binary = str(llama_bin / "llama-server")
        with fake_remote_server.serve(fake_remote_server.good()) as url:
            web = url.removeprefix("http://")
            with pytest.raises(NotReadyError) as e:
                rpc.list_devices(binary, addresses.parse(web))
        assert f"{web} answers, but not as ggml-rpc-server does" in e.value.message, e.value.message
        assert "another program holds the port" in (e.value.hint or "") and "at a time" not in (e.value.hint or "")
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen(1)  # never accepts: what waits is queued, as at a worker serving another server
            with pytest.raises(NotReadyError) as e:
                rpc.list_devices(binary, addresses.parse(f"127.0.0.1:{busy.getsockname()[1]}"))
        assert "could not list the devices" in e.value.message and "one llama-server at a time" in (e.value.hint or "")

    def test_bench_asks_the_workers_before_anything(self, fake_bin: Path, tmp_path: Path) -> None:
        port = free_port()
        out, models = tmp_path / "out", tmp_path / "models"
        r = buun("bench", "--rpc", f"127.0.0.1:{port}", "--out", str(out), "--models-dir", str(models))
        assert r.returncode == 3 and f"worker 127.0.0.1:{port} is not reachable" in flat(r.stderr), r.stderr
        assert not out.exists() and not models.exists(), "the bench made something before its workers answered"
        r = buun("bench", "--rpc", "10.0.0.5:50052", "--url", "http://127.0.0.1:1")
        assert r.returncode == 2 and "--rpc starts servers split over the workers" in flat(r.stderr)

    def test_bench_with_workers_several_cards_refused(self, two_cards: Path) -> None:
        r = buun("bench", "--rpc", "10.0.0.5:50052", "--gpus", "0,1")
        assert r.returncode == 2 and "--rpc with several cards (0,1)" in flat(r.stderr)


@pytest.fixture
def no_cards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvidia-smi that finds no card, whatever the machine has: --print-cmd then assumes none."""
    smi = tmp_path / "no-smi" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nexit 9\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture
def tiny_files(tmp_path: Path) -> tuple[Path, Path]:
    """Two files that stand for the models (--print-cmd and the checks before a launch only)."""
    files = (tmp_path / "t.gguf", tmp_path / "d.gguf")
    for f in files:
        f.write_bytes(b"GGUF")
    return files

"""`buun vendor`: the pinned tree from each source, verified, atomic, idempotent."""

from __future__ import annotations

import io
import os
import shutil
import stat
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.base.errors import BuunError, Exit
from buun_tool.cli.app import app
from buun_tool.pipeline import vendor
from tests.support.fake_llama_source import FakeProject, run

runner = CliRunner()


def test_git_source_gives_trimmed_baseline(fake_project: FakeProject) -> None:
    st = vendor.vendor()
    assert st.present and st.at_pin and st.commits_on_top == 0
    llama = fake_project.llama
    assert (llama / "common" / "arg.cpp").is_file()
    assert not (llama / "docs").exists()  # trimmed
    assert not (llama / "models" / "ggml-vocab-x.gguf").exists()
    assert os.stat(llama / "scripts" / "build.sh").st_mode & stat.S_IXUSR  # modes survive
    assert run("git", "-C", str(llama), "rev-parse", "buun-baseline^{tree}") == vendor.load_pin().tree


def test_git_source_keeps_dotfiles(fake_project: FakeProject) -> None:
    # `git archive` names top-level members without a folder (.clang-format, .github/...): their
    # leading dot is part of the name, or the tree never matches the pin's hash
    assert vendor.vendor(source="git").at_pin
    assert (fake_project.llama / ".clang-format").is_file()
    assert (fake_project.llama / ".github" / "workflows" / "build.yml").is_file()


def test_rerun_is_a_noop(fake_project: FakeProject) -> None:
    vendor.vendor()
    marker = fake_project.llama / "common" / "arg.cpp"
    before = marker.stat().st_ino
    vendor.vendor()
    assert marker.stat().st_ino == before  # the tree was not fetched again


def test_a_killed_runs_scratch_folder_is_cleared(fake_project: FakeProject) -> None:
    """`buun vendor` killed mid-fetch (SIGKILL, no cleanup) left its scratch folder, a whole
    llama.cpp tree, in vendor/ for good; a live run's stays, for it to finish."""
    import subprocess

    vendor.vendor()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = fake_project.root / "vendor" / f".llama.cpp.{gone.pid}.tmp"
    (dead / "llama.cpp" / "common").mkdir(parents=True)
    (dead / "llama.cpp" / "common" / "arg.cpp").write_text("int option_0")
    with subprocess.Popen(["sleep", "60"]) as sleeper:
        live = fake_project.root / "vendor" / f".llama.cpp.{sleeper.pid}.tmp"
        (live / "llama.cpp").mkdir(parents=True)
        try:
            vendor.vendor()  # at the pin already: nothing to fetch
        finally:
            sleeper.kill()
    assert not dead.exists() and live.is_dir()


def test_archive_source_and_roundtrip(fake_project: FakeProject, tmp_path) -> None:
    vendor.vendor(source="archive", archive=fake_project.archive)
    assert vendor.state().at_pin
    # the trimmed archive of the vendored tree restores the very same tree
    out = vendor.write_archive(tmp_path / "trimmed.tar.xz")
    vendor.vendor(source="archive", archive=out, force=True)
    assert vendor.state().at_pin


def test_falls_back_to_the_next_source(fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = vendor.load_pin()
    fake_project.write_pin(pin.tree, [{"kind": "git", "url": "file:///nonexistent/repo"}, {"kind": "archive"}])
    monkeypatch.setenv("BUUN_LLAMA_ARCHIVE", str(fake_project.archive))
    assert vendor.vendor().at_pin


def test_wrong_hash_is_rejected_and_keeps_the_good_tree(fake_project: FakeProject, tmp_path) -> None:
    vendor.vendor()
    good = (fake_project.llama / "common" / "arg.cpp").read_text()
    # an archive whose content differs from the pin
    bad_dir = tmp_path / "bad" / "llama.cpp"
    shutil.copytree(fake_project.upstream, bad_dir)
    (bad_dir / "common" / "arg.cpp").write_text("tampered\n")
    bad = tmp_path / "bad.tar.gz"
    run("tar", "czf", str(bad), "-C", str(tmp_path / "bad"), "--exclude=.git", "llama.cpp")
    with pytest.raises(BuunError, match="does not match the pinned"):
        vendor.vendor(source="archive", archive=bad, force=True)
    assert (fake_project.llama / "common" / "arg.cpp").read_text() == good
    assert vendor.state().at_pin
    assert not list((fake_project.root / "vendor").glob(".tmp-*"))  # no scratch left behind


def test_refuses_to_replace_work_in_progress(fake_project: FakeProject) -> None:
    vendor.vendor()
    edited = fake_project.llama / "common" / "arg.cpp"
    edited.write_text("my unexported work\n")
    pin = vendor.load_pin()
    fake_project.write_pin("0" * 40, pin.sources)  # the pin moved on (a bump)
    with pytest.raises(BuunError) as exc:
        vendor.vendor()
    assert exc.value.exit_code == Exit.CONFLICT and "buun patch export" in (exc.value.hint or "")
    assert edited.read_text() == "my unexported work\n"


def test_corrupted_sdist_in_cache_is_detected(fake_project: FakeProject, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path) -> None:
    pin = vendor.load_pin()
    fake_project.write_pin(pin.tree, [{"kind": "sdist", "package": "llama-cpp-python", "version": "0.3.36",
                                       "sha256": "a" * 64, "subdir": "vendor/llama.cpp"}])
    cached = tmp_path / "cache" / "sdist" / "llama_cpp_python-0.3.36.tar.gz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"half a download")
    # no index to download from: the corrupted file must still be thrown away, and nothing land
    monkeypatch.setenv("PIP_INDEX_URL", f"file://{tmp_path}/no-index")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    result = runner.invoke(app, ["vendor"])
    assert result.exit_code == Exit.NETWORK, result.output
    assert "wrong sha256" in result.output and "pip download" in result.output
    assert not cached.exists()
    assert not fake_project.llama.exists()


def test_cli_archive_option(fake_project: FakeProject, tmp_path) -> None:
    assert runner.invoke(app, ["vendor"]).exit_code == 0
    out = tmp_path / "llama-src.tar.xz"
    result = runner.invoke(app, ["vendor", "--archive", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and out.stat().st_size > 0


def _escaping_archive(path: Path, up: int) -> Path:
    """A `llama.cpp/` archive that writes `outside.txt` `up` folders above where it is unpacked,
    past the "data" filter of a Python before 3.11.13/3.12.11 (CVE-2025-4517): every link points
    inside by its text, but the real path of a/b/.../p is longer than PATH_MAX, so the filter's
    realpath() stops following links there and reads the rest of the path as text."""
    long_dir, steps, top = "d" * 247, "abcdefghijklmnop", "llama.cpp"
    with tarfile.open(path, "w") as tar:
        def add(name: str, kind: bytes, link: str = "", data: bytes = b"") -> None:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.type, info.linkname, info.size, info.mode = kind, link, len(data), 0o755
            tar.addfile(info, io.BytesIO(data))

        add("CMakeLists.txt", tarfile.REGTYPE, data=b"project(fake)\n")
        where = ""
        for step in steps:
            add(os.path.join(where, long_dir), tarfile.DIRTYPE)
            add(os.path.join(where, step), tarfile.SYMTYPE, long_dir)
            where = os.path.join(where, long_dir)
        back = os.path.join(*steps, "l" * 254)  # to the top, through the long folders
        add(back, tarfile.SYMTYPE, os.path.join(*[".."] * len(steps)))
        add("escape", tarfile.SYMTYPE, back + "/.." * up)
        add("escape/outside.txt", tarfile.REGTYPE, data=b"written outside\n")
    return path


def test_an_archive_with_links_is_refused_and_writes_nothing_outside(fake_project: FakeProject, tmp_path) -> None:
    """The pinned tree has no links (its hash would differ), so an archive's link is refused
    before anything is unpacked: tarfile's own filter cannot be relied on for them."""
    archive = _escaping_archive(tmp_path / "evil.tar", up=4)  # unpacked in checkout/vendor/.tmp-X/llama.cpp
    result = runner.invoke(app, ["vendor", "--from-archive", str(archive)])
    assert result.exit_code == Exit.NETWORK, result.output
    assert not (tmp_path / "outside.txt").exists()
    assert "llama.cpp/a is a symbolic link (to dddd" in result.output
    assert "the pinned llama.cpp tree has no links" in result.output
    assert not fake_project.llama.exists()


def test_an_archive_with_a_hard_link_is_refused(fake_project: FakeProject, tmp_path) -> None:
    archive = tmp_path / "hard.tar"
    with tarfile.open(archive, "w") as tar:
        for name, kind, link in (("llama.cpp/CMakeLists.txt", tarfile.REGTYPE, ""),
                                 ("llama.cpp/common/arg.cpp", tarfile.LNKTYPE, "llama.cpp/CMakeLists.txt")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            tar.addfile(info, io.BytesIO(b""))
    result = runner.invoke(app, ["vendor", "--from-archive", str(archive)])
    assert result.exit_code == Exit.NETWORK, result.output
    assert "llama.cpp/common/arg.cpp is a hard link (to llama.cpp/CMakeLists.txt)" in result.output


def test_an_archive_that_unpacks_to_more_than_any_llama_cpp_is_refused(fake_project: FakeProject, tmp_path) -> None:
    """A member's size is the archive's word: a sparse 3 GiB member takes a few KB of tar (so would
    a few MB of xz of zeros), and unpacked it kept `git add` hashing zeros."""
    top = tmp_path / "sparse" / "llama.cpp"
    top.mkdir(parents=True)
    (top / "CMakeLists.txt").write_text("project(fake)\n")
    with open(top / "big.bin", "wb") as f:
        f.truncate(3 * 2**30)
    archive = tmp_path / "sparse.tar"
    run("tar", "-S", "-cf", str(archive), "-C", str(top.parent), "llama.cpp")
    assert archive.stat().st_size < 2**20
    result = runner.invoke(app, ["vendor", "--from-archive", str(archive)])
    assert result.exit_code == Exit.NETWORK, result.output
    assert "the archive unpacks to more than 2 GiB (at llama.cpp/big.bin, 3221225472 bytes)" in result.output
    assert not fake_project.llama.exists()


def test_cli_refuses_a_source_or_archive_it_cannot_use(fake_project: FakeProject, tmp_path) -> None:
    """An archive that is not there was a source that failed: exit 4 with the offline machine's
    hint; at the pin, it and a misspelt --source were ignored without a word."""
    missing = tmp_path / "none.tar.xz"
    for args, message in ((["--from-archive", str(missing)], f"--from-archive {missing}: no such file"),
                          (["--from-archive", str(tmp_path)], f"--from-archive {tmp_path}: a folder"),
                          (["--source", "gti"], "unknown source 'gti'")):
        result = runner.invoke(app, ["vendor", *args])
        assert result.exit_code == Exit.USAGE and result.stderr.startswith(f"error: {message}"), result.output
        assert not fake_project.llama.exists()
    assert runner.invoke(app, ["vendor"]).exit_code == 0  # the tree at the pin: refused all the same
    for args in (["--from-archive", str(missing)], ["--source", "gti"]):
        assert runner.invoke(app, ["vendor", *args]).exit_code == Exit.USAGE

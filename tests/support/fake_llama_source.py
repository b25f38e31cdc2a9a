"""A small stand-in for the llama.cpp source tree: a throwaway buun checkout (BUUN_ROOT) with its
own pin.yaml whose sources are a local git repo and a local archive, so vendor and patch logic
run for real (git, tar, hashes) in a fraction of a second."""

from __future__ import annotations

import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

FILES = {
    "CMakeLists.txt": "project(fake)\n",
    ".clang-format": "BasedOnStyle: LLVM\n",  # upstream's dotfiles are part of the pinned tree
    ".github/workflows/build.yml": "on: push\n",
    "common/arg.cpp": "".join(f"int option_{i} = {i};\n" for i in range(40)),
    "common/speculative.cpp": "".join(f"// line {i}\n" for i in range(40)),
    "scripts/build.sh": "#!/bin/sh\necho build\n",
    "docs/guide.md": "trimmed away\n",
    "models/ggml-vocab-x.gguf": "trimmed away\n",
}
TRIM = ["docs/", "models/ggml-vocab-*"]


def run(*cmd: str, cwd: Path | None = None) -> str:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@dataclass
class FakeProject:
    root: Path
    upstream: Path  # a git repo standing in for github.com/ggml-org/llama.cpp
    archive: Path  # a tar.gz of the same tree, like a trimmed archive
    commit: str

    @property
    def llama(self) -> Path:
        return self.root / "vendor" / "llama.cpp"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    def write_pin(self, tree: str, sources: list[dict]) -> None:
        pin = {"commit": self.commit, "tree": tree, "sources": sources, "trim": TRIM}
        (self.root / "vendor" / "pin.yaml").write_text(yaml.safe_dump(pin))


def _write_tree(root: Path, files: dict[str, str]) -> None:
    """The files under root, scripts executable (as git records them)."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if rel.endswith(".sh"):
            p.chmod(0o755)


def _tree_hash_of(files: dict[str, str], tmp: Path) -> str:
    """The git tree hash of the trimmed tree, computed independently of buun's code."""
    d = tmp / "hash-tree"
    _write_tree(d, {rel: text for rel, text in files.items() if not rel.startswith(("docs/", "models/"))})
    run("git", "init", "-q", str(d))
    run("git", "add", "-A", cwd=d)
    return run("git", "write-tree", cwd=d)


@pytest.fixture
def fake_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeProject:
    upstream = tmp_path / "upstream"
    _write_tree(upstream, FILES)
    run("git", "init", "-q", str(upstream))
    run("git", "-C", str(upstream), "config", "uploadpack.allowAnySHA1InWant", "true")
    run("git", "-C", str(upstream), "add", "-A")
    run("git", "-C", str(upstream), "-c", "user.name=up", "-c", "user.email=up@x", "commit", "-q", "-m", "upstream")
    commit = run("git", "-C", str(upstream), "rev-parse", "HEAD")
    archive = tmp_path / "llama-src.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(upstream, arcname="llama.cpp",
                filter=lambda ti: None if ti.name == "llama.cpp/.git" or ti.name.startswith("llama.cpp/.git/") else ti)
    root = tmp_path / "checkout"
    (root / "vendor").mkdir(parents=True)
    (root / "patches").mkdir()
    project = FakeProject(root, upstream, archive, commit)
    project.write_pin(_tree_hash_of(FILES, tmp_path),
                      [{"kind": "git", "url": f"file://{upstream}"}, {"kind": "archive"}])
    monkeypatch.setenv("BUUN_ROOT", str(root))
    # the fake checkout's own tree, build and series, whatever the developer's shell points at
    for var in ("BUUN_LLAMA_DIR", "BUUN_BUILD_DIR", "BUUN_PATCHES_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BUUN_CACHE_DIR", str(tmp_path / "cache"))
    return project


def commit_change(repo: Path, rel: str, old: str, new: str, subject: str) -> None:
    """A developer's change in the vendored tree, committed (the patch-writing workflow)."""
    f = repo / rel
    f.write_text(f.read_text().replace(old, new, 1))
    run("git", "-C", str(repo), "add", "-A")
    run("git", "-C", str(repo), "-c", "user.name=dev", "-c", "user.email=dev@x", "commit", "-q", "-m", subject)


def hold_git_am(repo: Path, gate: Path) -> Path:
    """Each `git am` in `repo` waits after it commits its patch until `gate` exists (a minute at
    most, so that nothing waits forever after a failed test); returns the file that says one waits."""
    started = gate.with_name(gate.name + ".started")
    hook = repo / ".git" / "hooks" / "post-applypatch"
    hook.write_text(f"#!/bin/sh\ntouch '{started}'\ni=0\n"
                    f"while [ ! -e '{gate}' ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done\n")
    hook.chmod(0o755)
    return started


def wait_for_file(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"

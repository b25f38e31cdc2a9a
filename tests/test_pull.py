"""`buun pull` against a real HTTP server speaking the Hub protocol (tests/support/fake_hub.py), with
the real huggingface_hub client: errors, resume, disk check, verification, manifest, offline."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buun_tool.base import paths
from buun_tool.base.errors import BuunError, Exit
from buun_tool.cli.app import app
from buun_tool.formats import layout, recipes
from buun_tool.pipeline import pull
from tests.support.fake_hub import Cut, FakeHub
from tests.support.tiny_checkpoints import write_recipe

TARGET, DRAFTER, TOKENIZER = "unsloth/Qwen3.5-27B-GGUF", "z-lab/Qwen3.5-27B-DFlash", "Qwen/Qwen3.5-27B"
GGUF = "Qwen3.5-27B-tiny-Q8_0.gguf"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "config.json")


def _bytes(n: int, seed: int) -> bytes:
    """Incompressible, reproducible content."""
    out = bytearray()
    block = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:n])


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    """Small repos under the recipe's names: enough for every pull behaviour, fast."""
    fake_hub.add_repo(TARGET, {GGUF: _bytes(3_000_000, 1), "README.md": b"# target\n"})
    fake_hub.add_repo(DRAFTER, {"config.json": b'{"architectures": ["DFlashDraftModel"]}\n',
                                "model.safetensors": _bytes(2_000_000, 2)})
    fake_hub.add_repo(TOKENIZER, {name: f"{name} content\n".encode() for name in TOKENIZER_FILES}
                      | {"model-00001-of-00011.safetensors": _bytes(1000, 3)})
    return fake_hub


@pytest.fixture
def recipe(tmp_path: Path) -> recipes.Recipe:
    return recipes.load_file(write_recipe(tmp_path / "tiny.yaml"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fail(recipe: recipes.Recipe, **kw) -> BuunError:
    with pytest.raises(BuunError) as info:
        pull.pull(recipe, paths.models_dir(), **kw)
    return info.value


class TestDownload:
    def test_pulls_every_role_into_its_folder_and_records_a_manifest(self, hub: FakeHub, recipe: recipes.Recipe):
        result = pull.pull(recipe, paths.models_dir())
        lay = layout.for_recipe(recipe, paths.models_dir())
        assert lay.target_gguf == lay.target_dir / GGUF and lay.target_gguf.is_file()
        assert lay.drafter_dir.name == "z-lab--Qwen3.5-27B-DFlash"
        for role, spec in recipe.repos().items():
            folder = lay.role_dir(role)
            manifest = json.loads((folder / pull.MANIFEST).read_text())
            assert manifest["repo"] == spec.repo and manifest["revision"] == "main"
            assert manifest["commit"] == hub.repos[spec.repo].commit  # the branch, resolved to a commit
            assert sorted(manifest["files"]) == sorted(spec.files)
            for name, entry in manifest["files"].items():
                assert entry["size"] == (folder / name).stat().st_size
                assert entry["sha256"] == _sha256(folder / name)
                assert entry["lfs"] == name.endswith((".gguf", ".safetensors"))
            assert not (folder / pull.PARTIAL_DIR).exists()
        # only the listed files: not the README, the modelling code or other shards
        assert not (lay.target_dir / "README.md").exists()
        assert not (lay.tokenizer_dir / "model-00001-of-00011.safetensors").exists()
        assert [r.role for r in result.roles] == ["target", "drafter", "tokenizer"]

    def test_second_pull_downloads_nothing(self, hub: FakeHub, recipe: recipes.Recipe):
        pull.pull(recipe, paths.models_dir())
        hub.log.clear()
        result = pull.pull(recipe, paths.models_dir())
        assert all(r.downloaded == [] for r in result.roles)
        assert hub.requests(kind="resolve") == []
        assert len(hub.requests(kind="api")) == 3  # one look per repo, for its commit

    def test_a_changed_local_file_is_fetched_again(self, hub: FakeHub, recipe: recipes.Recipe):
        pull.pull(recipe, paths.models_dir())
        weights = layout.for_recipe(recipe, paths.models_dir()).drafter_dir / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[100] ^= 0xFF  # same size, other content
        weights.write_bytes(bytes(data))
        result = pull.pull(recipe, paths.models_dir())
        assert {r.role: r.downloaded for r in result.roles}["drafter"] == ["model.safetensors"]
        assert _sha256(weights) == hub.repos[DRAFTER].files["model.safetensors"].sha256()

    def test_token_is_sent_for_a_gated_repo(self, hub: FakeHub, recipe: recipes.Recipe,
                                            monkeypatch: pytest.MonkeyPatch):
        hub.repos[TARGET].gated = True
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        pull.pull(recipe, paths.models_dir(), roles=("target",))
        assert layout.for_recipe(recipe, paths.models_dir()).target_gguf.is_file()
        assert {r["auth"] for r in hub.requests(kind="resolve")} == {"Bearer hf_test_token"}


class TestErrors:
    def test_gated_repo_without_token(self, hub: FakeHub, recipe: recipes.Recipe):
        hub.repos[TARGET].gated = True
        err = _fail(recipe)
        assert err.exit_code == Exit.GATED
        assert TARGET in err.message and "no token was sent" in err.message
        assert "HF_TOKEN" in (err.hint or "") and f"{hub.url}/{TARGET}" in (err.hint or "")
        assert hub.requests(kind="resolve") == []  # refused before any download

    def test_gated_repo_with_a_token_that_has_no_access(self, hub: FakeHub, recipe: recipes.Recipe,
                                                        monkeypatch: pytest.MonkeyPatch):
        hub.repos[TARGET].gated = True
        monkeypatch.setenv("HF_TOKEN", "hf_someone_else")
        err = _fail(recipe)
        assert err.exit_code == Exit.GATED and "no access" in err.message

    def test_missing_repo(self, hub: FakeHub, tmp_path: Path):
        r = recipes.load_file(write_recipe(tmp_path / "r.yaml", drafter={"repo": "z-lab/No-Such-Drafter",
                                                                          "files": ["config.json"]}))
        err = _fail(r)
        assert err.exit_code == Exit.NOT_FOUND
        assert "z-lab/No-Such-Drafter does not exist" in err.message
        assert "drafter.repo" in (err.hint or "") and str(r.source) in (err.hint or "")

    def test_a_mirrors_password_stays_out_of_the_manifest_and_the_messages(self, hub: FakeHub, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
        """HF_ENDPOINT may name a mirror that asks for a password (https://user:pass@host): the
        manifest recorded it as given, and an error printed it."""
        monkeypatch.setenv("HF_ENDPOINT", hub.url.replace("http://", "http://me:sekrit@"))
        r = recipes.load_file(write_recipe(tmp_path / "r.yaml"))
        pull.pull(r, paths.models_dir(), roles=("target",))
        manifest = layout.for_recipe(r, paths.models_dir()).target_dir / pull.MANIFEST
        assert json.loads(manifest.read_text())["endpoint"] == hub.url.replace("http://", "http://me:****@")
        gone = recipes.load_file(write_recipe(tmp_path / "g.yaml", drafter={"repo": "z-lab/No-Such-Drafter",
                                                                             "files": ["config.json"]}))
        err = _fail(gone, roles=("drafter",))
        assert "me:****@" in err.message + (err.hint or "") and "sekrit" not in err.message + (err.hint or "")

    def test_missing_revision(self, hub: FakeHub, tmp_path: Path):
        r = recipes.load_file(write_recipe(tmp_path / "r.yaml", drafter={
            "repo": DRAFTER, "revision": "v9.9", "files": ["config.json", "model.safetensors"]}))
        err = _fail(r)
        assert err.exit_code == Exit.NOT_FOUND
        assert err.message == f"{DRAFTER} has no revision 'v9.9'"
        assert "drafter.revision" in (err.hint or "")

    def test_missing_file_fails_before_any_download(self, hub: FakeHub, tmp_path: Path):
        r = recipes.load_file(write_recipe(tmp_path / "r.yaml", drafter={
            "repo": DRAFTER, "files": ["config.json", "model.safetensors", "mask_embedding.pt"]}))
        err = _fail(r)
        assert err.exit_code == Exit.NOT_FOUND and "'mask_embedding.pt'" in err.message
        assert hub.requests(kind="resolve") == []

    def test_network_down(self, recipe: recipes.Recipe, monkeypatch: pytest.MonkeyPatch):
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", f"http://127.0.0.1:{port}")
        err = _fail(recipe)
        assert err.exit_code == Exit.NETWORK
        assert f"cannot reach the Hub at http://127.0.0.1:{port}" in err.message

    def test_corrupted_transfer_is_refused_and_discarded(self, hub: FakeHub, recipe: recipes.Recipe):
        good = hub.repos[DRAFTER].files["model.safetensors"]
        hub.tampered[(DRAFTER, "model.safetensors")] = _bytes(good.size, 99)
        err = _fail(recipe, roles=("drafter",))
        assert err.exit_code == Exit.FAILED and "arrived corrupted" in err.message and "sha256" in err.message
        folder = layout.for_recipe(recipe, paths.models_dir()).drafter_dir
        assert not (folder / "model.safetensors").exists()
        assert list((folder / pull.PARTIAL_DIR).iterdir()) == []
        manifest = json.loads((folder / pull.MANIFEST).read_text())
        assert "model.safetensors" not in manifest["files"]  # only verified files are recorded

    def test_a_listing_whose_hash_is_a_path_is_refused_before_any_download(self, hub: FakeHub,
                                                                           recipe: recipes.Recipe):
        # The LFS sha256 names the partial file: "/../../../../../" would put it, appended to and
        # then deleted, five folders up, beside the models folder.
        hub.reported_sha256[(DRAFTER, "model.safetensors")] = "/../../../../../" + "0" * 48
        victim = paths.models_dir().parent / ".part"
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_bytes(b"someone else's file\n")
        err = _fail(recipe, roles=("drafter",))
        assert err.exit_code == Exit.NETWORK
        assert (f"the Hub's listing of {DRAFTER}@main gives model.safetensors the sha256 '/../../../../../"
                in err.message)
        assert victim.read_bytes() == b"someone else's file\n"
        assert hub.requests(kind="resolve") == []

    def test_disk_space_is_checked_against_the_hub_sizes_before_downloading(self, hub: FakeHub,
                                                                          recipe: recipes.Recipe):
        hub.reported_sizes[(TARGET, GGUF)] = 2**60  # an exabyte: no disk has that
        err = _fail(recipe)
        assert err.exit_code == Exit.DISK and "not enough disk space" in err.message
        assert hub.requests(kind="resolve") == []


class TestFullDisk:
    """A full disk, made at the OS level: the write goes to /dev/full, which answers ENOSPC."""

    def test_writing_the_manifest_on_a_full_disk_is_a_clean_error(self, hub: FakeHub, recipe: recipes.Recipe):
        pull.pull(recipe, paths.models_dir(), roles=("drafter",))
        folder = layout.for_recipe(recipe, paths.models_dir()).drafter_dir
        manifest = (folder / pull.MANIFEST).read_text()
        tmp = folder / f".{pull.MANIFEST}.{os.getpid()}.tmp"  # where the next record is written first
        tmp.symlink_to("/dev/full")
        result = CliRunner().invoke(app, ["pull", str(recipe.source), "--only", "drafter"])
        assert result.exit_code == Exit.DISK, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
        out = "".join(result.output.split())  # rich wraps long paths anywhere
        assert f"thediskisfull:couldnotwrite{folder / pull.MANIFEST}" in out and "freesomespace" in out
        assert not tmp.exists() and not tmp.is_symlink()  # no temporary file left behind
        assert (folder / pull.MANIFEST).read_text() == manifest  # the previous record stays

    def test_the_disk_hint_names_buuns_own_stale_partial_files(self, hub: FakeHub, recipe: recipes.Recipe):
        folder = layout.for_recipe(recipe, paths.models_dir()).target_dir / pull.PARTIAL_DIR
        folder.mkdir(parents=True)
        old = folder / f"{GGUF}.0123456789abcdef.part"  # an older version of the file, never to be resumed
        old.write_bytes(_bytes(1_500_000, 7))
        hub.reported_sizes[(TARGET, GGUF)] = 2**60
        err = _fail(recipe)
        assert err.exit_code == Exit.DISK and "not enough disk space" in err.message
        assert "1 unfinished download(s) of buun's that nothing resumes take 1.4 MiB" in (err.hint or "")
        assert f"rm {old}" in (err.hint or "") and "not enough on its own" in (err.hint or "")

    def test_a_hub_that_sends_more_than_it_announced_is_cut_off(self, hub: FakeHub, recipe: recipes.Recipe):
        hub.reported_sizes[(DRAFTER, "model.safetensors")] = 500_000  # it sends 2,000,000
        err = _fail(recipe, roles=("drafter",))
        assert err.exit_code == Exit.NETWORK
        assert "sent more of z-lab/Qwen3.5-27B-DFlash/model.safetensors than the 500000 bytes it announced" \
            in err.message
        partial = layout.for_recipe(recipe, paths.models_dir()).drafter_dir / pull.PARTIAL_DIR
        assert not partial.exists() or list(partial.iterdir()) == []


class TestResume:
    def test_a_dropped_connection_resumes_in_the_same_run(self, hub: FakeHub, recipe: recipes.Recipe):
        big = _bytes(24 << 20, 7)  # over the client's 10 MiB write chunk, so bytes land before the cut
        hub.add_repo(TARGET, {GGUF: big})
        hub.cuts[(TARGET, GGUF)] = Cut(after=15 << 20)
        pull.pull(recipe, paths.models_dir(), roles=("target",))
        gets = hub.requests("GET", "resolve")
        assert len(gets) == 2 and gets[0]["range"] is None
        resumed_at = int(gets[1]["range"].removeprefix("bytes=").rstrip("-"))
        assert 0 < resumed_at <= 15 << 20
        assert layout.for_recipe(recipe, paths.models_dir()).target_gguf.read_bytes() == big

    def test_an_interrupted_run_resumes_from_its_partial_file(self, hub: FakeHub, recipe: recipes.Recipe):
        big = _bytes(24 << 20, 8)
        hub.add_repo(TARGET, {GGUF: big})
        hub.cuts[(TARGET, GGUF)] = Cut(after=15 << 20, then_status=503, then_times=1)
        err = _fail(recipe, roles=("target",))
        assert err.exit_code == Exit.NETWORK and "HTTP 503" in err.message
        parts = list((layout.for_recipe(recipe, paths.models_dir()).target_dir / pull.PARTIAL_DIR).glob("*.part"))
        assert len(parts) == 1
        kept = parts[0].stat().st_size
        assert 0 < kept < len(big)
        hub.log.clear()
        pull.pull(recipe, paths.models_dir(), roles=("target",))
        gets = hub.requests("GET", "resolve")
        assert [g["range"] for g in gets] == [f"bytes={kept}-"]
        assert layout.for_recipe(recipe, paths.models_dir()).target_gguf.read_bytes() == big
        assert not parts[0].exists()


class TestOffline:
    def test_offline_uses_what_is_on_disk_without_a_request(self, hub: FakeHub, recipe: recipes.Recipe,
                                                            monkeypatch: pytest.MonkeyPatch):
        pull.pull(recipe, paths.models_dir())
        hub.log.clear()
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        result = pull.pull(recipe, paths.models_dir())
        assert result.offline and hub.log == []
        assert {r.role: r.commit for r in result.roles}["drafter"] == hub.repos[DRAFTER].commit

    def test_offline_with_nothing_downloaded_says_so(self, hub: FakeHub, recipe: recipes.Recipe,
                                                     monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        err = _fail(recipe)
        assert err.exit_code == Exit.NETWORK and "HF_HUB_OFFLINE is set" in err.message
        assert hub.log == []


class TestCli:
    def test_pull_json(self, hub: FakeHub, recipe: recipes.Recipe, tmp_path: Path):
        res = CliRunner().invoke(app, ["pull", str(recipe.source), "--models-dir", str(tmp_path / "m"), "--json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)
        assert [r["role"] for r in data["roles"]] == ["target", "drafter", "tokenizer"]
        assert (tmp_path / "m" / "target" / "unsloth--Qwen3.5-27B-GGUF" / GGUF).is_file()

    def test_pull_only_some_roles(self, hub: FakeHub, recipe: recipes.Recipe):
        res = CliRunner().invoke(app, ["pull", str(recipe.source), "--only", "drafter,tokenizer"])
        assert res.exit_code == 0, res.output
        assert not layout.for_recipe(recipe, paths.models_dir()).target_dir.exists()
        assert hub.requests(kind="api") and all(TARGET not in r["path"] for r in hub.log)

    def test_unknown_role(self, recipe: recipes.Recipe):
        res = CliRunner().invoke(app, ["pull", str(recipe.source), "--only", "vision"])
        assert res.exit_code == Exit.USAGE and "unknown role(s) vision" in " ".join(res.output.split())

    def test_gated_exit_code_and_message(self, hub: FakeHub, recipe: recipes.Recipe):
        hub.repos[TARGET].gated = True
        res = CliRunner().invoke(app, ["pull", str(recipe.source)])
        assert res.exit_code == Exit.GATED
        out = " ".join(res.output.split())
        assert "gated repository" in out and "Traceback" not in out


def test_models_dir_option_then_env_then_default(recipe: recipes.Recipe, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch):
    assert paths.models_dir() == Path(os.environ["BUUN_MODELS_DIR"])
    assert paths.models_dir(tmp_path / "given") == tmp_path / "given"  # the option wins
    monkeypatch.chdir(tmp_path)
    assert paths.models_dir(Path("rel")) == tmp_path / "rel"  # absolute: a unit or a supervisor runs elsewhere
    monkeypatch.delenv("BUUN_MODELS_DIR")
    assert paths.models_dir() == paths.data_dir() / "models"
    lay = layout.for_recipe(recipe, tmp_path)
    assert lay.drafter_gguf() == tmp_path / "gguf" / "tiny-dflash" / "Qwen3.5-27B-DFlash-Q4_K_M.gguf"
    assert lay.drafter_gguf("bf16").name == "Qwen3.5-27B-DFlash-BF16.gguf"

"""Fixtures of the model pipeline tests (a pytest plugin: `pytest_plugins = ["tests.models_fixtures"]`).

- `converter_python`: the converter's venv, made once by buun itself (`convert.converter_python`)
  in the same cache folder conftest gives every test, so tests find it ready.
- `tiny_models`: the tiny target (HF checkpoint -> GGUF with the vendored converter), the tiny
  drafter and the real Qwen3.5 tokenizer. Built once and kept in .pytest_cache/buun-fixtures
  under a key of everything that shapes them, so later sessions start in a second.
- `fake_hub`: a local Hub (tests/hub_server.py) with HF_ENDPOINT pointing at it.
- `tiny_hub` / `tiny_recipe`: the tiny pair published on the fake Hub under the real recipe's
  repo names, and a recipe file that pulls it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from buun_tool.base import paths
from buun_tool.formats import recipes
from buun_tool.pipeline import convert
from tests import tiny_models
from tests.hub_server import FakeHub
from tests.tiny_models import TinyModels, write_recipe

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".pytest_cache"


def _fixture_key(geometry: dict[str, Any]) -> str:
    """Everything that shapes the fixture files: this code, the geometry, the converter's tree."""
    llama = paths.llama_dir()
    tree = subprocess.run(["git", "-C", str(llama), "rev-parse", "HEAD^{tree}"],
                          capture_output=True, text=True).stdout.strip()
    h = hashlib.sha256()
    for part in (Path(tiny_models.__file__).read_bytes(), json.dumps(geometry, sort_keys=True).encode(),
                 tree.encode(), json.dumps(convert.CONVERTER_REQUIREMENTS).encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _build(dest: Path, geometry: dict[str, dict[str, Any]], python: Path, tokenizer: Path) -> None:
    tcfg = tiny_models.target_config(geometry["target"])
    dcfg = tiny_models.drafter_config(geometry["drafter"], geometry["target"])
    target_hf = dest / "target-hf"
    tiny_models.write_checkpoint(target_hf, tcfg, tiny_models.target_weights(tcfg))
    tiny_models.write_checkpoint(dest / "drafter", dcfg, tiny_models.drafter_weights(dcfg))
    (dest / "tokenizer").mkdir()
    for name in tiny_models.TOKENIZER_FILES:
        shutil.copyfile(tokenizer / name, target_hf / name)
        shutil.copyfile(tokenizer / name, dest / "tokenizer" / name)
    shutil.copyfile(target_hf / "config.json", dest / "tokenizer" / "config.json")
    log = dest / "convert-target.log"
    # Q8_0 straight from the converter keeps the full-vocabulary target small; no MTP head.
    convert.run_converter(python, target_hf, None, dest / "target.gguf", "q8_0", log, extra=("--no-mtp",))
    shutil.rmtree(target_hf)
    # what upstream's converter makes of the drafter: the reference `gguf migrate` must reproduce
    convert.run_converter(python, dest / "drafter", dest / "tokenizer", dest / "drafter-upstream-F16.gguf", "f16", log)


@pytest.fixture(scope="session")
def converter_python() -> Path:
    return convert.converter_python(CACHE / "buun-cache")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Path:
    """The Qwen3.5 tokenizer files (10 s to build, so cached across sessions)."""
    key = hashlib.sha256(Path(tiny_models.__file__).read_bytes()).hexdigest()[:16]
    dest = CACHE / "buun-fixtures" / f"tokenizer-{key}"
    if not (dest / "tokenizer.json").is_file():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tiny_models.write_tokenizer(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_models_built(converter_python: Path, tiny_tokenizer: Path) -> TinyModels:
    geometry = recipes.load().geometry_at("tiny").to_json()
    dest = CACHE / "buun-fixtures" / f"models-{_fixture_key(geometry)}"
    if not (dest / "done").is_file():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _build(tmp, geometry, converter_python, tiny_tokenizer)
        (tmp / "done").write_text("ok\n")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return TinyModels(dest, geometry)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    hub = FakeHub().start()
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    # huggingface_hub fetches a registry of its own from constants.ENDPOINT (fixed at import):
    # keep that on the fake Hub too, never the internet
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
    # no token file of the machine's user leaks into a test
    monkeypatch.setenv("HF_HOME", str(paths.cache_dir() / "hf-home-unused"))
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(paths.data_dir() / "no-hf-token"))
    yield hub
    hub.stop()


@pytest.fixture
def tiny_hub(fake_hub: FakeHub, tiny_models_built: TinyModels) -> FakeHub:
    for repo, files in tiny_models_built.hub_repos().items():
        fake_hub.add_repo(repo, files)
    return fake_hub


@pytest.fixture
def tiny_recipe(tmp_path: Path) -> recipes.Recipe:
    return recipes.load_file(write_recipe(tmp_path / "tiny-dflash.yaml"))

"""The tiny models of the tests (a pytest plugin), built once and cached in .pytest_cache.

GGUF pairs to serve, synthesized by buun itself (`synth.write_pair`, a no-op when the files are up
to date) with the structure of the default recipe's pair (Qwen3.5-27B and its DFlash drafter):
- `tiny_pair`: Q4, `tiny_pair_f32`: f32 matrices, `tiny_pair_q4_f32`: the Q4 pair dequantized to f32
  (tests/README.md says which a test needs).

The model pipeline's inputs (pull, convert, gguf), from tests/support/tiny_checkpoints.py:
- `converter_python`: the converter's venv, made once by buun itself (`convert.converter_python`)
  in the same cache folder conftest gives every test, so tests find it ready.
- `tiny_models_built`: the tiny target (HF checkpoint -> GGUF with the vendored converter), the tiny
  drafter and the real Qwen3.5 tokenizer (`tiny_tokenizer`). Kept in .pytest_cache/buun-fixtures
  under a key of everything that shapes them, so later sessions start in a second.
- `fake_hub`: a local Hub (tests/support/fake_hub.py) with HF_ENDPOINT pointing at it.
- `tiny_hub` / `tiny_recipe`: the tiny pair published on the fake Hub under the real recipe's
  repo names, and a recipe file that pulls it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from buun_tool.base import paths
from buun_tool.formats import recipes
from buun_tool.measure import synth
from buun_tool.pipeline import convert
from tests.support import tiny_checkpoints
from tests.support.fake_hub import FakeHub
from tests.support.tiny_checkpoints import TinyModels, write_recipe

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".pytest_cache"
PAIRS = CACHE / "buun-models"  # the GGUF pairs
BUILD_WAIT_S = 900  # the longest a worker waits for another to build a cached fixture
DFLASH2_RECIPE = "qwen3.8-27b-dflash2"


@contextmanager
def one_writer(name: str) -> Iterator[None]:
    """One process at a time builds the cached fixture `name`: `make check` runs its tests in two
    pytest-xdist workers, which would otherwise write the same files at once on a fresh clone. The
    other waits (at most BUILD_WAIT_S), then finds the fixture made."""
    lock = CACHE / "buun-locks" / f"{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        deadline = time.monotonic() + BUILD_WAIT_S
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, f"another test process held {lock} for {BUILD_WAIT_S} s"
                time.sleep(0.2)
        yield


@pytest.fixture(scope="session")
def tiny_pair() -> tuple[Path, Path]:
    """(target.gguf, drafter.gguf): qwen35 hybrid target (delta-net + full attention layers) and a
    dflash drafter reading several of its layers."""
    with one_writer("tiny-pair"):
        return synth.write_pair(recipes.load(), PAIRS / "tiny", scale="tiny", seed=0)


# The f32 pair's vocabulary: 8192 rows of output matrix, not the real 248320, which were most of a
# tiny model's work (llama-bench: 548 tok/s against 81). Its end token and the drafter's mask token
# sit inside it, as in the DFlash2 recipe's tiny geometry.
SMALL_VOCAB = {"vocab_size": 8192, "eos_token_id": 7936, "mask_token_id": 7950}


def small_vocab_recipe() -> recipes.Recipe:
    """The default recipe with its tiny pair's vocabulary cut to SMALL_VOCAB: the same layers, taps
    and block; the real geometry, server flags and repos as they are."""
    path = recipes.available()[recipes.DEFAULT_RECIPE]
    data = recipes.load_yaml(path.read_bytes().decode("utf-8"), path)
    tiny = data["geometry"]["tiny"]
    tiny["target"].update(vocab_size=SMALL_VOCAB["vocab_size"], eos_token_id=SMALL_VOCAB["eos_token_id"])
    tiny["drafter"]["mask_token_id"] = SMALL_VOCAB["mask_token_id"]
    return recipes.parse(path, data)


@pytest.fixture(scope="session")
def tiny_pair_f32() -> tuple[Path, Path]:
    """The pair with f32 matrices and a vocabulary of 8192 (SMALL_VOCAB), for the correctness
    harness: without quantized activations, single-token and batched decoding agree to float
    rounding, so states compare tightly; the small vocabulary makes it ~6x faster to decode."""
    with one_writer("tiny-pair-f32"):
        return synth.write_pair(small_vocab_recipe(), PAIRS / "tiny-f32-v8k", scale="tiny", seed=0,
                                target_type="f32", draft_type="f32")


@pytest.fixture(scope="session")
def tiny_dflash2_pair_f32() -> tuple[Path, Path]:
    """The DFlash2 recipe's tiny pair (recipes/qwen3.8-27b-dflash2.yaml) with f32 matrices: the
    same qwen35 target structure and a DFlash2 drafter (the convolutions, the selector, a window)."""
    with one_writer("tiny-dflash2-f32"):
        return synth.write_pair(recipes.load(DFLASH2_RECIPE), PAIRS / "tiny-dflash2-f32", scale="tiny", seed=0,
                                target_type="f32", draft_type="f32")


@pytest.fixture(scope="session")
def tiny_pair_q4_f32(tiny_pair: tuple[Path, Path], llama_bin: Path) -> tuple[Path, Path]:
    """The Q4 pair dequantized to f32 (llama-quantize ... F32): the Q4 pair's function, so its
    drafter proposes what the Q4 drafter proposes (tests/test_server_requests.py relies on the
    tokens it favours), with the f32 pair's batch invariance (tests/README.md)."""
    out = PAIRS / "tiny-q4-f32"
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for src in tiny_pair:
        dest, stamp = out / src.name.replace(".gguf", "-f32.gguf"), out / (src.name + ".source")
        source = f"{src.stat().st_size} {src.stat().st_mtime_ns}\n"
        if not dest.is_file() or not stamp.is_file() or stamp.read_text() != source:
            tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")  # sessions side by side
            r = subprocess.run([str(llama_bin / "llama-quantize"), "--allow-requantize", str(src), str(tmp), "F32"],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
            tmp.replace(dest)
            stamp.write_text(source)
        made.append(dest)
    return made[0], made[1]



def _fixture_key(geometry: dict[str, Any]) -> str:
    """Everything that shapes the fixture files: this code, the geometry, the converter's tree."""
    llama = paths.llama_dir()
    tree = subprocess.run(["git", "-C", str(llama), "rev-parse", "HEAD^{tree}"],
                          capture_output=True, text=True).stdout.strip()
    h = hashlib.sha256()
    for part in (Path(tiny_checkpoints.__file__).read_bytes(), json.dumps(geometry, sort_keys=True).encode(),
                 tree.encode(), json.dumps(convert.CONVERTER_REQUIREMENTS).encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _build(dest: Path, geometry: dict[str, dict[str, Any]], python: Path, tokenizer: Path) -> None:
    tcfg = tiny_checkpoints.target_config(geometry["target"])
    dcfg = tiny_checkpoints.drafter_config(geometry["drafter"], geometry["target"])
    target_hf = dest / "target-hf"
    tiny_checkpoints.write_checkpoint(target_hf, tcfg, tiny_checkpoints.target_weights(tcfg))
    tiny_checkpoints.write_checkpoint(dest / "drafter", dcfg, tiny_checkpoints.drafter_weights(dcfg))
    (dest / "tokenizer").mkdir()
    for name in tiny_checkpoints.TOKENIZER_FILES:
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
    key = hashlib.sha256(Path(tiny_checkpoints.__file__).read_bytes()).hexdigest()[:16]
    dest = CACHE / "buun-fixtures" / f"tokenizer-{key}"
    with one_writer("tiny-tokenizer"):
        if not (dest / "tokenizer.json").is_file():
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tiny_checkpoints.write_tokenizer(tmp)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
    return dest


@pytest.fixture(scope="session")
def tiny_models_built(converter_python: Path, tiny_tokenizer: Path) -> TinyModels:
    geometry = recipes.load().geometry_at("tiny").to_json()
    dest = CACHE / "buun-fixtures" / f"models-{_fixture_key(geometry)}"
    with one_writer("tiny-models"):
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

"""What the tests share: fixtures, fakes and helpers, none of them tests. The fixtures_* modules and
the others that hold fixtures are pytest plugins (tests/conftest.py's `pytest_plugins`); tests import
the rest. `fixtures_models`: the tiny models (the synthesized GGUF pairs `tiny_pair*` to serve; the
HF checkpoints, converter and fake Hub the model pipeline's tests pull and convert).
`fixtures_server`: `buun` as a subprocess in a test's own folders, the `buun` fixture and the
server tests' helpers. `fixtures_upstream_build`: the unpatched pin's CPU build for `bench --against
upstream`. `tiny_checkpoints`: writes the tiny random-weight HF checkpoints and the real Qwen3.5
tokenizer. `real_llama_server`: a real llama-server on a free port, without buun's supervisor (the
correctness harness). `fake_llama_server`: a stand-in llama-server for the supervisor's tests.
`fake_llama_source`: a stand-in llama.cpp source tree in a throwaway checkout (vendor, patches,
build). `fake_hub`: a local Hugging Face Hub with fault injection. `fake_remote_server`: an HTTP
server answering as the test says (a llama-server someone else runs, broken or hostile).
`fake_gpus`: a host with several cards (nvidia-smi and a CUDA build stamp). `lock_holder`: a process
holding buun's stage locks. `waits`: waits on states with a timeout that fails the test, and
`until_blocked_in` (a process asleep in a given system call: a signal sent then finds it there).
`recorded_bench`: recorded `buun bench` runs and their helpers.
`chromium`: headless Chromium over the DevTools protocol (the web UI and the bench report).
"""

"""GGUF tools: `inspect` a file, and `migrate` a drafter from the buun fork's format to upstream's.

The parts: the reader (gguf_file.py: GgufFile, its key/values and tensor infos), the writer
(gguf_write.py), `buun gguf inspect` (gguf_inspect.py) and `buun gguf migrate` with the fork's
format and upstream's DFlash tensor names (gguf_migrate.py). Their names are gguf_tools' too:
callers say gguf_tools.GgufFile, gguf_tools.migrate.
"""

from __future__ import annotations

from buun_tool.formats.gguf_file import (
    GGUF_VERSIONS,
    MAX_DIMS,
    GgufFile,
    Kv,
    TensorInfo,
    check_given,
    not_a_file,
    read_gguf,
    tensor_nbytes,
)
from buun_tool.formats.gguf_inspect import inspect
from buun_tool.formats.gguf_migrate import (
    FORK_ARCH,
    FORK_LAYER_TENSORS,
    FORK_TENSORS,
    GLOBAL_TENSORS,
    LAYER_TENSORS,
    OPTIONAL_TENSORS,
    UPSTREAM_ARCH,
    migrate,
)
from buun_tool.formats.gguf_write import encode_value, write_gguf

__all__ = [
    # gguf_file.py
    "GGUF_VERSIONS", "MAX_DIMS", "GgufFile", "Kv", "TensorInfo", "check_given", "not_a_file", "read_gguf",
    "tensor_nbytes",
    # gguf_write.py
    "encode_value", "write_gguf",
    # gguf_inspect.py
    "inspect",
    # gguf_migrate.py
    "FORK_ARCH", "FORK_LAYER_TENSORS", "FORK_TENSORS", "GLOBAL_TENSORS", "LAYER_TENSORS", "OPTIONAL_TENSORS",
    "UPSTREAM_ARCH", "migrate",
]

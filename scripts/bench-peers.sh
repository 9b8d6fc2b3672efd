#!/usr/bin/env bash
# Install the gateway benchmark's peers (LiteLLM's proxy, vllm-router) into their own
# virtual environment, from bench/peers-requirements.txt. Idempotent: a stamp holding the
# requirements' checksum skips the install when nothing changed; pip's cache makes a
# re-install after a change quick.
#   bash scripts/bench-peers.sh            # into .venv-peers
#   PEERS_VENV=/elsewhere bash scripts/bench-peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${PEERS_VENV:-.venv-peers}
requirements=bench/peers-requirements.txt
stamp="$venv/.installed"
wanted=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  echo "==> peers already installed in $venv"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating the peers' virtual environment in $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
fi
echo "==> installing LiteLLM's proxy and vllm-router into $venv (a few minutes the first time)"
"$venv/bin/pip" install --progress-bar off -r "$requirements"
# Each peer must start, not just install: a missing dependency of the proxy shows here.
"$venv/bin/python" -c "import litellm.proxy.proxy_server" >/dev/null
"$venv/bin/vllm-router" --help >/dev/null
echo "==> installed: litellm $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("litellm"))'), vllm-router $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-router"))')"
echo "$wanted" > "$stamp"

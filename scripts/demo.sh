#!/usr/bin/env bash
# A short, realistic session on the embedded SQLite store: a declared catalog,
# runtime adds, refused adds, a removal, the history and the replay.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
llmgw="$here/.venv/bin/llmgw"
work="$here/demo"
rm -rf "$work" && mkdir -p "$work" && cp "$here"/examples/*.yaml "$work"/
cd "$work"
export LLMGW_DATABASE_URL="sqlite:///$work/llmgw.db"

step() { printf '\n\033[1m$ llmgw %s\033[0m\n' "$*"; "$llmgw" "$@"; echo "(exit $?)"; }

step models
step add qwen-coder.yaml --actor alice --reason "try before review" --key demo-1
step add qwen-coder.yaml --actor alice --reason "retried after a timeout" --key demo-1
step add clash.yaml --actor mallory
step add broken.yaml --actor bob
step remove llama-3.1-70b --actor bob
step remove qwen2.5-7b --actor bob
step add coder-lite.yaml --actor carol
step resolve coder
step models
step remove qwen2.5-coder-7b --actor alice --reason "trial over"
step remove qwen2.5-coder-1.5b --actor carol --reason "trial over"
step remove qwen2.5-coder-7b --actor alice --reason "trial over"
step history
step replay
step show --at 1

# Placement: agents report their nodes, one round places what fits and explains the rest.
step nodes report nodes.yaml
step nodes list
step place --dry-run
step place
step placements
step add a100-trial.yaml --actor dave --reason "does it fit?"
step place
echo
echo "The database is $work/llmgw.db; run more commands with LLMGW_DATABASE_URL=$LLMGW_DATABASE_URL"

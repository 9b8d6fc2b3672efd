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

# Commands are shown as a shell reads them back (an argument with anything but plain
# characters in single quotes, so a line can be pasted), in bold only on a terminal (a log
# or a pager gets no escape codes).
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
shown() {
  local out='' arg
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+="$arg "; else out+="'${arg//\'/\'\\\'\'}' "; fi
  done
  printf '%s' "${out% }"
}
say() { printf '\n%s$ %s%s\n' "$bold" "$1" "$plain"; }
step() { say "llmgw $(shown "$@")"; "$llmgw" "$@"; echo "(exit $?)"; }

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

# The API: the same commands over HTTP. An agent reports its node with a token issued for
# it; an operator adds a model; each is refused what its role does not allow.
if ! command -v curl >/dev/null; then
  echo "(curl is not installed: skipping the API part of the demo)"
  exit 0
fi
say "llmgw token new dave --role operator > dave.token; llmgw token new agent-t4-01 --role agent --node t4-01 > agent.token"
"$llmgw" token new dave --role operator > dave.token 2>/dev/null
"$llmgw" token new agent-t4-01 --role agent --node t4-01 > agent.token 2>/dev/null
echo "(each token is shown once, on the first line of its file; the database keeps its name, role and SHA-256)"
"$llmgw" token list
ops=$(head -1 dave.token) agent=$(head -1 agent.token)

say "llmgw serve --port 0 &"
"$llmgw" serve --port 0 > serve.out 2> serve.log &
server=$!
stop_server() { kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null; }
trap stop_server EXIT
for _ in $(seq 100); do grep -q "listening on" serve.out 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.*listening on //p' serve.out)
if [ -z "$url" ]; then echo "the server did not start:"; cat serve.log; exit 1; fi
for _ in $(seq 100); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.1; done
echo "$(cat serve.out)"
# The manual (`make demo` built it into site/): any server started from this tree serves it.
say "curl -s -o /dev/null -w '%{http_code}' $url/manual/"
curl -s -o /dev/null -w '(HTTP %{http_code}: the manual, at /manual/ of any llmgw serve started from this tree)\n' "$url/manual/"

# curl with a token ($1: ops or agent), printing the command, the body and the status.
api() {
  local who=$1; shift
  local token; [ "$who" = ops ] && token=$ops || token=$agent
  say "curl $(shown "$@")  (as $who)"
  curl -s -w '\n(HTTP %{http_code})\n' -H "Authorization: Bearer $token" "$@"
}
api agent -X PUT "$url/v1/nodes/t4-01" -d '{"gpu_class": "T4", "gpus": 4, "memory_gb": 96}'
api agent -X PUT "$url/v1/nodes/t4-02" -d '{"gpu_class": "T4", "gpus": 4}'
api agent -X POST "$url/v1/catalog/models" --data-binary @qwen-coder.yaml
api ops -X POST "$url/v1/catalog/models?reason=through+the+API" -H 'Idempotency-Key: demo-api-1' \
  --data-binary @qwen-coder.yaml
api ops -X POST "$url/v1/catalog/models" --data-binary @clash.yaml
api ops "$url/v1/models"
head=$(curl -s -H "Authorization: Bearer $ops" "$url/v1/events?limit=1" |
  "$here/.venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["head"])')
api ops "$url/v1/events?after=$((head - 2))"
api agent "$url/v1/placements?node=t4-01"
say "kill -TERM $server  (stops the server)"
stop_server
trap - EXIT
grep -c '"api.request"' serve.log | sed 's/$/ api.request log lines in serve.log/'

# The agents: a server and three agents with sim engines on loopback (scripts/demo-cluster.sh).
bash "$here/scripts/demo-cluster.sh"
echo
echo "Done. The catalog's database is $work/llmgw.db; to run more commands against it:"
echo "  cd $work && export LLMGW_DATABASE_URL=$LLMGW_DATABASE_URL PATH=$here/.venv/bin:\$PATH"

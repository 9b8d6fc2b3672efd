#!/usr/bin/env bash
# The cluster part of `make demo`: a server and three agents on loopback, each with two
# pretend cards, running sim engines. Replicas go from placed to ready; one node's agent
# is killed with its engines (the machine is gone) and its replicas become ready on the
# others; the official openai client then chats with a ready replica.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin="$here/.venv/bin"
work="$here/demo/cluster"
rm -rf "$work" && mkdir -p "$work" && cp "$here/examples/cluster/catalog.yaml" "$work/"
cd "$work"
export LLMGW_DATABASE_URL="sqlite:///$work/llmgw.db" LLMGW_CONFIG="$work/catalog.yaml"
# Bold only on a terminal: a log or a pager gets no escape codes.
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
say() { printf '\n%s%s%s\n' "$bold" "$*" "$plain"; }

say "# A cluster on loopback: tokens for an operator and three agents"
"$bin/llmgw" token new ops --role operator > ops.token
: > auth.toml
tail -n +2 ops.token >> auth.toml
for n in node-a node-b node-c; do
  "$bin/llmgw" token new "agent-$n" --role agent --node "$n" > "$n.entry"
  head -1 "$n.entry" > "$n.token" && tail -n +2 "$n.entry" >> auth.toml
done
grep -c '^\[\[tokens\]\]' auth.toml | sed 's/$/ tokens in auth.toml/'

say '$ llmgw serve --auth-file auth.toml --port 0 --with-scheduler --interval 1 --stale-after 3 --grace 3 &'
"$bin/llmgw" serve --auth-file auth.toml --port 0 --with-scheduler --interval 1 \
  --stale-after 3 --grace 3 > serve.out 2> serve.log &
pids=($!)
cleanup() {
  for p in "${pids[@]:1}"; do kill -TERM "$p" 2>/dev/null; done   # agents stop their engines
  for p in "${pids[@]:1}"; do wait "$p" 2>/dev/null; done
  kill -TERM "${pids[0]}" 2>/dev/null; wait "${pids[0]}" 2>/dev/null
}
trap cleanup EXIT
for _ in $(seq 300); do grep -q "listening on" serve.out 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.*listening on //p' serve.out)
[ -n "$url" ] || { echo "the server did not start:"; cat serve.log; exit 1; }
for _ in $(seq 300); do curl -sf "$url/healthz" >/dev/null && break; sleep 0.1; done
ops=$(head -1 ops.token)

declare -A agent_pid
for n in node-a node-b node-c; do
  say "\$ llmgw agent --server $url --token-file $n.token --node $n --gpus SIM:2 --interval 0.5 --engine-host 127.0.0.1 --advertise 127.0.0.1 --state-dir agents/$n &"
  "$bin/llmgw" agent --server "$url" --token-file "$n.token" --node "$n" --gpus SIM:2 \
    --interval 0.5 --engine-host 127.0.0.1 --advertise 127.0.0.1 --state-dir "agents/$n" \
    > "agent-$n.out" 2> "agent-$n.log" &
  agent_pid[$n]=$!
  pids+=($!)
done

# The replicas as the API shows them, one line each; exits 0 once all three are ready
# (and, given a node, none is on it).
cat > show.py <<'PY'
import json, sys
ps = json.load(sys.stdin)
for p in ps:
    nodes = ",".join(p["nodes"])
    print(f"  {p['model']}[{p['replica']}]  {nodes:7}  {p.get('state', '?'):9}  {p.get('endpoint') or ''}")
ready = [p for p in ps if p.get("state") == "ready"]
away = len(sys.argv) < 2 or all(sys.argv[1] not in p["nodes"] for p in ps)
sys.exit(0 if len(ps) == 3 and len(ready) == 3 and away else 1)
PY
show() {
  curl -s -H "Authorization: Bearer $ops" "$url/v1/placements" | "$bin/python" show.py "$@"
}
wait_ready() {  # $1: a node that must not host any replica (optional)
  local last=""
  for _ in $(seq 240); do
    out=$(show "$@"); ok=$?
    [ "$out" != "$last" ] && { date -u +%T; echo "$out"; last=$out; }
    [ $ok = 0 ] && return 0
    sleep 0.5
  done
  echo "(not all ready after two minutes; see $work/*.log)"; return 1
}
say '# Placements, each time they change, until the three replicas are ready'
wait_ready

victim=$(curl -s -H "Authorization: Bearer $ops" "$url/v1/placements" | "$bin/python" -c '
import collections, json, sys
print(collections.Counter(p["nodes"][0] for p in json.load(sys.stdin)).most_common(1)[0][0])')
say "# $victim goes away: kill -9 its agent and its engines"
{ kill -KILL "${agent_pid[$victim]}" && wait "${agent_pid[$victim]}"; } 2>/dev/null
for f in "agents/$victim"/engines/*.json; do
  pid=$("$bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["pid"])' "$f")
  kill -KILL -- "-$pid" 2>/dev/null
done
say "# After --stale-after 3 and --grace 3 seconds of silence $victim is lost; its replicas move"
wait_ready "$victim"

say '# The official openai client, against a ready replica (a sim engine: its words are random)'
endpoint=$(curl -s -H "Authorization: Bearer $ops" "$url/v1/placements" |
  "$bin/python" -c 'import json, sys; print(json.load(sys.stdin)[0]["endpoint"])')
cat > chat.py <<'PY'
import sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
reply = client.chat.completions.create(
    model="chat", messages=[{"role": "user", "content": "Where do replicas run?"}], max_tokens=12
)
print(reply.choices[0].message.content)
print("streamed:", end=" ")
for chunk in client.chat.completions.create(
    model="chat", messages=[{"role": "user", "content": "And now?"}], max_tokens=8, stream=True
):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY
say "\$ python chat.py $endpoint"
"$bin/python" chat.py "$endpoint"

say '# The agents logged each engine they started, and when it was ready'
cat agent-node-*.log | grep -h -o '"event": "agent.engine_[a-z]*"' | sort | uniq -c

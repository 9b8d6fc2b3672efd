#!/usr/bin/env bash
# The cluster part of `make demo`: a server, three agents on loopback, each with two
# pretend cards, running sim engines, and a gateway in front of them. Replicas go from
# placed to ready; one node's agent is killed with its engines (the machine is gone) and
# its replicas become ready on the others; then chat requests go through the gateway with
# a client token (curl and the official openai client), one of them to a model with no
# replica, which falls back.
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

say "# A cluster on loopback: tokens for an operator, three agents, a gateway and a client"
# Each token is printed once (the first line) and goes into the database, which keeps its
# name, role and SHA-256: a running server takes it within a second.
"$bin/llmgw" token new ops --role operator | head -1 > ops.token
# The gateway reads the catalog and placements with its own token; an application calls
# the gateway with a client token (the control plane answers that one nothing).
for who in "gw-1 gateway" "app-1 client"; do
  set -- $who
  "$bin/llmgw" token new "$1" --role "$2" | head -1 > "$1.token"
done
for n in node-a node-b node-c; do
  "$bin/llmgw" token new "agent-$n" --role agent --node "$n" | head -1 > "$n.token"
done
"$bin/llmgw" token list

say '$ llmgw serve --port 0 --with-scheduler --interval 1 --stale-after 3 --grace 3 &'
"$bin/llmgw" serve --port 0 --with-scheduler --interval 1 \
  --stale-after 3 --grace 3 > serve.out 2> serve.log &
pids=($!)
gateway=""
cleanup() {
  # The gateway first (it finishes its requests in flight), then the agents (they stop
  # their engines), then the server.
  [ -n "$gateway" ] && { kill -TERM "$gateway" 2>/dev/null; wait "$gateway" 2>/dev/null; }
  for p in "${pids[@]:1}"; do kill -TERM "$p" 2>/dev/null; done
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

say "\$ llmgw gateway --server $url --token-file gw-1.token --port 0 &"
"$bin/llmgw" gateway --server "$url" --token-file gw-1.token --port 0 > gateway.out 2> gateway.log &
gateway=$!
for _ in $(seq 300); do grep -q "listening on" gateway.out 2>/dev/null && break; sleep 0.1; done
gw=$(sed -n 's/.*listening on //p' gateway.out)
[ -n "$gw" ] || { echo "the gateway did not start:"; cat gateway.log; exit 1; }
cat gateway.out

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

# The gateway follows the placements: wait until it routes to the three ready replicas.
for _ in $(seq 100); do
  curl -s "$gw/healthz" | "$bin/python" -c 'import json, sys; sys.exit(json.load(sys.stdin)["ready_replicas"] != 3)' && break
  sleep 0.2
done
app=$(head -1 app-1.token)

say '# A chat request through the gateway, with the client token; the headers say who answered'
body='{"model": "chat", "messages": [{"role": "user", "content": "Where do replicas run?"}], "max_tokens": 12}'
say "\$ curl -s -D - $gw/v1/chat/completions -H 'Authorization: Bearer \$APP_TOKEN' -H 'Content-Type: application/json' -d '$body'"
curl -s -D headers.txt "$gw/v1/chat/completions" -H "Authorization: Bearer $app" \
  -H 'Content-Type: application/json' -d "$body" > answer.json
grep -i '^x-llmgw-\(model\|replica\)' headers.txt
"$bin/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' answer.json

say '# The official openai client, pointed at the gateway (a sim engine: its words are made up)'
cat > chat.py <<'PY'
import sys
from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2])
for model in ("chat", "chat-large"):  # chat-large has no replica: it falls back to chat
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Where do replicas run?"}], max_tokens=8
    )
    print(f"asked {model}: answered by {raw.headers['x-llmgw-model']} "
          f"(replica {raw.headers['x-llmgw-replica']}): {raw.parse().choices[0].message.content}")
print("streamed:", end=" ")
for chunk in client.chat.completions.create(
    model="chat", messages=[{"role": "user", "content": "And now?"}], max_tokens=8, stream=True
):
    print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="", flush=True)
print()
try:
    client.chat.completions.create(model="chta", messages=[{"role": "user", "content": "hi"}])
except Exception as exc:  # the gateway's refusal, in OpenAI's error shape
    print(f"asked chta: {exc}")
PY
say "\$ python chat.py $gw \$APP_TOKEN"
"$bin/python" chat.py "$gw" "$app"

say '# The gateway logged one line per request (never the prompt or the answer)'
grep -c '"gateway.request"' gateway.log | sed 's/$/ gateway.request lines in gateway.log/'
cat > lines.py <<'PY'
import json, sys
for line in sys.stdin:
    x = json.loads(line)
    served = f"{x['model_served']} ({x['replica']})" if x["model_served"] else "-"
    print(f"  {x['model_asked']:10} -> {served:18} {x['outcome']:8} {x['latency_ms']} ms")
PY
grep -h '"gateway.request"' gateway.log | "$bin/python" lines.py

say '# The agents logged each engine they started, and when it was ready'
cat agent-node-*.log | grep -h -o '"event": "agent.engine_[a-z]*"' | sort | uniq -c

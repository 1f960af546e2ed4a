#!/usr/bin/env bash
# Real coding agents against `ft serve`, end to end: installs Claude Code, Codex and opencode from npm into a work
# folder, serves the demo model with a 32K context (and an API key), points each agent at it with `ft launch
# AGENT --api-key`, runs `claude -p`, `codex exec` and `opencode run` once, and prints each one's exit status.
# Not run in CI: it installs the clients from the npm registry. The demo model has random weights, so the answers
# are noise; what is checked is that each agent completes its turn against the server.
#
#   benchmarks/agents.sh [--work DIR] [--capture DIR] [--agents "claude codex opencode"] [--prompt TEXT]
#
# Each agent runs two turns of one session: `PROMPT`, then a follow-up (claude -p --continue, codex exec resume
# --last, opencode run --continue). --capture DIR records every request the agents send (tests/clients/capture.py
# in front of the server; ft launch's own probes left out) as DIR/<agent>/<agent>-NNN.json, home and work paths
# replaced, keys redacted: how tests/clients/fixtures were made.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FT="$ROOT/.venv/bin/ft"
PY="$ROOT/.venv/bin/python"
WORK=""
CAPTURE=""
AGENTS="claude codex opencode"
PROMPT="say hi"
PORT=${PORT:-19190}
KEY="ft-agents-$$"
TIMEOUT=${TIMEOUT:-600}
while [ $# -gt 0 ]; do
    case "$1" in
        --work) WORK=$2; shift 2 ;;
        --capture) CAPTURE=$(mkdir -p "$2" && cd "$2" && pwd); shift 2 ;;
        --agents) AGENTS=$2; shift 2 ;;
        --prompt) PROMPT=$2; shift 2 ;;
        *) echo "agents.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
WORK=${WORK:-$(mktemp -d -t ft-agents.XXXXXX)}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

# the clients, from the npm registry (skipped when already there)
NPM="$WORK/npm"
if [ ! -x "$NPM/node_modules/.bin/claude" ] || [ ! -x "$NPM/node_modules/.bin/codex" ] \
        || [ ! -x "$NPM/node_modules/.bin/opencode" ]; then
    echo "installing the clients into $NPM ..." >&2
    npm install --silent --prefix "$NPM" @anthropic-ai/claude-code @openai/codex opencode-ai >&2 || exit 1
fi
BIN="$NPM/node_modules/.bin"
for agent in claude codex opencode; do
    echo "$agent $("$BIN/$agent" --version 2>/dev/null | head -1)" >&2
done

# the demo model with a 32K context (the same weights as the shipped one), served with a key
MODEL="$WORK/freetoken-demo"
[ -f "$MODEL/config.json" ] || "$FT" demo build --context 32768 --out "$MODEL" >&2 2>/dev/null || exit 1
"$FT" serve --model "$MODEL" --port "$PORT" --api-key "$KEY" > "$WORK/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do grep -q "^ready " "$WORK/serve.log" && break; sleep 0.5; done
grep -q "^ready " "$WORK/serve.log" || { echo "ft serve did not start:" >&2; cat "$WORK/serve.log" >&2; exit 1; }
grep "^context " "$WORK/serve.log" >&2

export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1 \
       OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_SHARE=1 NO_COLOR=1
turn() {  # agent first|next -> one turn of the agent in $project, its own config under $home
    local agent=$1 next=$2
    case "$agent" in
        claude) HOME="$home" CLAUDE_CONFIG_DIR="$home/.claude" timeout "$TIMEOUT" \
                "$BIN/claude" -p ${next:+--continue} "$PROMPT" ;;
        codex) HOME="$home" CODEX_HOME="$home/.codex" FT_API_KEY="$KEY" timeout "$TIMEOUT" \
               "$BIN/codex" exec --profile freetoken --skip-git-repo-check ${next:+resume --last} "$PROMPT" ;;
        opencode) HOME="$home" XDG_CONFIG_HOME="$home/.config" XDG_DATA_HOME="$home/.local/share" \
                  timeout "$TIMEOUT" "$BIN/opencode" run ${next:+--continue} "$PROMPT" ;;
    esac
}
run_agent() {  # agent port -> the agent's exit status (its first turn, then a follow-up turn of the same session)
    local agent=$1 port=$2
    home="$WORK/home-$1" project="$WORK/project-$1"
    mkdir -p "$home" "$project"
    "$FT" launch "$agent" --home "$home" --port "$port" --api-key "$KEY" > "$WORK/$agent.launch" 2>&1 || {
        cat "$WORK/$agent.launch" >&2; return 90; }
    (cd "$project" && turn "$agent" "" && turn "$agent" next) > "$WORK/$agent.out" 2>&1 < /dev/null
}

requests() {  # the server's access-log lines after line $1, as "POST /v1/messages 200 x3, ..."
    tail -n +"$(($1 + 1))" "$WORK/serve.log" | grep -oE '(GET|POST|HEAD) /[^ ?]*(\?[^ ]*)? [0-9]{3}' \
        | sed 's/?[^ ]*//' | sort | uniq -c | awk '{printf "%s%s %s %s x%s", sep, $2, $3, $4, $1; sep=", "}'
}

printf '%-9s %-6s %-8s %s\n' agent exit seconds "requests the server answered"
i=0
for agent in $AGENTS; do
    i=$((i + 1))
    port=$PORT
    if [ -n "$CAPTURE" ]; then  # a recording proxy between the agent and the server
        port=$((PORT + i))
        rm -rf "$CAPTURE/$agent" "$WORK/capture-$agent.log"
        "$PY" "$ROOT/tests/clients/capture.py" --listen "$port" --upstream "http://127.0.0.1:$PORT" \
            --out "$CAPTURE/$agent" --name "$agent" --scrub "$WORK/project-$agent=/work/project" \
            --scrub="$(echo "$WORK/project-$agent" | tr '/_.' '---')=-work-project" --scrub "$WORK/home-$agent=/home/user" \
            --scrub "$WORK=/work" --scrub "$KEY=<key>" --skip-agent Python-urllib > "$WORK/capture-$agent.log" 2>&1 &
        PIDS+=($!)
        for _ in $(seq 50); do grep -qs "^capturing" "$WORK/capture-$agent.log" && break; sleep 0.2; done
        grep -qs "^capturing" "$WORK/capture-$agent.log" || { cat "$WORK/capture-$agent.log" >&2; exit 1; }
    fi
    start=$(date +%s)
    seen=$(wc -l < "$WORK/serve.log")
    run_agent "$agent" "$port"
    status=$?
    seconds=$(( $(date +%s) - start ))
    printf '%-9s %-6s %-8s %s\n' "$agent" "$status" "$seconds" "$(requests "$seen")"
done
echo "work folder: $WORK (serve.log: the server's access log)" >&2

#!/usr/bin/env bash
# End-to-end CPU demo: one sparrow-server on the embedded SmolLM2-135M-Instruct, then
# examples/grpo_loop.py against it. Run from the repository root:
#     bash examples/run_grpo_demo.sh [grpo_loop.py arguments...]
# The server accepts adapters under RUN_DIR (--adapter-root), where --distill-every/--publish write them.
# Environment: PORT (default 30555), RUN_DIR (default $TMPDIR/sparrow-grpo-demo), THREADS (server torch threads, 1).
set -euo pipefail
PORT="${PORT:-30555}"
RUN_DIR="${RUN_DIR:-${TMPDIR:-/tmp}/sparrow-grpo-demo}"
THREADS="${THREADS:-1}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
mkdir -p "$RUN_DIR"
start=$(date +%s)
python -m sparrow_server.cli serve --port "$PORT" --device cpu --threads "$THREADS" \
    --state-dir "$RUN_DIR/server-state" --adapter-root "$RUN_DIR" --log-level warning > "$RUN_DIR/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    kill -0 "$server" 2>/dev/null || { echo "server exited; see $RUN_DIR/server.log" >&2; exit 1; }
    sleep 1
done
echo "server healthy after $(( $(date +%s) - start )) s"
python examples/grpo_loop.py --server "http://127.0.0.1:$PORT" --out-dir "$RUN_DIR" "$@"
echo "end to end: $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# A GPU-host job that outlives one device call (10 minutes at most): a dense rollout of 33 x 32K tokens runs
# ~10 minutes on its own. The device tool kills what a call leaves running, except a new process session,
# which runs on while the host stays warm (calls back to back), so:
#   bash benchmarks/gpu_host/detached.sh start NAME CMD...   # copy the repo, run CMD in it under setsid
#   bash benchmarks/gpu_host/detached.sh wait NAME SECONDS   # until CMD ends or SECONDS pass; rc 0 = ended
#   bash benchmarks/gpu_host/detached.sh collect NAME DEST   # DEST/NAME.tar.gz of the job's folder
# CMD runs in a copy of the working tree (the next call re-sends the tree under a running job), with the
# copy first on PYTHONPATH, and writes what it keeps under "$JOB_OUT" (quote it so the job expands it).
# The job's folder ($DETACHED_ROOT/NAME, default /tmp/detached) holds job.log, rc once it has ended,
# started_at and ended_at (epoch seconds).
set -uo pipefail
ROOT_DIR="${DETACHED_ROOT:-/tmp/detached}"
verb="${1:-}"; name="${2:-}"
[ -n "$verb" ] && [ -n "$name" ] || { echo "usage: $0 start|wait|collect NAME ..." >&2; exit 2; }
job="$ROOT_DIR/$name"

start() {
  [ $# -gt 0 ] || { echo "start $name: no command" >&2; exit 2; }
  [ -e "$job" ] && { echo "start $name: $job exists (a job of that name already ran here)" >&2; exit 2; }
  mkdir -p "$job/repo" "$job/out"
  # the tree without the carried wheels: the job needs the code, not the kit it was installed from
  tar --exclude=./.whl --exclude=./.whl2 --exclude=./.kit --exclude=./.git -cf - . | tar -xf - -C "$job/repo"
  date +%s > "$job/started_at"
  # the command in a subshell of its own: an `exit` in it still leaves rc and ended_at behind
  (cd "$job/repo" && JOB_OUT="$job/out" PYTHONPATH="$job/repo${PYTHONPATH:+:$PYTHONPATH}" setsid bash -c \
     '(eval "$1") > "$JOB_OUT/../job.log" 2>&1; echo $? > "$JOB_OUT/../rc.tmp"; date +%s > "$JOB_OUT/../ended_at"
      mv "$JOB_OUT/../rc.tmp" "$JOB_OUT/../rc"' job "$*" < /dev/null > /dev/null 2>&1 &)
  echo "started $name in $job"
}

wait_for() {
  local limit="${1:?wait NAME SECONDS}" t0; t0=$(date +%s)
  [ -d "$job" ] || { echo "wait $name: no such job" >&2; exit 2; }
  while [ ! -e "$job/rc" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 2; done
  tail -n 15 "$job/job.log" 2>/dev/null
  if [ -e "$job/rc" ]; then echo "$name ended rc $(cat "$job/rc") after $(( $(cat "$job/ended_at") - $(cat "$job/started_at") )) s"; return 0; fi
  echo "$name still running after $(( $(date +%s) - $(cat "$job/started_at") )) s"; return 1
}

collect() {
  local dest="${1:?collect NAME DEST}"
  mkdir -p "$dest"
  tar -czf "$dest/$name.tar.gz" -C "$job" --exclude=./repo .
  echo "collected $dest/$name.tar.gz"
}

shift 2
case "$verb" in
  start) start "$@" ;;
  wait) wait_for "$@" ;;
  collect) collect "$@" ;;
  *) echo "unknown verb $verb (start, wait, collect)" >&2; exit 2 ;;
esac

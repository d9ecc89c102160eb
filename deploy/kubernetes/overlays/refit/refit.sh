#!/bin/sh
# Takes the records, refits the static tier, gates the candidate by replay, swaps the live config.
# Texts live no longer than one run: the taken files are deleted whatever the outcome, and a run
# killed before its own cleanup is cleaned up by the next one.
set -eu
live="${LIVE:-/var/lib/semantic-router}"
mkdir -p "$live/refit"
rm -f "$live"/refit/*/*.jsonl "$live"/refit/*/*.jsonl.*
run="$(mktemp -d "$live/refit/run.XXXXXX")"
trap 'rm -f "$run"/*.jsonl "$run"/*.jsonl.*' EXIT INT TERM
for f in "$live"/records/*.jsonl "$live"/records/*.jsonl.1; do
  if [ -e "$f" ]; then mv "$f" "$run/" || true; fi  # a router may rotate it away first: next run
done
ls "$run"/*.jsonl* >/dev/null 2>&1 || { echo "no records yet"; exit 0; }
sleep 5  # each router follows its moved file within a second (more on a network volume)
awk 1 "$run"/*.jsonl* > "$run/records.jsonl.part"  # whole lines: a file without its last newline stays apart
mv "$run/records.jsonl.part" "$run/records.jsonl.all"
semantic-router fit --config "$live/router.yaml" --from-records "$run/records.jsonl.all" \
  --out "$run/router.yaml" --report "$run/report.json"
if ! semantic-router replay --config "$run/router.yaml" --records "$run/records.jsonl.all" \
    --max-changed "${MAX_CHANGED:-0.01}"; then
  rm -f "$run"/*.npz "$run/router.yaml"
  echo "the replay gate refused the refit; the live config stays (figures: $run/report.json)"
  exit 3
fi
cp "$run/router.yaml" "$live/router.yaml.new" && mv "$live/router.yaml.new" "$live/router.yaml"
# The live config names this run's files (the static head and table); the runs before it go.
for d in "$live"/refit/*/; do [ "${d%/}" = "$run" ] || rm -rf "$d"; done
echo "refit swapped in: $run"

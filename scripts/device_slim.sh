#!/usr/bin/env bash
# The default model's weights (models/tinychat, ~80 MB) are more than a device call carries
# with the working tree (64 MiB in all). Around device calls that do not need the default model,
# take it out of what travels, and put it back before any commit:
#
#   bash scripts/device_slim.sh off   # untrack models/tinychat in the index and ignore it locally
#   ... device calls ...
#   bash scripts/device_slim.sh on    # track it again (nothing on disk ever changes)
#
# Only the index changes: the files stay on disk, so the app and the tests here keep working.
# `status` says which state the checkout is in; a commit made while "off" would delete the model,
# so `off` refuses when the index already holds other staged changes.
set -eu
cd "$(dirname "$0")/.."
ex="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$ex")"
case "${1:-status}" in
  off)
    git diff --cached --quiet || { echo "the index holds staged changes: commit them first"; exit 1; }
    git rm -r -q --cached models/tinychat
    grep -qx '/models/tinychat/' "$ex" 2>/dev/null || echo '/models/tinychat/' >> "$ex"
    echo "models/tinychat untracked for device calls; run '$0 on' before committing"
    ;;
  on)
    sed -i '\#^/models/tinychat/$#d' "$ex" 2>/dev/null || true
    git reset -q models/tinychat
    echo "models/tinychat tracked again"
    ;;
  status)
    if grep -qx '/models/tinychat/' "$ex" 2>/dev/null; then echo off; else echo on; fi
    ;;
  *) echo "usage: $0 off|on|status"; exit 2 ;;
esac
git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{printf "working tree that travels: %.1f MB\n", $1 / 1e6}'

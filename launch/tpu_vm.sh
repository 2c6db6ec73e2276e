#!/usr/bin/env bash
# Run a jaxrag config on every host of a Cloud TPU VM slice (template: fill in the names).
#   TPU=my-v5p-32 ZONE=us-east5-a CONFIG=configs/train_dpo.py WORKDIR=gs://bucket/runs/dpo ./launch/tpu_vm.sh
# jax.distributed.initialize() auto-detects the slice (JAXRAG_DISTRIBUTED=auto). The mesh in the config must
# multiply to the slice's chip count, e.g. --config.dpo.train.mesh="(1,16,1)" for FSDP over 16 chips.
set -euo pipefail
: "${TPU:?set TPU}" "${ZONE:?set ZONE}" "${CONFIG:?set CONFIG}" "${WORKDIR:?set WORKDIR}"
REPO=${REPO:-~/jaxrag}
gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all --command="
  cd $REPO && source .venv/bin/activate &&
  JAXRAG_DISTRIBUTED=auto python -m jaxrag.main --config=$CONFIG --workdir=$WORKDIR ${EXTRA_ARGS:-}
"

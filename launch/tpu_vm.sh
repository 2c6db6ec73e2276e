#!/usr/bin/env bash
# Run a jaxrag config on every host of a Cloud TPU VM slice (template: fill in the names).
#   TPU=my-v5p-32 ZONE=us-east5-a CONFIG=configs/train_dpo.py WORKDIR=/mnt/shared/runs/dpo ./launch/tpu_vm.sh
# WORKDIR must be one folder every host sees (an NFS / Filestore mount, or a GCS bucket mounted with gcsfuse):
# jaxrag writes through local paths and refuses gs:// URLs. Process 0 writes the shared files; see docs/multihost.md.
# jax.distributed.initialize() auto-detects the slice (JAXRAG_DISTRIBUTED=auto). The mesh in the config must
# multiply to the slice's chip count, e.g. --config.dpo.train.mesh="(1,16,1)" for FSDP over 16 chips.
set -euo pipefail
: "${TPU:?set TPU}" "${ZONE:?set ZONE}" "${CONFIG:?set CONFIG}" "${WORKDIR:?set WORKDIR}"
REPO=${REPO:-~/jaxrag}
gcloud compute tpus tpu-vm ssh "$TPU" --zone="$ZONE" --worker=all --command="
  cd $REPO && source .venv/bin/activate &&
  JAXRAG_DISTRIBUTED=auto python -m jaxrag.main --config=$CONFIG --workdir=$WORKDIR ${EXTRA_ARGS:-}
"

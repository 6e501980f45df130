#!/bin/bash
# Entrypoint of Shoal images: `docker run IMAGE train` or `serve` (what SageMaker runs).
# Names this host as the job does (resourceconfig.json's current_host) for every process
# started from here, then runs the command: `train` (the launcher) when none is given
# (inference images give `serve`, the model server, as their CMD).
set -euo pipefail

base_dir="${SAGEMAKER_BASE_DIR:-/opt/ml}"
resource_config="${base_dir}/input/config/resourceconfig.json"

if [ -z "${SHOAL_HOST:-}" ] && [ -f "${resource_config}" ]; then
    SHOAL_HOST="$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["current_host"])' "${resource_config}")"
    export SHOAL_HOST
fi
if [ -n "${SHOAL_HOST:-}" ]; then
    export LD_PRELOAD="/usr/local/lib/libshoal_hostname.so${LD_PRELOAD:+:${LD_PRELOAD}}"
fi

if [ "$#" -eq 0 ]; then
    set -- train
fi
exec "$@"

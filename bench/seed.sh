#!/bin/sh
# The seed's approach, re-created on the lab as the baseline for bench/run: the hand-written script that
# spark-vllm replaces. Stop everything (errors ignored), start the Ray head, start the worker, `sleep 5`, then
# `vllm serve` under nohup in the head container. It returns as soon as serve is launched: there is no
# readiness wait, as in the seed. node2 is reached through node1 (ProxyJump in the lab's ssh config), as the
# seed reached spark2 through spark1.
#
# Image, container flags, env and serve flags are those of spark-vllm's `lab` stack (catalog/clusters.yaml
# `lab`, catalog/models.yaml `lab-tiny`); bench/run compares both deployments' containers and serve command
# lines and reports any difference. The weights and the image are already on every lab node, so the seed's
# copy step has nothing to copy. MAX_MODEL_LEN may come from the environment: the serve-only change. SEED_SLEEP
# too: bench/run doubles it when a run never served, as the seed's operator would.
set -u
ssh="ssh -F $HOME/.cache/spark-vllm/lab/ssh_config"
HEAD=svl-lab-node1
WORKER=svl-lab-node2
HEAD_IP=10.87.200.11
WORKER_IP=10.87.200.12
IFACE=enp1s0f1np1
IMAGE=spark-vllm-lab/ray-vllm:2.60.0-double1
MODEL=/models/lab-tiny
MAX_MODEL_LEN=${MAX_MODEL_LEN:-4096}

# The flags spark-vllm's RayNode gives a lab container (no GPU, no RDMA, the lab host's ulimits). A worker
# also gets RAY_gcs_server_port_wait_time_s=120, as spark-vllm's do (it changes no timing here: the seed's
# worker starts after its head).
run_flags="--network host --ipc host --shm-size 256m
  --ulimit memlock=8388608:8388608 --ulimit nofile=20000:20000 --ulimit stack=67108864:67108864
  --mount type=bind,source=$MODEL,target=$MODEL,readonly
  --mount type=bind,source=/root/.cache/huggingface,target=/root/.cache/huggingface
  --restart no --entrypoint ray"

env_flags() {  # the node's fabric IP
  echo "-e VLLM_DOUBLE_SHARD_DELAY_S=0.1 -e VLLM_HOST_IP=$1 -e NCCL_SOCKET_IFNAME=$IFACE -e GLOO_SOCKET_IFNAME=$IFACE
    -e UCX_NET_DEVICES=$IFACE -e TP_SOCKET_IFNAME=$IFACE -e OMPI_MCA_btl_tcp_if_include=$IFACE
    -e MASTER_ADDR=$HEAD_IP -e RAY_memory_monitor_refresh_ms=0 -e RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
    -e RAY_prestart_worker_first_driver=0 -e AUTOSCALER_METRIC_PORT=44217 -e DASHBOARD_METRIC_PORT=44227"
}
# Ray's fixed ports, pinned as spark-vllm pins them (the seed left them to Ray; it changes no timing).
ports="--runtime-env-agent-port=6380 --dashboard-agent-grpc-port=6381 --metrics-export-port=6382
  --dashboard-agent-listen-port=52365"
workers="--min-worker-port=10002 --max-worker-port=19999"

echo "stop everything"
$ssh $HEAD docker rm -f seed-ray-head
$ssh $WORKER docker rm -f seed-ray-worker

echo "start head"
$ssh $HEAD docker run -d --name seed-ray-head $run_flags $(env_flags $HEAD_IP) $IMAGE \
  start --head --port=6379 --include-dashboard=false \
  --node-ip-address=$HEAD_IP --num-gpus=1 $ports --ray-client-server-port=10001 $workers \
  --disable-usage-stats --block

echo "start worker"
$ssh $WORKER docker run -d --name seed-ray-worker $run_flags $(env_flags $WORKER_IP) \
  -e RAY_gcs_server_port_wait_time_s=120 $IMAGE \
  start --address=$HEAD_IP:6379 --node-ip-address=$WORKER_IP --num-gpus=1 $ports $workers \
  --disable-usage-stats --block

sleep "${SEED_SLEEP:-5}"

echo "start serve"
$ssh $HEAD docker exec -d seed-ray-head sh -c "'nohup vllm serve $MODEL --served-model-name lab-tiny \
  --host 0.0.0.0 --port 8000 --tensor-parallel-size 2 --pipeline-parallel-size 1 \
  --distributed-executor-backend ray --gpu-memory-utilization 0.85 --load-format auto \
  --max-model-len $MAX_MODEL_LEN --enforce-eager > /root/vllm-serve.log 2>&1 &'"
echo "done"

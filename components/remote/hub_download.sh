# The Hub download (components/resources/weights_download.py), run on the node that downloads, sent over SSH on
# stdin: components/remote/hub_download.py inside the model's image, which carries huggingface_hub, as this user (so
# the files are theirs), on the host's network, with only the weights' folder mounted, writable.
# Arguments: container image path
set -u
name=$1 image=$2 path=$3
mkdir -p "$path" || exit 1
# A download that an earlier, interrupted `up` left running would write beside this one.
docker rm -f "$name" >/dev/null 2>&1
exec docker run --rm -i --init --name "$name" --network host --user "$(id -u):$(id -g)" -e HOME=/tmp \
  -e HF_HUB_DISABLE_TELEMETRY=1 -v "$path:$path" --entrypoint python3 "$image" - <<'SPARK_VLLM_PY'
@PROGRAM@
SPARK_VLLM_PY

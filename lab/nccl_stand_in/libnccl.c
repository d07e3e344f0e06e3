/* A stand-in for NCCL's shared library in the lab (docs/host-nccl.md): its soname, libnccl.so.2, and the first call
   vLLM's pynccl makes, nothing else. lab/labkit/images.py builds it twice, as the host's library and as the image's
   pip copy: one version, two builds, as on a Spark (vllm 41725). */
#define NCCL_VERSION_CODE 22809 /* 2.28.9: major * 10000 + minor * 100 + patch */

int ncclGetVersion(int *version) {
    *version = NCCL_VERSION_CODE;
    return 0; /* ncclSuccess */
}

const char spark_vllm_stand_in[] = STAND_IN;

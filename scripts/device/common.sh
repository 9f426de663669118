# Sourced by the device scripts: the environment every process there must keep (NVLink
# multicast off), the output folder $R=$OUT/$1, and a build of zerotrain into build-gpu
# (targets: the rest of the arguments; default zerotrain_cli; --no-build: none, for scripts
# that need only python3/torchrun). Prints the build time.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}; R=$OUT/$1; shift; mkdir -p $R; B=build-gpu; Z=$B/zerotrain
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/device.txt
if [ "${1:-}" = --no-build ]; then :
elif [ ! -f $B/build.ninja ]; then
  cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > $R/cmake.log 2>&1 || { tail -30 $R/cmake.log; exit 1; }
fi
if [ "${1:-}" != --no-build ]; then
  ninja -C $B ${@:-zerotrain_cli} > $R/build.log 2>&1 || { grep -E "error" $R/build.log | head -30; exit 1; }
  echo "build: $(( $(date +%s) - T0 )) s"
fi

// Rank discovery from the environment of the usual launchers.
#include <cstdlib>
#include <string>

#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::comm {
namespace {
bool env_int(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  ZT_CHECK_T(end != v && *end == '\0' && x >= 0, CommError, "environment variable ", name, "='", v,
             "' is not a non-negative integer");
  *out = static_cast<int>(x);
  return true;
}
// Local rank/size are hints only (Slurm writes e.g. "2(x3)"): unparsable means absent.
bool env_int_lenient(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || x < 0) return false;
  *out = static_cast<int>(x);
  return true;
}
// Reads one launcher's four variables; returns false when its rank variable is absent.
bool read_set(RankInfo* info, const char* src, const char* rank, const char* world, const char* local,
              const char* local_world) {
  RankInfo r;
  if (!env_int(rank, &r.rank)) return false;
  ZT_CHECK_T(env_int(world, &r.world_size), CommError, src, " environment has ", rank, " but no ", world);
  if (!env_int_lenient(local, &r.local_rank)) r.local_rank = r.rank;
  if (!env_int_lenient(local_world, &r.local_world_size)) r.local_world_size = r.world_size;
  ZT_CHECK_T(r.rank < r.world_size, CommError, src, " environment: ", rank, "=", r.rank, " is not below ", world,
             "=", r.world_size);
  r.source = src;
  *info = r;
  return true;
}
}  // namespace

RankInfo discover_rank() {
  RankInfo info;
  if (std::getenv("ZT_LAUNCHER") && read_set(&info, "zerotrain", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    return info;
  if (std::getenv("TORCHELASTIC_RUN_ID") || std::getenv("MASTER_ADDR")) {
    if (read_set(&info, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) return info;
  }
  if (read_set(&info, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"))
    return info;
  if (read_set(&info, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"))
    return info;
  if (read_set(&info, "env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) return info;
  return info;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

}  // namespace zt::comm

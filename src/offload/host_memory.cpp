#include "offload/host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <omp.h>
#include <torch/torch.h>

#ifdef ZT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::offload {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;

#ifdef ZT_WITH_CUDA
// Maps `bytes` (a multiple of a huge page) of anonymous memory and faults it in from every
// OpenMP thread: a single-threaded first touch (what cudaHostRegister would do) runs at a
// fraction of the host's memory bandwidth, which at hundreds of GiB is minutes.
void* map_touched(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ZT_CHECK_T(p != MAP_FAILED, Error, "offload: cannot map ", bytes, " bytes of host memory for offloaded state (",
             std::strerror(errno), "): lower the model size or offload to \"nvme\"");
  (void)madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fewer pages to fault and to register
  auto* c = static_cast<volatile char*>(p);
  const int64_t pages = static_cast<int64_t>(bytes / 4096);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pages; ++i) c[i * 4096] = 0;
  return p;
}
#endif

// The first number of a file (cgroup counters), or -1 ("max", missing, unreadable).
int64_t read_number(const char* path) {
  std::ifstream f(path);
  std::string word;
  if (!(f >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(word);
}

}  // namespace

int64_t host_memory_available(std::string* source) {
  auto say = [&](const char* s) {
    if (source) *source = s;
  };
  if (const char* e = std::getenv("ZT_HOST_MEMORY_AVAILABLE")) {
    say("ZT_HOST_MEMORY_AVAILABLE");
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    ZT_CHECK_T(end != e && *end == '\0' && v >= 0, ConfigError, "ZT_HOST_MEMORY_AVAILABLE='", e,
               "' is not a byte count: set it to a whole number of bytes, or unset it");
    return v;
  }
  int64_t avail = -1;
  {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    int64_t kib = 0;
    while (f >> key >> kib) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kib * 1024;
        say("MemAvailable in /proc/meminfo");
        break;
      }
    }
  }
  const struct {
    const char *limit, *usage, *name;
  } cgroups[] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current", "the cgroup's memory.max"},
                 {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                  "the cgroup's memory limit"}};
  for (const auto& c : cgroups) {
    const int64_t limit = read_number(c.limit), usage = read_number(c.usage);
    // v1 reports "no limit" as a huge number; anything above 2^60 is treated as none.
    if (limit < 0 || usage < 0 || limit > (int64_t{1} << 60)) continue;
    const int64_t room = std::max<int64_t>(0, limit - usage);
    if (avail < 0 || room < avail) {
      avail = room;
      say(c.name);
    }
    break;
  }
  return avail;
}

at::Tensor host_zeros(int64_t numel, at::ScalarType dtype, bool pin) {
  const auto opts = torch::TensorOptions().device(torch::kCPU).dtype(dtype);
#ifdef ZT_WITH_CUDA
  // ZT_PINNED_ALLOCATOR=torch: torch's caching pinned allocator instead (power-of-two
  // blocks), to compare the two on one machine.
  static const bool torch_pinned = [] {
    const char* e = std::getenv("ZT_PINNED_ALLOCATOR");
    return e != nullptr && std::string(e) == "torch";
  }();
  if (pin && torch_pinned) return torch::zeros({numel}, opts.pinned_memory(true));
  if (pin && numel > 0) {
    const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
    const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = map_touched(mapped);
    const cudaError_t rc = cudaHostRegister(p, mapped, cudaHostRegisterPortable);
    const bool pinned = rc == cudaSuccess;
    if (!pinned) {
      (void)cudaGetLastError();  // reset the last-error state so a later check does not report this one
      log::warn("offload: cudaHostRegister of %zu bytes failed (%s): this buffer stays "
                "pageable and its copies are synchronous (raise the locked-memory limit, ulimit -l)",
                   mapped, cudaGetErrorString(rc));
    }
    return torch::from_blob(
        p, {numel},
        [mapped, pinned](void* q) {
          if (pinned) (void)cudaHostUnregister(q);
          munmap(q, mapped);
        },
        opts);
  }
#else
  (void)pin;
#endif
  return torch::zeros({numel}, opts);
}

}  // namespace zt::offload

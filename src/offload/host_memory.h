// Host buffers of ZeRO-Offload: page-locked at their exact size.
//
// Torch's pinned allocator (CachingHostAllocator) rounds every block up to a power of two,
// so a 45 GiB fp32 shard would page-lock 64 GiB, and the 180 GiB of offloaded state of a
// 12B-parameter model would need 256 GiB of page-locked memory: more than the host has.
// host_zeros maps the buffer itself, has every OpenMP thread fault in its part (transparent
// huge pages advised), and registers exactly that range with cudaHostRegister, so the
// offloaded state costs its own size and its copies to and from the GPU are asynchronous.
#pragma once
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace zt::offload {

// A zero-filled CPU tensor of `numel` elements of `dtype`. With pin (CUDA builds): page-locked
// as above; its deleter unregisters and unmaps it. If the registration fails (e.g. a low
// RLIMIT_MEMLOCK), the buffer stays pageable and a line on stderr says so; is_pinned() tells.
// Without pin, or without CUDA: an ordinary zero-filled tensor.
at::Tensor host_zeros(int64_t numel, at::ScalarType dtype, bool pin);

// Bytes of host memory this process can still take: the smaller of /proc/meminfo's
// MemAvailable and the room left under the cgroup's limit (v2 memory.max - memory.current,
// or v1's limit - usage), with `source` saying which. ZT_HOST_MEMORY_AVAILABLE (bytes)
// overrides both (tests). -1 when none can be read.
int64_t host_memory_available(std::string* source = nullptr);

}  // namespace zt::offload

// Asynchronous file I/O for NVMe offload (ZeRO-Infinity): the optimizer state of the CPU
// Adam lives in swap files on an NVMe directory, is read back one sub-group ahead of the
// step and written back after it. Torch-free on purpose (only <zerotrain/error.h>).
//
// Contract:
//  - Engines. A SwapFile drives its file through io_uring (raw syscalls and our own mmap of
//    the rings; liburing is not needed) when the kernel allows it, and otherwise through a
//    small pool of threads doing pread/pwrite. Which engine, whether O_DIRECT is in use, and
//    every fallback are reported through the log callback from the constructor (on the
//    constructing thread): nothing falls back silently. An empty callback logs to stderr.
//  - Threads. A SwapFile is used from one thread at a time. Internally it owns one driver
//    thread (io_uring: it reaps completions and keeps queue_depth requests in flight while
//    the caller computes) or thread_count worker threads (fallback engine).
//  - Alignment. Buffers, file offsets and byte counts of every transfer are multiples of
//    kAioAlignment (4096), whether or not O_DIRECT is in use, so a layout that works on a
//    tmpfs test directory also works on an NVMe drive. Callers pad their regions to 4096;
//    AlignedBuffer sizes are rounded up already. A violation throws zt::Error naming the
//    file and the offending value.
//  - Ownership. A buffer passed to read_async/write_async must stay alive and untouched
//    (for reads: unread; for writes: unmodified) until wait() of its ticket, or wait_all(),
//    returns. The destructor waits for transfers still in flight (their errors are dropped),
//    so destroy a SwapFile before the buffers it may still be using.
//  - Errors. Path problems are zt::ConfigError (naming the path and the fix); I/O failures
//    are zt::Error naming the file, the operation, the offset, the byte count and strerror,
//    and are thrown from wait()/wait_all() of the transfer that failed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace zt::offload {

// DeepSpeed's "aio" section (see AioConfig in <zerotrain/config.h>), plus our switches.
struct AioOptions {
  int64_t block_size = 1 << 20;  // bytes per request: a transfer is split into requests of this size
                                 // (a multiple of 4096, at most 1 GiB)
  int64_t queue_depth = 8;       // io_uring: requests in flight per file
  int64_t thread_count = 1;      // threads of the fallback engine
  bool single_submit = false;    // io_uring: one io_uring_enter per request instead of batched
  bool overlap_events = true;    // io_uring: when false, a new batch starts only when the last completed
  bool use_o_direct = true;      // bypass the page cache (falls back, logged, where the filesystem refuses it)
  bool force_threads = false;    // use the thread engine even where io_uring works (tests, debugging)
};

constexpr size_t kAioAlignment = 4096;
// n rounded up to a multiple of a (a > 0).
inline int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// Log sink: one line per call, no trailing newline.
using AioLog = std::function<void(const std::string&)>;

// Page-aligned host buffer from posix_memalign; size rounded up to kAioAlignment; contents
// uninitialised. Move-only. AlignedBuffer(0) holds nothing (data() == nullptr).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// One swap file: created (truncating a stale one), preallocated to `bytes` rounded up to
// kAioAlignment, and removed on destruction. Move-only.
class SwapFile {
 public:
  SwapFile(std::string path, int64_t bytes, const AioOptions& opt, AioLog log);
  ~SwapFile();
  SwapFile(SwapFile&& other) noexcept;
  SwapFile& operator=(SwapFile&& other) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // Start a transfer of [offset, offset + bytes) of the file; returns its ticket. Any number
  // of transfers may be in flight; they complete independently. bytes == 0 is a no-op ticket.
  uint64_t read_async(int64_t offset, void* buf, int64_t bytes);
  uint64_t write_async(int64_t offset, const void* buf, int64_t bytes);
  // Block until the transfer is done; throws its error. Each ticket is waited at most once.
  void wait(uint64_t ticket);
  // Block until every transfer is done; forgets them all, then throws the first error (if any).
  void wait_all();

  const std::string& engine() const;  // "io_uring" or "threads"
  bool direct() const;                // opened with O_DIRECT
  const std::string& path() const;
  int64_t size() const;               // file size: bytes rounded up to kAioAlignment

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Before training: `path` (the value of config key `key`, e.g.
// "zero_optimization.offload_optimizer.nvme_path") exists, is a directory, is writable (a
// probe file is really created and removed, which catches read-only mounts even for root)
// and has at least `bytes_needed` bytes free (statvfs f_bavail). Throws zt::ConfigError
// naming the key, the path and the fix. Ranks sharing a drive should pass their total.
void check_nvme_path(const std::string& key, const std::string& path, int64_t bytes_needed);

}  // namespace zt::offload

// NVMe optimizer state: layout, staging buffers and the pipelined pass. See nvme_state.h
// ([NVMe Layout], [NVMe Pipeline]).
#include "offload/nvme_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef ZT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::offload {
namespace {

int64_t stride_of(int64_t numel) { return round_up(numel * static_cast<int64_t>(sizeof(float)), kAioAlignment); }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void say(const AioLog& log, const std::string& line) {
  if (log) {
    log(line);
  } else {
    log::warn("%s", line.c_str());
  }
}

}  // namespace

// Page-locks one staging buffer for asynchronous host-to-device copies; unregisters it on
// destruction. A failure (e.g. RLIMIT_MEMLOCK) leaves the buffer pageable, logged.
struct NvmeOptimizerState::Pin {
  void* ptr = nullptr;
  Pin(void* p, size_t bytes, const AioLog& log) {
#ifdef ZT_WITH_CUDA
    const cudaError_t rc = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (rc == cudaSuccess) {
      ptr = p;
    } else {
      (void)cudaGetLastError();  // reset the last-error state so a later check does not report this one
      say(log, detail::cat("nvme: cudaHostRegister of a ", bytes, "-byte staging buffer failed (",
                           cudaGetErrorString(rc), "): it stays pageable and its uploads are synchronous"));
    }
#else
    (void)p;
    (void)bytes;
    say(log, "nvme: pin_memory requested but this build has no CUDA: staging buffers stay pageable");
#endif
  }
  ~Pin() {
#ifdef ZT_WITH_CUDA
    if (ptr) (void)cudaHostUnregister(ptr);
#endif
  }
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
};

// An exclusive flock on the swap file's name. If the name still refers to the locked
// file when the lock is released (the SwapFile was never created, or failed), the
// placeholder is removed too.
class NvmeOptimizerState::PathLock {
 public:
  PathLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PathLock() {
    struct stat a {}, b {};
    if (::fstat(fd_, &a) == 0 && ::stat(path_.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
      ::unlink(path_.c_str());
    }
    ::close(fd_);  // releases the lock
  }
  PathLock(const PathLock&) = delete;
  PathLock& operator=(const PathLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_;
};

std::unique_ptr<NvmeOptimizerState::PathLock> NvmeOptimizerState::claim(const std::string& dir,
                                                                         const std::string& stem) {
  constexpr int kMaxNames = 64;
  const std::string base = dir + (!dir.empty() && dir.back() == '/' ? "" : "/") + stem;
  int retries = 0;
  for (int n = 0; n < kMaxNames; ++n) {
    const std::string path = base + (n == 0 ? "" : "." + std::to_string(n)) + ".swp";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      throw ConfigError(detail::cat("cannot create NVMe swap file '", path, "': ", std::strerror(err),
                                    ": make sure the offload nvme_path directory exists and is writable"));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EWOULDBLOCK) continue;  // another engine's file: try the next name
      throw Error(detail::cat("cannot lock NVMe swap file '", path, "': ", std::strerror(err)));
    }
    // The name may have been removed (and re-created) by its previous owner between our
    // open and our lock: the lock must be on the file the name refers to now.
    struct stat a {}, b {};
    if (::fstat(fd, &a) != 0 || ::stat(path.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
      ::close(fd);
      if (++retries < 16) --n;  // the same name again (bounded: a name that keeps changing is skipped)
      continue;
    }
    return std::make_unique<PathLock>(path, fd);
  }
  throw ConfigError(detail::cat("NVMe swap files '", base, ".swp' up to '.", kMaxNames - 1, ".swp' are all in use by ",
                                "other zerotrain engines: give each job its own offload nvme_path"));
}

std::vector<int64_t> NvmeOptimizerState::split(int64_t total, int64_t sub_group) {
  ZT_ASSERT(total > 0 && sub_group > 0, "split(", total, ", ", sub_group, ")");
  std::vector<int64_t> out;
  for (int64_t at = 0; at < total; at += sub_group) out.push_back(std::min(sub_group, total - at));
  return out;
}

int64_t NvmeOptimizerState::file_bytes_for(const std::vector<int64_t>& group_numels) {
  int64_t bytes = 0;
  for (int64_t n : group_numels) bytes += 3 * stride_of(n);
  return bytes;
}

namespace {
// Checked before anything is created (numel_ is the first member initialised).
std::vector<int64_t> checked(std::vector<int64_t> numels, const NvmeStateOptions& opt) {
  ZT_CHECK_T(opt.buffer_count >= 1, ConfigError, "zero_optimization.offload_optimizer.buffer_count = ",
             opt.buffer_count, ": NVMe offload needs at least 1 staging buffer; use 4");
  ZT_ASSERT(!numels.empty() && opt.scratch_bytes_per_element >= 0, "NVMe state without sub-groups");
  for (int64_t n : numels) ZT_ASSERT(n > 0, "empty NVMe sub-group");
  return numels;
}
}  // namespace

NvmeOptimizerState::NvmeOptimizerState(std::vector<int64_t> group_numels, NvmeStateOptions opt)
    : numel_(checked(std::move(group_numels), opt)),
      log_(opt.log),
      lock_(claim(opt.dir, opt.stem)),
      file_(lock_->path(), file_bytes_for(numel_), opt.aio, opt.log) {
  int64_t begin = 0, offset = 0;
  for (int64_t n : numel_) {
    begin_.push_back(begin);
    stride_.push_back(stride_of(n));
    offset_.push_back(offset);
    begin += n;
    offset += 3 * stride_.back();
    max_stride_ = std::max(max_stride_, stride_.back());
  }
  const int64_t max_numel = *std::max_element(numel_.begin(), numel_.end());
  scratch_offset_ = 3 * max_stride_;
  const int64_t bytes = scratch_offset_ + round_up(opt.scratch_bytes_per_element * max_numel, kAioAlignment);
  pinned_ = make_buffers(std::min<int64_t>(opt.buffer_count, num_groups()), bytes, opt.pin, opt.log, buffers_, pins_);
  write_pending_.assign(buffers_.size(), false);
  write_ticket_.assign(buffers_.size(), 0);
  fence_due_.assign(buffers_.size(), false);
}

NvmeOptimizerState::~NvmeOptimizerState() {
  try {
    file_.wait_all();
  } catch (const std::exception& e) {
    log::error("nvme: a swap-file transfer failed during shutdown: %s", e.what());
  }
  fence_in_use(fence_due_, fence_, "staging buffer");
}

bool NvmeOptimizerState::make_buffers(int64_t count, int64_t bytes, bool pin, const AioLog& log,
                                      std::vector<AlignedBuffer>& out, std::vector<std::unique_ptr<Pin>>& pins) {
  for (int64_t k = 0; k < count; ++k) {
    out.emplace_back(static_cast<size_t>(bytes));
    // Padding is swapped too: keep it deterministic (zeros) rather than uninitialised.
    std::memset(out.back().data(), 0, out.back().size());
  }
  if (!pin) return false;
  bool all = true;
  for (auto& b : out) {
    pins.push_back(std::make_unique<Pin>(b.data(), b.size(), log));
    all = all && pins.back()->ptr != nullptr;
  }
  return all;
}

void NvmeOptimizerState::fence_in_use(const std::vector<bool>& due, const std::function<void(int)>& fence,
                                      const char* what) {
  for (int k = 0; k < static_cast<int>(due.size()); ++k) {
    if (!due[k] || !fence) continue;
    try {
      fence(k);
    } catch (const std::exception& e) {
      log::error("nvme: waiting for an upload from %s %d failed: %s", what, k, e.what());
    }
  }
}

int64_t NvmeOptimizerState::staging_bytes() const {
  int64_t n = 0;
  for (const auto& b : buffers_) n += static_cast<int64_t>(b.size());
  return n;
}

void NvmeOptimizerState::acquire(int k) {
  if (write_pending_[k]) {
    const auto t0 = std::chrono::steady_clock::now();
    write_pending_[k] = false;
    file_.wait(write_ticket_[k]);
    stats_.write_wait_ms += ms_since(t0);
  }
  if (fence_due_[k]) {
    fence_due_[k] = false;
    if (fence_) fence_(k);
  }
}

void NvmeOptimizerState::pass(Mode mode, const Visit& visit) {
  const bool reads = mode != Mode::kWrite, writes = mode != Mode::kRead;
  const int G = num_groups(), B = num_buffers();
  stats_ = PassStats{};
  std::vector<uint64_t> read_ticket(G, 0);
  int next_read = 0;  // first sub-group whose read is not issued yet
  auto issue_read = [&](int g) {
    const int k = g % B;
    acquire(k);
    read_ticket[g] = file_.read_async(offset_[g], buffers_[k].data(), region_bytes(g));
    stats_.bytes_read += region_bytes(g);
  };
  try {
    if (reads) {
      for (; next_read < std::min(G, B); ++next_read) issue_read(next_read);
    }
    for (int g = 0; g < G; ++g) {
      const int k = g % B;
      if (reads) {
        if (next_read <= g) issue_read(next_read++);
        const auto t0 = std::chrono::steady_clock::now();
        file_.wait(read_ticket[g]);
        stats_.read_wait_ms += ms_since(t0);
      } else {
        acquire(k);
      }
      char* base = static_cast<char*>(buffers_[k].data());
      Staged s;
      s.group = g;
      s.buffer = k;
      s.begin = begin_[g];
      s.numel = numel_[g];
      s.master = reinterpret_cast<float*>(base);
      s.exp_avg = reinterpret_cast<float*>(base + stride_[g]);
      s.exp_avg_sq = reinterpret_cast<float*>(base + 2 * stride_[g]);
      s.scratch = buffers_[k].size() > static_cast<size_t>(scratch_offset_) ? base + scratch_offset_ : nullptr;
      stats_.max_reads_ahead = std::max(stats_.max_reads_ahead, reads ? next_read - g - 1 : 0);
      const auto t0 = std::chrono::steady_clock::now();
      fence_due_[k] = true;  // the visit may start readers of the buffer (uploads)
      visit(s);
      stats_.visit_ms += ms_since(t0);
      if (writes) {
        write_ticket_[k] = file_.write_async(offset_[g], base, region_bytes(g));
        write_pending_[k] = true;
        stats_.bytes_written += region_bytes(g);
      }
      // Refill: the buffer of g + B - 1 is the one g - 1 used; its write had this visit's time.
      if (reads) {
        for (; next_read < G && next_read < g + B; ++next_read) issue_read(next_read);
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < B; ++k) {
      if (!write_pending_[k]) continue;
      write_pending_[k] = false;
      file_.wait(write_ticket_[k]);
    }
    stats_.write_wait_ms += ms_since(t0);
  } catch (...) {
    // Nothing may still use the buffers when the exception leaves (reads into them, or
    // writes from them); the first error is the one that propagates.
    std::fill(write_pending_.begin(), write_pending_.end(), false);
    try {
      file_.wait_all();
    } catch (const std::exception& e) {
      say(log_, detail::cat("nvme: another swap-file transfer failed while handling an error: ", e.what()));
    }
    throw;
  }
}

// ---- [NVMe Params] --------------------------------------------------------------------

namespace {
constexpr int64_t kPage = static_cast<int64_t>(kAioAlignment);
}  // namespace

NvmeParamFile::NvmeParamFile(int64_t bytes, int64_t max_read_bytes, NvmeStateOptions opt)
    : bytes_(bytes),
      lock_(NvmeOptimizerState::claim(opt.dir, opt.stem)),
      file_(lock_->path(), round_up(std::max<int64_t>(1, bytes), kPage), opt.aio, opt.log) {
  ZT_CHECK_T(opt.buffer_count >= 1, ConfigError, "zero_optimization.offload_param.buffer_count = ", opt.buffer_count,
             ": parameters on NVMe need at least 1 staging buffer; use 5");
  ZT_ASSERT(bytes > 0 && max_read_bytes > 0, "NvmeParamFile(", bytes, ", ", max_read_bytes, ")");
  // A range starting mid-page covers one page more than its length rounded up.
  const int64_t slot = round_up(max_read_bytes, kPage) + kPage;
  pinned_ = NvmeOptimizerState::make_buffers(opt.buffer_count, slot, opt.pin, opt.log, slots_, pins_);
  constexpr int64_t kWriteChunk = int64_t{64} << 20;
  wbuf_ = AlignedBuffer(static_cast<size_t>(std::min(kWriteChunk, round_up(bytes, kPage) + 2 * kPage)));
  fence_due_.assign(slots_.size(), false);
}

NvmeParamFile::~NvmeParamFile() { NvmeOptimizerState::fence_in_use(fence_due_, fence_, "parameter slot"); }

int64_t NvmeParamFile::staging_bytes() const {
  int64_t b = static_cast<int64_t>(wbuf_.size());
  for (const auto& s : slots_) b += static_cast<int64_t>(s.size());
  return b;
}

void NvmeParamFile::transfer(bool write, int64_t offset, void* buf, int64_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t t = write ? file_.write_async(offset, buf, bytes) : file_.read_async(offset, buf, bytes);
  file_.wait(t);
  (write ? stats_.write_ms : stats_.read_ms) += ms_since(t0);
  (write ? stats_.bytes_written : stats_.bytes_read) += bytes;
}

NvmeParamFile::View NvmeParamFile::read(int64_t offset, int64_t bytes) {
  ZT_ASSERT(offset >= 0 && bytes > 0 && offset + bytes <= bytes_, "parameter read [", offset, ", +", bytes,
            ") outside the ", bytes_, "-byte shard");
  const int64_t a = kPage;
  const int64_t a0 = offset / a * a, a1 = round_up(offset + bytes, a);
  const int slot = next_;
  ZT_ASSERT(a1 - a0 <= static_cast<int64_t>(slots_[slot].size()), "parameter read of ", bytes,
            " bytes is larger than its staging slot");
  next_ = (next_ + 1) % num_buffers();
  if (fence_due_[slot] && fence_) fence_(slot);  // an upload may still read the slot
  fence_due_[slot] = true;
  transfer(false, a0, slots_[slot].data(), a1 - a0);
  return View{static_cast<const char*>(slots_[slot].data()) + (offset - a0), slot};
}

void NvmeParamFile::write(int64_t offset, const void* src, int64_t bytes) {
  ZT_ASSERT(offset >= 0 && bytes >= 0 && offset + bytes <= bytes_, "parameter write [", offset, ", +", bytes,
            ") outside the ", bytes_, "-byte shard");
  const int64_t a = kPage, cap = static_cast<int64_t>(wbuf_.size());
  const int64_t end = offset + bytes;
  char* w = static_cast<char*>(wbuf_.data());
  for (int64_t pos = offset; pos < end;) {
    const int64_t a0 = pos / a * a;
    const int64_t a1 = std::min(round_up(end, a), a0 + cap);
    const int64_t stop = std::min(end, a1);  // data in this chunk: [pos, stop)
    const bool head = pos > a0, tail = stop < a1;
    if (head) transfer(false, a0, w, a);  // the first page's bytes before pos
    if (tail && !(head && a1 - a == a0)) transfer(false, a1 - a, w + (a1 - a - a0), a);
    std::memcpy(w + (pos - a0), static_cast<const char*>(src) + (pos - offset), static_cast<size_t>(stop - pos));
    transfer(true, a0, w, a1 - a0);
    pos = stop;
  }
}

}  // namespace zt::offload

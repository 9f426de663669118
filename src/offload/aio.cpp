// Asynchronous swap-file I/O for NVMe offload: an io_uring engine (raw syscalls, our own
// ring mmaps) and a pread/pwrite thread-pool fallback behind one SwapFile. See aio.h for
// the contract (one caller thread, 4096-byte alignment, buffer lifetime, errors).
//
// Shape: a transfer (one ticket) is split into requests of block_size bytes. Requests wait
// in a FIFO queue; the engine moves them to the kernel (io_uring: at most queue_depth in
// flight, each in a "slot") or to a worker thread. Progress does not depend on the caller
// calling in: the io_uring driver thread reaps completions and refills the ring, so a read
// of the next sub-group proceeds in full while the caller runs the optimizer step.
// All engine state is guarded by Engine::mu_; the caller thread and the engine's threads
// meet only there. The io_uring CQ is touched by the driver thread alone (no lock needed
// for it); the SQ is written under mu_ by whichever thread submits.
#include "offload/aio.h"

#include <fcntl.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::offload {
namespace {

// A request that keeps failing with EAGAIN/EINTR without progress is given up after this
// many tries, so a wedged device surfaces as an error instead of a spinning thread.
constexpr int kMaxRetries = 1000;
constexpr int64_t kMaxBlockSize = int64_t{1} << 30;  // io_uring's len is 32-bit; keep well inside
constexpr int64_t kMaxRingEntries = 4096;            // every kernel with io_uring accepts this many

std::string errno_text(int err) {
  char buf[128];
  // GNU strerror_r: thread-safe, returns a pointer to the message (maybe not into buf).
  return ::strerror_r(err, buf, sizeof buf);
}

std::string human_bytes(uint64_t b) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 6) v /= 1024.0, ++u;
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return std::string(buf) + " (" + std::to_string(b) + " bytes)";
}

// RAII file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// RAII shared mapping (the io_uring rings).
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* p, size_t n) : p_(p), n_(n) {}
  ~Mapping() {
    if (p_) ::munmap(p_, n_);
  }
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      if (p_) ::munmap(p_, n_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = o.n_;
    }
    return *this;
  }
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

void emit(const AioLog& log, const std::string& line) {
  // No silent fallbacks: without a sink the line still reaches stderr.
  if (log) {
    log(line);
  } else {
    log::warn("%s", line.c_str());
  }
}

// One piece of a transfer: at most block_size bytes, all offsets 4096-aligned.
struct Request {
  uint64_t ticket = 0;
  bool write = false;
  char* buf = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct Transfer {
  bool write = false;
  int64_t offset = 0;     // of the whole transfer, for error messages
  int64_t bytes = 0;
  int64_t pending = 0;    // requests not finished yet
  std::string error;      // first failure
};

// Shared part of both engines: tickets, the request queue, completion bookkeeping.
class Engine {
 public:
  Engine(const std::string& path, int fd, const AioOptions& opt) : path_(path), fd_(fd), opt_(opt) {}
  virtual ~Engine() = default;
  virtual const char* name() const = 0;
  virtual std::string describe() const = 0;  // for the log line of the constructor

  uint64_t start(bool write, char* buf, int64_t offset, int64_t bytes) {
    std::unique_lock lk(mu_);
    const uint64_t ticket = next_ticket_++;
    Transfer& t = transfers_[ticket];
    t.write = write;
    t.offset = offset;
    t.bytes = bytes;
    if (!broken_.empty()) {
      t.error = broken_;
      return ticket;
    }
    for (int64_t done = 0; done < bytes; done += opt_.block_size) {
      queue_.push_back(Request{ticket, write, buf + done, offset + done, std::min(opt_.block_size, bytes - done)});
      ++t.pending;
    }
    if (t.pending > 0) {
      ++busy_;
      on_queued();
    }
    return ticket;
  }

  void wait(uint64_t ticket) {
    std::unique_lock lk(mu_);
    auto it = transfers_.find(ticket);
    ZT_CHECK(it != transfers_.end(), "aio: wait on unknown ticket ", ticket, " for '", path_,
             "' (a ticket is waited once, and only on the SwapFile that issued it)");
    Transfer& t = it->second;  // references into unordered_map survive rehashing
    done_cv_.wait(lk, [&] { return t.pending == 0; });
    std::string err = std::move(t.error);
    transfers_.erase(it);
    lk.unlock();
    if (!err.empty()) throw Error(err);
  }

  void wait_all() {
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return busy_ == 0; });
    // Report the earliest-issued failure, so the message does not depend on hash order.
    std::string first;
    uint64_t first_ticket = ~uint64_t{0};
    int64_t failed = 0;
    for (auto& [ticket, t] : transfers_) {
      if (t.error.empty()) continue;
      ++failed;
      if (ticket < first_ticket) {
        first_ticket = ticket;
        first = std::move(t.error);
      }
    }
    transfers_.clear();
    lk.unlock();
    if (failed > 1) first += " (and " + std::to_string(failed - 1) + " more failed transfer(s))";
    if (!first.empty()) throw Error(first);
  }

 protected:
  // Called with mu_ held after requests were appended to queue_.
  virtual void on_queued() = 0;

  // Mark one request finished (mu_ held).
  void finish(const Request& r, std::string error) {
    Transfer& t = transfers_.at(r.ticket);
    if (!error.empty() && t.error.empty()) t.error = std::move(error);
    if (--t.pending == 0) {
      --busy_;
      done_cv_.notify_all();
    }
  }

  // Fail everything still queued (mu_ held); used once the engine cannot go on.
  void fail_queued(const std::string& why) {
    while (!queue_.empty()) {
      Request r = queue_.front();
      queue_.pop_front();
      finish(r, why);
    }
  }

  std::string io_error(const Request& r, int64_t done, const char* op, const std::string& what) const {
    const Transfer& t = transfers_.at(r.ticket);
    return detail::cat("aio ", r.write ? "write" : "read", " of '", path_, "' failed: ", op, " of ", r.bytes - done,
                       " bytes at offset ", r.offset + done, " (part of a ", t.bytes, "-byte transfer at offset ",
                       t.offset, ", ", name(), " engine): ", what);
  }

  // Wait until nothing is in flight (used by destructors before stopping threads).
  void drain(std::unique_lock<std::mutex>& lk) {
    done_cv_.wait(lk, [&] { return busy_ == 0; });
  }

  const std::string& path_;
  const int fd_;
  const AioOptions opt_;
  std::mutex mu_;
  std::condition_variable done_cv_;  // a transfer finished
  std::deque<Request> queue_;        // requests not yet handed to the kernel / a worker
  std::unordered_map<uint64_t, Transfer> transfers_;
  int64_t busy_ = 0;                 // transfers with pending > 0
  uint64_t next_ticket_ = 1;
  std::string broken_;               // set when the engine can no longer do I/O
};

// --- thread engine -----------------------------------------------------------------------

class ThreadEngine final : public Engine {
 public:
  ThreadEngine(const std::string& path, int fd, const AioOptions& opt) : Engine(path, fd, opt) {
    try {
      for (int64_t i = 0; i < opt.thread_count; ++i) workers_.emplace_back([this] { run(); });
    } catch (const std::exception& e) {
      stop_workers();
      throw Error(detail::cat("aio: cannot start ", opt.thread_count, " I/O threads for '", path, "': ", e.what()));
    }
  }
  ~ThreadEngine() override {
    {
      std::unique_lock lk(mu_);
      drain(lk);
    }
    stop_workers();
  }
  const char* name() const override { return "threads"; }
  std::string describe() const override { return detail::cat("thread engine, ", opt_.thread_count, " thread(s)"); }

 private:
  void on_queued() override { work_cv_.notify_all(); }

  void stop_workers() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void run() {
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      const Request r = queue_.front();
      queue_.pop_front();
      lk.unlock();
      std::string err = transfer(r);
      lk.lock();
      finish(r, std::move(err));
    }
  }

  // Blocking transfer of one request; handles short transfers, EINTR and EAGAIN.
  std::string transfer(const Request& r) {
    int64_t done = 0;
    int retries = 0;
    while (done < r.bytes) {
      const ssize_t n = r.write ? ::pwrite(fd_, r.buf + done, r.bytes - done, r.offset + done)
                                : ::pread(fd_, r.buf + done, r.bytes - done, r.offset + done);
      if (n < 0) {
        const int err = errno;
        if ((err == EINTR || err == EAGAIN) && ++retries < kMaxRetries) continue;
        std::lock_guard lk(mu_);  // io_error reads transfers_
        return io_error(r, done, r.write ? "pwrite" : "pread", errno_text(err));
      }
      if (n == 0) {
        std::lock_guard lk(mu_);
        return io_error(r, done, r.write ? "pwrite" : "pread",
                        r.write ? "the device accepted 0 bytes" : "unexpected end of file (was the file truncated?)");
      }
      done += n;
      retries = 0;
    }
    return {};
  }

  std::condition_variable work_cv_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

// --- io_uring engine ---------------------------------------------------------------------

// Thrown (and caught by SwapFile) when io_uring cannot be used here; the message says why.
class UringUnavailable : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

int uring_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, p));
}
int uring_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}

class UringEngine final : public Engine {
 public:
  // notes: lines for the log (opcode fallback), delivered by the caller on its thread.
  UringEngine(const std::string& path, int fd, const AioOptions& opt, std::vector<std::string>& notes)
      : Engine(path, fd, opt) {
    io_uring_params p{};
    // Clamp ourselves rather than with IORING_SETUP_CLAMP, which kernels before 5.6 refuse
    // (and those are the kernels that need the READV/WRITEV fallback below).
    const int rfd = uring_setup(static_cast<unsigned>(std::min<int64_t>(opt.queue_depth, kMaxRingEntries)), &p);
    if (rfd < 0) throw UringUnavailable("io_uring_setup failed: " + errno_text(errno));
    ring_fd_ = Fd(rfd);
    map_rings(p);
    // Every slot holds at most one SQE (unsubmitted or in the kernel) and the CQ has twice
    // the SQ's entries, so neither ring can overflow.
    const int64_t slots = std::min<int64_t>(opt.queue_depth, p.sq_entries);
    slots_.resize(slots);
    for (int64_t s = slots - 1; s >= 0; --s) free_.push_back(static_cast<uint32_t>(s));
    probe(notes);
    driver_ = std::thread([this] { drive(); });
  }

  ~UringEngine() override {
    {
      std::unique_lock lk(mu_);
      drain(lk);
      stop_ = true;
    }
    work_cv_.notify_all();
    if (driver_.joinable()) driver_.join();
  }

  const char* name() const override { return "io_uring"; }
  std::string describe() const override {
    const auto depth = static_cast<int64_t>(slots_.size());
    return detail::cat("io_uring engine, queue_depth ", depth,
                       depth != opt_.queue_depth ? detail::cat(" (clamped from ", opt_.queue_depth, ")") : "",
                       opt_.single_submit ? ", single submit" : ", batched submit",
                       opt_.overlap_events ? ", overlapped events" : ", one batch at a time",
                       vectored_ ? ", IORING_OP_READV/WRITEV" : "");
  }

 private:
  struct Slot {
    Request req;
    int64_t done = 0;  // bytes of req already transferred (short transfers resubmit the rest)
    int retries = 0;
    iovec iov{};       // READV/WRITEV: must stay valid until the request completes
  };

  void map_rings(const io_uring_params& p) {
    const size_t sq_bytes = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    const size_t cq_bytes = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    auto map = [&](size_t n, off_t what) {
      void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd_.get(), what);
      if (m == MAP_FAILED) throw UringUnavailable("mmap of the io_uring rings failed: " + errno_text(errno));
      return Mapping(m, n);
    };
    sq_map_ = map(single ? std::max(sq_bytes, cq_bytes) : sq_bytes, IORING_OFF_SQ_RING);
    if (!single) cq_map_ = map(cq_bytes, IORING_OFF_CQ_RING);
    sqe_map_ = map(p.sq_entries * sizeof(io_uring_sqe), IORING_OFF_SQES);
    char* sq = sq_map_.get();
    char* cq = single ? sq : cq_map_.get();
    sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    sq_mask_ = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    sq_entries_ = p.sq_entries;
    sq_array_ = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    sqes_ = reinterpret_cast<io_uring_sqe*>(sqe_map_.get());
    cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    cq_mask_ = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    // We are the only producer of the SQ tail; start from what the kernel set up.
    sq_tail_local_ = __atomic_load_n(sq_tail_, __ATOMIC_ACQUIRE);
  }

  // First use of the ring, synchronous, before the driver thread exists: write and read
  // back the (zero-filled) first block. Kernels before 5.6 answer IORING_OP_READ/WRITE
  // with -EINVAL in the CQE; then READV/WRITEV are tried. Any other failure means this
  // ring cannot do our I/O and the caller falls back to the thread engine (logged).
  void probe(std::vector<std::string>& notes) {
    void* mem = nullptr;
    if (::posix_memalign(&mem, kAioAlignment, kAioAlignment) != 0) throw std::bad_alloc();
    std::unique_ptr<void, decltype(&std::free)> buf(mem, &std::free);
    std::memset(mem, 0, kAioAlignment);
    auto try_once = [&](bool write) {
      Slot& s = slots_[0];
      s = Slot{};
      s.req = Request{0, write, static_cast<char*>(mem), 0, static_cast<int64_t>(kAioAlignment)};
      prepare(0);
      int r;
      do r = uring_enter(ring_fd_.get(), 1, 1, IORING_ENTER_GETEVENTS);
      while (r < 0 && errno == EINTR);
      if (r < 0) throw UringUnavailable("io_uring_enter failed: " + errno_text(errno));
      if (r == 0) throw UringUnavailable("io_uring_enter took no submission");
      unsubmitted_ = 0;
      // The submitted SQE produces a CQE; wait if it is not posted yet (r counts submissions).
      while (__atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE) == __atomic_load_n(cq_head_, __ATOMIC_RELAXED)) {
        int w = uring_enter(ring_fd_.get(), 0, 1, IORING_ENTER_GETEVENTS);
        if (w < 0 && errno != EINTR) throw UringUnavailable("io_uring_enter failed: " + errno_text(errno));
      }
      const unsigned head = __atomic_load_n(cq_head_, __ATOMIC_RELAXED);
      const int res = cqes_[head & cq_mask_].res;
      __atomic_store_n(cq_head_, head + 1, __ATOMIC_RELEASE);
      return res;
    };
    for (bool write : {true, false}) {
      int res = try_once(write);
      if (res == -EINVAL && !vectored_) {
        notes.push_back(detail::cat("aio: the kernel rejected IORING_OP_", write ? "WRITE" : "READ", " (",
                                    errno_text(EINVAL), ") for '", path_,
                                    "': using IORING_OP_READV/WRITEV (kernel older than 5.6)"));
        vectored_ = true;
        res = try_once(write);
      }
      if (res < 0) {
        throw UringUnavailable(detail::cat("a probe ", write ? "write" : "read", " of ", kAioAlignment,
                                           " bytes through io_uring failed: ", errno_text(-res)));
      }
    }
  }

  void on_queued() override { submit_ready(); }

  // Write the SQE for slot s (its remaining bytes) and publish it (mu_ held, or before the
  // driver thread exists).
  void prepare(uint32_t s) {
    ZT_ASSERT(sq_tail_local_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE) < sq_entries_, "SQ ring full");
    Slot& sl = slots_[s];
    const unsigned idx = sq_tail_local_ & sq_mask_;
    io_uring_sqe* sqe = &sqes_[idx];
    std::memset(sqe, 0, sizeof *sqe);
    char* p = sl.req.buf + sl.done;
    const auto len = static_cast<unsigned>(sl.req.bytes - sl.done);
    if (vectored_) {
      sl.iov = iovec{p, len};
      sqe->opcode = sl.req.write ? IORING_OP_WRITEV : IORING_OP_READV;
      sqe->addr = reinterpret_cast<uint64_t>(&sl.iov);
      sqe->len = 1;
    } else {
      sqe->opcode = sl.req.write ? IORING_OP_WRITE : IORING_OP_READ;
      sqe->addr = reinterpret_cast<uint64_t>(p);
      sqe->len = len;
    }
    sqe->fd = fd_;
    sqe->off = static_cast<uint64_t>(sl.req.offset + sl.done);
    sqe->user_data = s;
    sq_array_[idx] = idx;
    // Release: the SQE and array entry are visible to the kernel before the new tail.
    __atomic_store_n(sq_tail_, ++sq_tail_local_, __ATOMIC_RELEASE);
    ++unsubmitted_;
  }

  // Hand published SQEs to the kernel (mu_ held). EAGAIN/EBUSY leave them for the driver
  // to retry; anything else breaks the engine (all outstanding work fails, loudly).
  void enter_submit() {
    while (unsubmitted_ > 0) {
      const int r = uring_enter(ring_fd_.get(), unsubmitted_, 0, 0);
      if (r > 0) {
        unsubmitted_ -= r;
        in_kernel_ += r;
        continue;
      }
      const int err = r == 0 ? EAGAIN : errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EBUSY) break;
      break_engine(detail::cat("aio: io_uring_enter (submit) on '", path_, "' failed: ", errno_text(err)));
      return;
    }
    work_cv_.notify_all();
  }

  // Move retries and queued requests into the ring (mu_ held).
  void submit_ready() {
    if (!broken_.empty()) {
      fail_queued(broken_);
      return;
    }
    // overlap_events=false: a batch (up to queue_depth requests) is submitted only when
    // the previous batch completed entirely.
    const bool may_start = opt_.overlap_events || free_.size() == slots_.size();
    auto submitted = [&] {
      if (opt_.single_submit) enter_submit();
    };
    // Resubmissions (short transfers, EAGAIN) already own a slot.
    while (!retry_.empty()) {
      const uint32_t s = retry_.back();
      retry_.pop_back();
      prepare(s);
      submitted();
    }
    while (may_start && !free_.empty() && !queue_.empty()) {
      const uint32_t s = free_.back();
      free_.pop_back();
      slots_[s] = Slot{};
      slots_[s].req = queue_.front();
      queue_.pop_front();
      prepare(s);
      submitted();
    }
    enter_submit();
  }

  // Slot s is done (mu_ held).
  void release(uint32_t s, std::string error) {
    free_.push_back(s);
    finish(slots_[s].req, std::move(error));
  }

  // One completion (mu_ held).
  void complete(const io_uring_cqe& c) {
    const auto s = static_cast<uint32_t>(c.user_data);
    Slot& sl = slots_[s];
    const char* op = vectored_ ? (sl.req.write ? "IORING_OP_WRITEV" : "IORING_OP_READV")
                               : (sl.req.write ? "IORING_OP_WRITE" : "IORING_OP_READ");
    if (c.res < 0) {
      const int err = -c.res;
      if ((err == EAGAIN || err == EINTR) && ++sl.retries < kMaxRetries) {
        retry_.push_back(s);
      } else {
        release(s, io_error(sl.req, sl.done, op, errno_text(err)));
      }
      return;
    }
    if (c.res == 0) {
      release(s, io_error(sl.req, sl.done, op,
                          sl.req.write ? "the device accepted 0 bytes"
                                       : "unexpected end of file (was the file truncated?)"));
      return;
    }
    sl.done += c.res;
    sl.retries = 0;
    if (sl.done < sl.req.bytes) {
      retry_.push_back(s);  // short transfer: the rest goes in again
    } else {
      release(s, {});
    }
  }

  // The ring cannot be used any more (mu_ held): fail everything outstanding. Requests the
  // kernel may still hold are failed too; nothing better is possible once io_uring_enter
  // itself fails, and a hang would be worse.
  void break_engine(const std::string& why) {
    if (broken_.empty()) broken_ = why;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (std::find(free_.begin(), free_.end(), s) == free_.end()) release(static_cast<uint32_t>(s), broken_);
    }
    retry_.clear();
    unsubmitted_ = 0;
    in_kernel_ = 0;
    fail_queued(broken_);
  }

  void drive() {
    std::vector<io_uring_cqe> got;
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stop_ || in_kernel_ > 0 || unsubmitted_ > 0; });
      if (in_kernel_ == 0 && unsubmitted_ == 0) return;  // stop_ and idle
      if (in_kernel_ == 0) {
        // The kernel refused submissions for now (EAGAIN/EBUSY) and nothing completes to
        // free resources: try again shortly rather than spin.
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lk.lock();
        if (broken_.empty()) enter_submit();
        continue;
      }
      lk.unlock();
      const int r = uring_enter(ring_fd_.get(), 0, 1, IORING_ENTER_GETEVENTS);
      const int err = r < 0 ? errno : 0;
      got.clear();
      const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);  // CQEs before tail are written
      unsigned head = __atomic_load_n(cq_head_, __ATOMIC_RELAXED);        // only this thread moves head
      for (; head != tail; ++head) got.push_back(cqes_[head & cq_mask_]);
      __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);                  // slots reusable by the kernel
      lk.lock();
      in_kernel_ -= static_cast<int64_t>(got.size());
      for (const io_uring_cqe& c : got) complete(c);
      if (got.empty() && err != 0 && err != EINTR && err != EAGAIN && err != EBUSY) {
        break_engine(detail::cat("aio: io_uring_enter (wait) on '", path_, "' failed: ", errno_text(err)));
      }
      submit_ready();
    }
  }

  Fd ring_fd_;
  Mapping sq_map_, cq_map_, sqe_map_;
  unsigned* sq_head_ = nullptr;
  unsigned* sq_tail_ = nullptr;
  unsigned* sq_array_ = nullptr;
  unsigned sq_mask_ = 0, sq_entries_ = 0, sq_tail_local_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  unsigned* cq_head_ = nullptr;
  unsigned* cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
  bool vectored_ = false;

  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;   // slots not in flight
  std::vector<uint32_t> retry_;  // slots whose request goes in again
  unsigned unsubmitted_ = 0;     // SQEs published but not yet taken by io_uring_enter
  int64_t in_kernel_ = 0;        // SQEs taken by the kernel whose CQE is not reaped yet
  std::condition_variable work_cv_;  // wakes the driver: something in the kernel, or stop
  bool stop_ = false;
  std::thread driver_;  // last member: started last, joined in the destructor body
};

}  // namespace

// --- AlignedBuffer -----------------------------------------------------------------------

AlignedBuffer::AlignedBuffer(size_t bytes) {
  if (bytes == 0) return;
  const size_t n = (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
  void* p = nullptr;
  const int rc = ::posix_memalign(&p, kAioAlignment, n);
  ZT_CHECK(rc == 0, "cannot allocate a ", kAioAlignment, "-byte aligned host buffer of ", human_bytes(n), ": ",
           errno_text(rc));
  data_ = p;
  size_ = n;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// --- SwapFile ----------------------------------------------------------------------------

class SwapFile::Impl {
 public:
  Impl(std::string path, int64_t bytes, const AioOptions& opt, AioLog log)
      : path_(std::move(path)), opt_(opt), log_(std::move(log)) {
    ZT_CHECK_T(opt.block_size > 0 && opt.block_size % static_cast<int64_t>(kAioAlignment) == 0 &&
                   opt.block_size <= kMaxBlockSize,
               ConfigError, "aio.block_size ", opt.block_size, " is not a positive multiple of ", kAioAlignment,
               " bytes up to ", kMaxBlockSize, ": NVMe offload splits transfers into block_size requests, which ",
               "O_DIRECT needs page-aligned; use e.g. 1048576");
    ZT_CHECK_T(opt.queue_depth >= 1, ConfigError, "aio.queue_depth must be >= 1, got ", opt.queue_depth);
    ZT_CHECK_T(opt.thread_count >= 1, ConfigError, "aio.thread_count must be >= 1, got ", opt.thread_count);
    ZT_CHECK(bytes > 0, "aio: swap file '", path_, "' needs a positive size, got ", bytes);
    size_ = round_up(bytes, static_cast<int64_t>(kAioAlignment));

    // Create and preallocate through a buffered descriptor (fallocate's emulation paths
    // and O_DIRECT do not mix), then reopen with O_DIRECT for the transfers.
    Fd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (fd.get() < 0) {
      const int err = errno;
      throw ConfigError(detail::cat("cannot create NVMe swap file '", path_, "': ", errno_text(err),
                                    ": make sure the offload nvme_path directory exists and is writable"));
    }
    created_ = true;
    try {
      preallocate(fd.get());
      if (opt.use_o_direct) {
        Fd dfd(::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC));
        if (dfd.get() >= 0) {
          fd = std::move(dfd);
          direct_ = true;
        } else if (errno == EINVAL) {
          emit(log_, detail::cat("aio: O_DIRECT is not supported for '", path_, "' (", errno_text(EINVAL),
                                 "; tmpfs and overlayfs refuse it): using buffered I/O through the page cache"));
        } else {
          const int err = errno;
          throw Error(detail::cat("aio: cannot open swap file '", path_, "' with O_DIRECT: ", errno_text(err)));
        }
      }
      fd_ = std::move(fd);

      std::vector<std::string> notes;
      if (opt.force_threads) {
        emit(log_, detail::cat("aio: thread engine forced (AioOptions::force_threads) for '", path_, "'"));
      } else {
        try {
          engine_ = std::make_unique<UringEngine>(path_, fd_.get(), opt_, notes);
        } catch (const UringUnavailable& e) {
          emit(log_, detail::cat("aio: io_uring is not usable for '", path_, "' (", e.what(),
                                 "): falling back to the thread engine (pread/pwrite)"));
        }
      }
      for (const std::string& n : notes) emit(log_, n);
      if (!engine_) engine_ = std::make_unique<ThreadEngine>(path_, fd_.get(), opt_);
      engine_name_ = engine_->name();

      emit(log_, detail::cat("aio: swap file '", path_, "' ", human_bytes(static_cast<uint64_t>(size_)), ": ",
                             engine_->describe(), ", block_size ", opt.block_size, ", ",
                             direct_ ? "O_DIRECT" : (opt.use_o_direct ? "buffered (O_DIRECT refused)"
                                                                      : "buffered (use_o_direct off)")));
    } catch (...) {
      engine_.reset();
      fd_.reset();
      ::unlink(path_.c_str());
      throw;
    }
  }

  ~Impl() {
    engine_.reset();  // waits for transfers in flight
    fd_.reset();
    if (created_ && ::unlink(path_.c_str()) != 0 && errno != ENOENT) {
      emit(log_, detail::cat("aio: cannot remove swap file '", path_, "': ", errno_text(errno)));
    }
  }

  void check(const char* what, int64_t offset, const void* buf, int64_t bytes) const {
    const auto a = static_cast<int64_t>(kAioAlignment);
    ZT_CHECK(reinterpret_cast<uintptr_t>(buf) % kAioAlignment == 0, "aio ", what, " of '", path_, "': buffer ", buf,
             " is not ", kAioAlignment, "-byte aligned: use zt::offload::AlignedBuffer (O_DIRECT needs page-aligned ",
             "memory)");
    ZT_CHECK(offset >= 0 && offset % a == 0, "aio ", what, " of '", path_, "': file offset ", offset,
             " is not a non-negative multiple of ", kAioAlignment, ": pad each region of the swap file to ",
             kAioAlignment, " bytes");
    ZT_CHECK(bytes >= 0 && bytes % a == 0, "aio ", what, " of '", path_, "': byte count ", bytes,
             " is not a multiple of ", kAioAlignment, ": pad the transfer to ", kAioAlignment,
             " bytes (AlignedBuffer sizes are rounded up already)");
    ZT_CHECK(bytes <= size_ - offset, "aio ", what, " of '", path_, "': ", bytes, " bytes at offset ", offset,
             " run past the end of the ", size_, "-byte swap file");
    ZT_CHECK(bytes == 0 || buf != nullptr, "aio ", what, " of '", path_, "': null buffer for ", bytes, " bytes");
  }

  void preallocate(int fd) {
    // fallocate(2) rather than posix_fallocate: where the filesystem lacks it, glibc's
    // emulation writes one byte per 4 KiB block, which takes minutes for a large swap file.
    if (::fallocate(fd, 0, 0, size_) == 0) return;
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
      throw ConfigError(detail::cat("not enough space for NVMe swap file '", path_, "': preallocating ",
                                    human_bytes(static_cast<uint64_t>(size_)), " failed: ", errno_text(err),
                                    ": free space on the drive or point the offload nvme_path at a larger one"));
    }
    if (err == EOPNOTSUPP || err == ENOSYS) {
      ZT_CHECK(::ftruncate(fd, size_) == 0, "aio: ftruncate of swap file '", path_, "' to ", size_,
               " bytes failed: ", errno_text(errno));
      emit(log_, detail::cat("aio: the filesystem of '", path_, "' cannot preallocate (", errno_text(err),
                             "): the file is sparse and a full drive shows up as a write error during training"));
      return;
    }
    throw Error(
        detail::cat("aio: fallocate of ", size_, " bytes on swap file '", path_, "' failed: ", errno_text(err)));
  }

  std::string path_;
  int64_t size_ = 0;
  AioOptions opt_;
  AioLog log_;
  bool created_ = false;
  bool direct_ = false;
  std::string engine_name_;
  Fd fd_;
  std::unique_ptr<Engine> engine_;  // after fd_: destroyed (drained) before the file is closed
};

SwapFile::SwapFile(std::string path, int64_t bytes, const AioOptions& opt, AioLog log)
    : impl_(std::make_unique<Impl>(std::move(path), bytes, opt, std::move(log))) {}
SwapFile::~SwapFile() = default;
SwapFile::SwapFile(SwapFile&& other) noexcept = default;
SwapFile& SwapFile::operator=(SwapFile&& other) noexcept = default;

uint64_t SwapFile::read_async(int64_t offset, void* buf, int64_t bytes) {
  ZT_ASSERT(impl_, "SwapFile used after move");
  impl_->check("read", offset, buf, bytes);
  return impl_->engine_->start(false, static_cast<char*>(buf), offset, bytes);
}

uint64_t SwapFile::write_async(int64_t offset, const void* buf, int64_t bytes) {
  ZT_ASSERT(impl_, "SwapFile used after move");
  impl_->check("write", offset, buf, bytes);
  // The engines never write through the pointer of a write request.
  return impl_->engine_->start(true, static_cast<char*>(const_cast<void*>(buf)), offset, bytes);
}

void SwapFile::wait(uint64_t ticket) {
  ZT_ASSERT(impl_, "SwapFile used after move");
  impl_->engine_->wait(ticket);
}

void SwapFile::wait_all() {
  ZT_ASSERT(impl_, "SwapFile used after move");
  impl_->engine_->wait_all();
}

const std::string& SwapFile::engine() const { return impl_->engine_name_; }
bool SwapFile::direct() const { return impl_->direct_; }
const std::string& SwapFile::path() const { return impl_->path_; }
int64_t SwapFile::size() const { return impl_->size_; }

// --- check_nvme_path ---------------------------------------------------------------------

void check_nvme_path(const std::string& key, const std::string& path, int64_t bytes_needed) {
  ZT_CHECK_T(!path.empty(), ConfigError, key, " is empty: set it to a directory on an NVMe drive");
  ZT_CHECK(bytes_needed >= 0, "check_nvme_path: negative bytes_needed ", bytes_needed, " for ", key);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    ZT_CHECK_T(err != ENOENT, ConfigError, key, " '", path, "' does not exist: create it or point ", key,
               " at a directory on an NVMe drive");
    ZT_CHECK_T(err != ENOTDIR, ConfigError, key, " '", path, "' is not a directory (a component of the path is a ",
               "file): point ", key, " at a directory on an NVMe drive");
    throw ConfigError(detail::cat(key, " '", path, "' cannot be accessed: ", errno_text(err),
                                  ": fix its permissions or point ", key, " at a directory on an NVMe drive"));
  }
  ZT_CHECK_T(S_ISDIR(st.st_mode), ConfigError, key, " '", path, "' is not a directory",
             S_ISREG(st.st_mode) ? " (it is a file)" : "", ": point ", key, " at a directory on an NVMe drive");

  // Really create a file: access(W_OK) says yes to root on read-only mounts and pseudo
  // filesystems, where the swap files could not be created later.
  static std::atomic<int> counter{0};
  const std::string probe = path + (path.back() == '/' ? "" : "/") + ".zerotrain_probe_" +
                            std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    throw ConfigError(detail::cat(key, " '", path, "' is not writable (creating a file in it failed: ", errno_text(err),
                                  "): make it writable or point ", key, " at a writable directory on an NVMe drive"));
  }
  ::close(fd);
  ::unlink(probe.c_str());

  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) {
    const int err = errno;
    throw ConfigError(detail::cat("cannot query the free space of ", key, " '", path, "': ", errno_text(err)));
  }
  const unsigned __int128 free_bytes = static_cast<unsigned __int128>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < static_cast<unsigned __int128>(bytes_needed)) {
    throw ConfigError(detail::cat(key, " '", path, "' has ", human_bytes(static_cast<uint64_t>(free_bytes)),
                                  " free, but the NVMe swap files need ",
                                  human_bytes(static_cast<uint64_t>(bytes_needed)),
                                  ": free space on that drive or point ", key, " at a larger one"));
  }
}

}  // namespace zt::offload

// ZeRO-Infinity optimizer state on NVMe: the fp32 master weights, Adam's exp_avg and
// exp_avg_sq of one rank's shard live in one swap file (src/offload/aio.h), split into
// sub-groups that are swapped through a few page-aligned host staging buffers.
// Torch-free: the caller (src/zero/zero_offload_nvme.cpp) turns the staged pointers into
// tensors and runs the CPU Adam on them.
//
// [NVMe Layout] Sub-group g holds numel_g consecutive elements of the rank's owned shard.
// Its region of the swap file starts at a multiple of 4096 bytes and is three arrays, each
// padded to 4096 bytes (stride_g = round_up(4 * numel_g, 4096)):
//     [offset_g,              + stride_g)  master      fp32 (numel_g)
//     [offset_g + stride_g,   + stride_g)  exp_avg     fp32 (numel_g)
//     [offset_g + 2*stride_g, + stride_g)  exp_avg_sq  fp32 (numel_g)
// so one sub-group moves with one transfer of 3 * stride_g bytes. A staging buffer has the
// same three arrays, sized for the largest sub-group, plus an optional scratch area that
// is never swapped (the CPU step's bf16/fp16 copy for the upload).
//
// [NVMe Pipeline] pass() visits the sub-groups in order through `buffer_count` staging
// buffers used round robin (buffer of g = g % buffer_count). With B buffers:
//   - the pass starts with the reads of sub-groups 0 .. B-1 in flight;
//   - after the visit of g, the sub-group is written back asynchronously, and the read of
//     g + B - 1 is issued into the buffer of g - 1, after waiting for g - 1's write, which
//     had the whole visit of g to finish;
//   - so while g is visited (the CPU Adam runs), the reads of g + 1 .. g + B - 2 and the
//     write of g - 1 are in flight;
//   - before a buffer is refilled, the reuse fence (set_reuse_fence) runs for it: the
//     caller waits there for anything else still reading the buffer (the asynchronous
//     host-to-device upload of the previous sub-group that used it).
// B = 1 is synchronous (read, visit, write, wait); B = 2 overlaps the write of g with the
// visit of g + 1 but not the reads; B >= 3 overlaps both.
//
// Threads: one caller thread (SwapFile's contract). Errors: I/O failures throw zt::Error
// naming the file, the offset and the byte count (from SwapFile); a visit that throws
// leaves the file as it was for the sub-groups not written yet, and every transfer in
// flight is waited for before the exception leaves pass().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "offload/aio.h"

namespace zt::offload {

struct NvmeStateOptions {
  // The swap file is DIR/STEM.swp, or DIR/STEM.N.swp (N = 1, 2, ...) when another engine
  // (this process or another job) holds that name: each swap file is claimed with an
  // exclusive flock(2) for the engine's lifetime, so two jobs sharing an nvme_path never
  // write each other's file. A stale file of a killed job is not locked and is reused.
  std::string dir;               // the validated nvme_path directory
  std::string stem;              // e.g. "zerotrain_rank3_optimizer"
  int64_t buffer_count = 4;      // staging buffers (offload_optimizer.buffer_count), >= 1
  int64_t scratch_bytes_per_element = 0;  // per staging buffer: scratch of this many bytes per element
  bool pin = false;              // page-lock the staging buffers (cudaHostRegister; CUDA builds only)
  AioOptions aio;
  AioLog log;                    // aio's lines and the pinning fallback
};

class NvmeOptimizerState {
 public:
  // Splits `total` elements into sub-groups of at most `sub_group` elements (>= 1 each).
  static std::vector<int64_t> split(int64_t total, int64_t sub_group);
  // The swap file size for these sub-groups ([NVMe Layout]), for check_nvme_path.
  static int64_t file_bytes_for(const std::vector<int64_t>& group_numels);

  // Claims and creates the swap file (contents undefined until the first kWrite pass) and
  // the staging buffers: min(buffer_count, sub-groups) of them.
  NvmeOptimizerState(std::vector<int64_t> group_numels, NvmeStateOptions opt);
  // Waits for transfers in flight, runs the reuse fence on every buffer that needs it,
  // unpins and frees the buffers, and removes the swap file.
  ~NvmeOptimizerState();
  NvmeOptimizerState(const NvmeOptimizerState&) = delete;
  NvmeOptimizerState& operator=(const NvmeOptimizerState&) = delete;

  // One sub-group in a staging buffer, valid during the visit only.
  struct Staged {
    int group = 0;
    int buffer = 0;
    int64_t begin = 0;   // first element of the sub-group in the owned shard
    int64_t numel = 0;
    float* master = nullptr;
    float* exp_avg = nullptr;
    float* exp_avg_sq = nullptr;
    void* scratch = nullptr;  // scratch_bytes_per_element * numel bytes, or nullptr
  };
  enum class Mode {
    kRead,       // visit what the file holds; nothing is written back (export)
    kWrite,      // the visit fills master, exp_avg and exp_avg_sq; written to the file (initialisation)
    kReadWrite,  // read, visit (update in place), write back (the optimizer step, checkpoint import)
  };
  using Visit = std::function<void(const Staged&)>;
  // See [NVMe Pipeline].
  void pass(Mode mode, const Visit& visit);

  // fence(buffer) must return only when nothing outside this class still reads that
  // staging buffer. Runs before a buffer visited earlier is refilled, and in the destructor.
  void set_reuse_fence(std::function<void(int buffer)> fence) { fence_ = std::move(fence); }

  int num_groups() const { return static_cast<int>(numel_.size()); }
  int64_t group_numel(int g) const { return numel_[g]; }
  int64_t group_begin(int g) const { return begin_[g]; }
  int num_buffers() const { return static_cast<int>(buffers_.size()); }
  int64_t staging_bytes() const;   // host bytes of all staging buffers
  int64_t file_bytes() const { return file_.size(); }
  bool pinned() const { return pinned_; }
  const SwapFile& file() const { return file_; }
  const std::string& path() const { return file_.path(); }

  // Time the last pass spent waiting for I/O (ms) and the bytes it moved.
  struct PassStats {
    double read_wait_ms = 0, write_wait_ms = 0, visit_ms = 0;
    int64_t bytes_read = 0, bytes_written = 0;
    int max_reads_ahead = 0;  // most reads of later sub-groups issued when a visit started
  };
  const PassStats& last_pass() const { return stats_; }

 private:
  friend class NvmeParamFile;  // shares the name claim and the pinning
  struct Pin;       // cudaHostRegister of one buffer (RAII)
  class PathLock;  // the flock(2) that claims the swap file's name (RAII)
  static std::unique_ptr<PathLock> claim(const std::string& dir, const std::string& stem);
  // `count` zeroed staging buffers of `bytes` each into `out`, page-locked with `pin` (CUDA
  // builds; pins into `pins`): true when pinned, every one of them.
  static bool make_buffers(int64_t count, int64_t bytes, bool pin, const AioLog& log, std::vector<AlignedBuffer>& out,
                           std::vector<std::unique_ptr<Pin>>& pins);
  // At shutdown: the reuse fence of every buffer still in use (`what` names them in the
  // log); a failure is logged, not thrown.
  static void fence_in_use(const std::vector<bool>& due, const std::function<void(int)>& fence, const char* what);
  void acquire(int buffer);  // wait for the buffer's write, run the fence
  int64_t region_bytes(int g) const { return 3 * stride_[g]; }

  std::vector<int64_t> numel_, begin_, stride_, offset_;  // per sub-group
  int64_t max_stride_ = 0;
  int64_t scratch_offset_ = 0;  // in each buffer: after the three arrays
  std::vector<AlignedBuffer> buffers_;
  std::vector<std::unique_ptr<Pin>> pins_;  // after buffers_: unpinned before they are freed
  bool pinned_ = false;
  std::vector<bool> write_pending_;      // per buffer: a write from it is in flight
  std::vector<uint64_t> write_ticket_;   // per buffer: its ticket
  std::vector<bool> fence_due_;          // per buffer: visited since its last fence
  std::function<void(int)> fence_;
  PassStats stats_;
  AioLog log_;
  std::unique_ptr<PathLock> lock_;  // before file_: released after the file is removed
  SwapFile file_;  // last: destroyed (drained, removed) first
};

// [NVMe Params] ZeRO-Infinity stage-3 parameters on NVMe (offload_param.device "nvme"): the
// bytes of the rank's compute-dtype parameter shard -- what host memory holds with
// offload_param "cpu" -- live in one swap file, and host memory keeps only `buffer_count`
// staging slots, each sized for the largest range read() is asked for (one unit's shard).
// Ranges need not be page-aligned (unit shards and optimizer sub-groups are not):
//   read(off, n)   transfers the 4096-byte pages that cover the range into the next slot
//                  (round robin; the reuse fence runs first for a slot read before, so an
//                  upload from it has finished) and returns a pointer to byte `off`;
//   write(off, n)  copies through a page-aligned write buffer, reading back the partially
//                  covered first and last page first, so neighbours keep their bytes.
// Both wait for their transfers: the file is read once per unit gather and written once per
// optimizer step, and the caller overlaps them with device work by running ahead (the
// gathers are prefetched). One caller thread. Errors as SwapFile's.
class NvmeParamFile {
 public:
  // The swap file is DIR/STEM.swp (claimed as NvmeOptimizerState's); `bytes` is the shard's
  // size; slots are page-locked with opt.pin (CUDA builds).
  NvmeParamFile(int64_t bytes, int64_t max_read_bytes, NvmeStateOptions opt);
  ~NvmeParamFile();  // runs the reuse fence of every slot in use, then removes the file
  NvmeParamFile(const NvmeParamFile&) = delete;
  NvmeParamFile& operator=(const NvmeParamFile&) = delete;

  struct View {
    const void* data = nullptr;  // byte `off` of the shard, inside slot `slot`
    int slot = 0;
  };
  View read(int64_t offset, int64_t bytes);
  void write(int64_t offset, const void* src, int64_t bytes);
  void set_reuse_fence(std::function<void(int slot)> fence) { fence_ = std::move(fence); }

  int num_buffers() const { return static_cast<int>(slots_.size()); }
  int64_t staging_bytes() const;  // slots and the write buffer
  int64_t file_bytes() const { return file_.size(); }
  bool pinned() const { return pinned_; }
  const std::string& path() const { return file_.path(); }
  const SwapFile& file() const { return file_; }

  struct Stats {
    double read_ms = 0, write_ms = 0;
    int64_t bytes_read = 0, bytes_written = 0;
  };
  Stats take_stats() { return std::exchange(stats_, Stats{}); }  // since the last call

 private:
  void transfer(bool write, int64_t offset, void* buf, int64_t bytes);  // one aligned range, waited for

  int64_t bytes_;
  std::vector<AlignedBuffer> slots_;
  AlignedBuffer wbuf_;
  std::vector<std::unique_ptr<NvmeOptimizerState::Pin>> pins_;  // after the buffers: unpinned first
  bool pinned_ = false;
  std::vector<bool> fence_due_;
  int next_ = 0;
  std::function<void(int)> fence_;
  Stats stats_;
  std::unique_ptr<NvmeOptimizerState::PathLock> lock_;
  SwapFile file_;  // last: destroyed first
};

}  // namespace zt::offload

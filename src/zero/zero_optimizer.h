// ZeroOptimizer: flat parameter/gradient buffers, gradient reduction per bucket, and the
// partitioned optimizer step for ZeRO stages 0, 1 and 2. The engine (src/engine) drives
// it; it holds no timing or reporting logic.
//
// Who holds what (Ψ = parameters, N = ranks, compute dtype of 2 bytes):
//   stage 0: params Ψ, grads Ψ (all-reduced per bucket in backward), master+m+v Ψ
//   stage 1: params Ψ, grads Ψ (reduce-scattered at the boundary), master+m+v Ψ/N
//   stage 2: params Ψ, grads Ψ/N (reduce-scattered per bucket in backward), master+m+v Ψ/N
//   stage 3: grads Ψ/N, master+m+v Ψ/N; parameters exist only in the units gathered right
//            now (the fp32 master shard is cast to the compute dtype as it is gathered)
//
// Stage 3 (src/zero/zero3.cpp) reuses the stage-2 machinery with one bucket per gather
// unit: the rank owns shard r of every unit's parameters, gradients and optimizer state.
// A unit's full parameters exist only between its gather and its release; the model's
// parameter tensors point at the gathered buffer (set_data) while it exists and at an
// empty tensor otherwise.
// See src/zero/partition.h for the layout and [Stream Rules] in zerotrain/comm.h.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <exception>
#include <thread>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/phase_timer.h"
#include "offload/aio.h"
#include "optim/cpu_adam.h"
#include "zero/partition.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/report.h"

namespace zt::zero {

struct ZeroOptions {
  int stage = 0;
  at::ScalarType dtype = at::kFloat;  // compute dtype of params and grads
  torch::Device device = torch::kCPU;
  int64_t reduce_bucket_numel = 500000000;
  int64_t allgather_bucket_numel = 500000000;
  bool overlap_comm = true;            // reduce buckets from backward hooks (stages 0, 2)
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  OptimizerConfig optimizer;
  // Parameter groups: the step uses lr x lr_scale and weight_decay of the parameter's
  // group. Empty = one group {1, optimizer.params.weight_decay}.
  struct Group {
    std::string name;
    double lr_scale = 1.0;
    double weight_decay = 0.0;
  };
  std::vector<Group> groups;
  std::vector<int> param_group;  // user index -> index into groups; empty = all in group 0

  // Stage 3. Units in forward order (user parameter indices); parameters in no unit form
  // the "root" unit, gathered for the whole forward+backward. Parameters with fewer than
  // persistence_threshold elements form the "persistent" unit, never released.
  struct Unit {
    std::string name;
    std::vector<int> params;
  };
  std::vector<Unit> units;
  std::vector<std::string> param_names;   // user index -> name (diagnostics); may be empty
  int64_t prefetch_numel = 50000000;      // stage3_prefetch_bucket_size
  int64_t max_live_numel = 1000000000;    // stage3_max_live_parameters
  int64_t max_reuse_distance = 1000000000; // stage3_max_reuse_distance
  int64_t persistence_threshold = 100000; // stage3_param_persistence_threshold
  // Placeholders to materialise (user index -> full shape, empty = a real parameter) and
  // their initialisation (user index, full-size tensor on the device).
  std::vector<std::vector<int64_t>> deferred_shapes;
  std::function<void(int, torch::Tensor&)> deferred_init;

  // ZeRO-Offload (stages 1-3): fp32 master and Adam state in host memory, the step on the
  // CPU (src/optim/cpu_adam.h), updated compute-dtype shards uploaded per sub-group.
  bool offload_optimizer = false;
  bool offload_param = false;       // stage 3: the compute-dtype shard lives in host memory too
  bool pin_memory = false;          // page-locked host buffers (async copies)
  int64_t sub_group_numel = 1000000000;  // sub_group_size: CPU step / upload granularity
  bool delayed_update = false;      // offload_optimizer.delayed_param_update
  // ZeRO-Infinity (offload_optimizer.device nvme, zero_offload_nvme.cpp): master and Adam
  // state in one swap file per rank under nvme_path instead of host memory, swapped per
  // sub-group through buffer_count staging buffers. Needs offload_optimizer.
  bool nvme = false;
  std::string nvme_path;
  int64_t buffer_count = 4;         // offload_optimizer.buffer_count
  offload::AioOptions aio;          // the "aio" section
  // offload_param.device nvme (stage 3, with offload_optimizer cpu or nvme; [NVMe Params]
  // in src/offload/nvme_state.h): the compute-dtype shard lives in a swap file under
  // param_nvme_path instead of host memory, read per unit through param_buffer_count slots.
  bool param_nvme = false;
  std::string param_nvme_path;
  int64_t param_buffer_count = 5;           // offload_param.buffer_count
  int64_t param_buffer_size = 100000000;    // offload_param.buffer_size: the largest unit shard must fit
};

struct NvmeOffload;  // zero_offload_nvme.cpp
struct NvmeParams;   // zero_offload_nvme.cpp

// Stage 3 counters of one optimizer step.
struct Zero3Stats {
  int64_t gathers = 0;            // unit all-gathers issued
  int64_t prefetched = 0;         // of those, issued before the unit was needed
  int64_t releases = 0;
  int64_t live_numel = 0;         // gathered elements right now
  int64_t peak_live_numel = 0;    // most gathered elements at once (in flight included)
  int64_t max_unit_numel = 0;     // largest unit (the "plus one unit" of the bound)
};

// Per-step inputs of the optimizer step.
struct StepInputs {
  double lr = 0;
  double loss_scale = 1;     // gradients are divided by this
  double clip = 0;           // global-norm clip, 0 = off
  int64_t step = 1;          // 1-based optimizer step (bias correction)
  std::optional<double> momentum;  // schedule-driven beta1 / SGD momentum (OneCycle)
  // Allow the step to decide overflow and clipping on the device (see StepOutcome).
  bool defer = false;
};
struct StepOutcome {
  bool overflow = false;
  double grad_norm = 0;  // before clipping, after unscaling
  // Set when the step was deferred (StepInputs::defer on a CUDA step without offload,
  // SGD or Adam without bias correction): the global sum of squares of the scaled
  // gradients (1 element, fp64, on the device, already reduced over ranks). The update
  // ran on the device and changed nothing where this is inf/NaN (overflow); `overflow`
  // and `grad_norm` above are not filled: the caller reads norm_sq when it is done.
  torch::Tensor norm_sq;
};

class ZeroOptimizer {
 public:
  // params: managed tensors in the user's order; they become views into flat buffers.
  ZeroOptimizer(std::vector<torch::Tensor> params, comm::GroupPtr group, ZeroOptions options);
  ~ZeroOptimizer();

  // Before backward of each micro-step: `boundary` says whether this micro-step ends the
  // accumulation window (stage 0 reduces only then; stage 2 reduces every micro-step).
  void begin_backward(bool boundary, bool first_micro_step);
  // After loss.backward() returned: reduce what no hook reduced, wait for reductions.
  // Returns the span of the compute stream's wait for gradient communication (exposed time).
  DeviceSpan end_backward();
  // At the boundary: finish reduction (stage 1), unscale, check overflow, clip, update
  // this rank's shard, refresh the compute-dtype parameters (all-gather for stages 1-2).
  StepOutcome step(const StepInputs& in);
  void zero_grad();

  // Stage 3 (no-ops at stages 0-2). The engine calls begin/end_forward around the user's
  // forward; models call the unit hooks around each unit's forward (GPT-2 through its
  // BlockHooks, other models through Engine::run_unit).
  void begin_forward();
  void end_forward();
  void unit_pre_forward(int unit, bool recompute);
  void unit_post_forward(int unit, bool recompute);
  // Returns y wrapped so that the unit is gathered again just before its backward.
  torch::Tensor unit_output(int unit, const torch::Tensor& y);
  void on_pre_backward(int bucket);  // called from the autograd node unit_output inserted
  void gather_all();                 // every unit full-size (collective)
  void release_all(bool persistent_too);
  const Zero3Stats& zero3_stats() const { return z3_; }
  int num_units() const { return static_cast<int>(unit_bucket_.size()); }

  ModelStateBytes state_bytes() const;
  // NVMe: the swap file of this rank ("" without NVMe offload), and the last step's swap.
  std::string nvme_file() const;
  StepReport::Nvme nvme_step_stats() const { return nvme_step_; }
  std::vector<torch::Tensor> gather_master_params();
  const FlatLayout& layout() const { return layout_; }
  int64_t buckets_launched() const { return buckets_launched_; }
  int64_t buckets_launched_in_backward() const { return buckets_in_backward_; }
  void reset_counters();

  // ---- Checkpoint state (src/zero/zero_state.cpp; see docs/checkpoints.md) ----
  // Written only in terms of layout_, params_/user_index_, owned_view() and the owned
  // fp32 buffers, so every stage that keeps "rank r owns shard r of every bucket" and
  // refresh_params() gets checkpoints unchanged.
  //
  // Per-element fp32 state kinds: "master", then "exp_avg" and "exp_avg_sq" (Adam) or
  // "momentum" (SGD with momentum != 0).
  std::vector<std::string> state_kinds() const;
  // Managed parameters in the user's order (as given to the constructor).
  std::vector<torch::Tensor> user_params() const;
  // Their full shapes, user order (stage 3 must return the recorded shapes: a released
  // parameter's data is empty).
  std::vector<std::vector<int64_t>> user_param_shapes() const;
  // Elements [begin, end) of the flattened parameter `param` (user index), with a view
  // (fp32, on the device, no copy) of each state kind over them, in state_kinds() order.
  struct StateFragment {
    int param = 0;
    int64_t begin = 0, end = 0;
    std::vector<torch::Tensor> state;
  };
  // What this rank writes: the parameter pieces inside shard `rank` of every bucket, for
  // every stage (stage-0 ranks hold equal copies and each writes only its shard), so
  // the fragments of all ranks tile every parameter exactly once.
  std::vector<StateFragment> state_fragments();
  // Fills the state this rank owns: fetch(param, begin, end, kind) returns end-begin fp32
  // values (any device). No communication; call finish_state_import() on every rank after.
  using StateFetch = std::function<torch::Tensor(int param, int64_t begin, int64_t end, const std::string& kind)>;
  void import_state(const StateFetch& fetch);
  // Rebuilds the compute-dtype parameters from the imported master (refresh_params();
  // collective for sharded stages).
  void finish_state_import();

 private:
  void on_grad_ready(int layout_index);
  void launch_bucket(int b);
  torch::Tensor grad_view(int b);  // this rank's reduced gradient of bucket b (compute dtype)
  // Updates the owned shards of `buckets` with their gradients times `factor`.
  void apply_optimizer(const std::vector<int>& buckets, double factor, const StepInputs& in);
  // Whether step() can keep its overflow check and clipping on the device.
  bool can_defer() const;
  // Whether the step runs zerotrain's fused kernel ([Fused Step], zero_optimizer.cpp).
  bool use_kernel() const;
  void kernel_step(double factor, const StepInputs& in);
  // ZeRO-Offload (zero_offload.cpp).
  void init_offload();
  void offload_step(double factor, const StepInputs& in);
  // Where the CPU step sends each updated compute-dtype shard: nowhere, into the
  // parameters (param_dst), or into delayed_stage_ (the delayed update's worker).
  enum class Upload { kNone, kParams, kDelayedStage };
  void cpu_update(const torch::Tensor& grads, double factor, const StepInputs& in, Upload upload);
  void upload_bucket(int b, Upload to);  // bucket b's updated compute-dtype shard
  void upload_all();                     // every bucket's, into the parameters
  void apply_delayed_update();           // joins the worker and puts its update in place
  // A zero-filled host buffer (offloaded state): page-locked at its exact size with
  // pin_memory on CUDA (offload/host_memory.h). The dtype defaults to the compute dtype.
  torch::Tensor host_buffer(int64_t numel, std::optional<at::ScalarType> dtype = std::nullopt) const;
  // Bytes of host memory the offload set-up allocates on this rank (the fp32 master and Adam
  // state, the gradient buffers, the upload buffer, the stage-3 host parameter shard; not
  // the NVMe staging buffers). Needs layout_. Equals state_bytes().host with CPU offload.
  int64_t host_bytes_planned() const;
  // Elements of host_param_ when it is a buffer of its own (init_offload): the whole owned
  // part, or one bucket's scratch with offload_param nvme; 0 when the CPU step writes the
  // host-resident shard (offload_param cpu) or the NVMe staging buffers instead.
  int64_t upload_buffer_numel() const;
  // A ConfigError on every rank, before any of it is allocated, when the ranks of this host
  // together need more than the host has available (offload/host_memory.h).
  void check_host_memory() const;
  int64_t max_owned_numel() const;  // the largest bucket's owned part (its shard; all of it at stage 0)
  // The CPU Adam hyper-parameters of parameter group `group`.
  optim::AdamHyper adam_hyper(double factor, const StepInputs& in, int group) const;
  // The optimizer update of lists of (fp32 master, fp32 gradient, state) tensors with one
  // lr and weight decay (fused Adam/AdamW kernels, or the SGD loop).
  void update_tensors(std::vector<at::Tensor>& ps, std::vector<at::Tensor>& gs, std::vector<at::Tensor>& ms,
                      std::vector<at::Tensor>& vs, const StepInputs& in, double lr, double weight_decay);
  // [Group Runs] The owned elements are cut into runs of one parameter group each
  // (group_runs_, covering [0, owned) in order; padding joins a neighbouring run). Every
  // optimizer update over an owned range calls fn(offset in the range, length, group) for
  // the range's parts in order: one call covering the range when there is one group.
  void build_group_runs(int64_t owned);
  void for_group_runs(int64_t begin, int64_t n,
                      const std::function<void(int64_t at, int64_t len, int group)>& fn) const;
  int group_of_user(int user_index) const {
    return opt_.param_group.empty() ? 0 : opt_.param_group[user_index];
  }
  int64_t owned_begin(int b) const;  // bucket b's first element in the owned buffers
  // The buckets' parts of owned elements [begin, begin + n): fn(bucket, offset in the range,
  // offset in the bucket's owned part, length), in bucket order.
  void owned_pieces(int64_t begin, int64_t n,
                    const std::function<void(int b, int64_t at, int64_t in_bucket, int64_t len)>& fn) const;
  // NVMe (zero_offload_nvme.cpp). check_nvme runs before any state exists; init_nvme
  // creates the swap file and writes the initial state into it.
  void check_nvme(int64_t owned);
  void init_nvme(int64_t owned);
  void nvme_update(const torch::Tensor& grads, double factor, const StepInputs& in);
  // The owned fp32 state read back from the swap file into host tensors (state_kinds()
  // order; master only when master_only).
  std::vector<torch::Tensor> nvme_read_state(bool master_only);
  void nvme_import(const StateFetch& fetch);
  void nvme_finish_import();
  void nvme_state_bytes(ModelStateBytes& m) const;
  // offload_param nvme: the stage-3 shard in its swap file ([NVMe Params]). Element ranges
  // of the shard; a read is a host tensor in a staging slot, valid until param_buffer_count
  // more reads; param_nvme_uploaded(slot) records that an upload from it was issued.
  void init_param_nvme(int64_t max_unit_shard);
  std::pair<torch::Tensor, int> param_nvme_read(int64_t begin, int64_t numel);
  void param_nvme_uploaded(int slot);
  void param_nvme_write(int64_t begin, const torch::Tensor& src);
  void param_nvme_state_bytes(ModelStateBytes& m) const;
 public:
  // Delayed parameter update: finishes the CPU step in flight and applies it to the
  // parameters (collective at stages 1-2). Called before anything reads the master.
  void flush_delayed_update();
 private:
  void stream_grad_to_host(int b, const comm::WorkPtr& reduce);
  torch::Tensor param_dst(int b);  // where bucket b's updated compute-dtype shard goes
  void refresh_params();
  torch::Tensor bucket_view(const torch::Tensor& flat, int b) const;
  torch::Tensor shard_view(const torch::Tensor& flat, int b) const;        // rank's shard inside a full flat
  torch::Tensor owned_view(const torch::Tensor& owned, int b) const;       // bucket b inside an owned buffer

  // Stage 3 internals (zero3.cpp).
  void init_stage3(std::vector<torch::Tensor>& params);
  void gather(int b, bool prefetch);
  void ensure_gathered(int b);
  void release(int b);
  void prefetch_after(const std::vector<int>& order, int64_t pos, int dir);
  void check_tags(bool all);
  std::string unit_label(int b) const;
  void init_hooks(size_t begin, size_t end);  // layout indices

  ZeroOptions opt_;
  comm::GroupPtr group_;
  int rank_ = 0, world_ = 1;
  std::vector<torch::Tensor> params_;        // layout order
  std::vector<int> user_index_;              // layout index -> user index
  FlatLayout layout_;
  bool owns_all_ = true;                     // stage 0: this rank updates everything
  bool sgd_ = false;                         // optimizer.type SGD (else Adam / AdamW)
  bool adamw_ = true;                        // decoupled weight decay (AdamW / adam_w_mode)
  // A deferred step (StepOutcome::norm_sq): 1-element fp32 device tensors the fused
  // kernels read. ATen's divide the gradients by grad_scale_; found_inf_ = 1 skips.
  torch::Tensor grad_scale_, found_inf_;
  bool params_written_ = false;  // the step's kernel already wrote the compute-dtype parameters
  std::vector<ZeroOptions::Group> groups_;   // parameter groups (at least one)
  struct GroupRun {
    int64_t begin = 0, len = 0;  // owned coordinates
    int group = 0;
  };
  std::vector<GroupRun> group_runs_;         // see [Group Runs]

  torch::Tensor flat_param_;   // (total) compute dtype: every param is a view into it
  torch::Tensor flat_grad_;    // (total) compute dtype, stages 0-1: every .grad is a view
  torch::Tensor grad_shard_;   // (shard) compute dtype, stages 2-3, from the first reduction to the step
  torch::Tensor master_;       // (owned) fp32
  torch::Tensor exp_avg_, exp_avg_sq_;  // (owned) fp32, Adam
  torch::Tensor momentum_buf_;          // (owned) fp32, SGD with momentum
  torch::Tensor step_t_;                // () fp32 on device, for the fused Adam kernels

  // Backward bookkeeping.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<int> pending_;              // per bucket: params still to arrive
  std::vector<bool> launched_;            // per bucket: reduced in this micro-step
  std::vector<torch::Tensor> staging_;    // stage 2: per bucket full-size grads until reduced
  std::vector<torch::Tensor> deferred_;   // stage 2: reduce-scatter outputs to add at the end
  std::vector<comm::WorkPtr> works_;
  bool reducing_ = false;                 // hooks reduce in this micro-step
  bool first_micro_ = true;
  bool in_backward_ = false;

  // Offload state.
  torch::Tensor host_grad_;              // (owned) compute dtype, host: gradients for the CPU step
  torch::Tensor host_param_;             // (owned) compute dtype, host: the CPU step's output
  std::vector<bool> streamed_;           // per bucket: gradient already copied to host in backward
  bool boundary_ = true;                 // this backward ends the accumulation window
  std::shared_ptr<void> streams_;        // CUDA copy streams (zero_offload.cpp)
  torch::Tensor host_grad_spare_;        // delayed update: backward fills one while the CPU reads the other
  torch::Tensor delayed_stage_;          // delayed update (CUDA): the worker's uploads, (owned) compute dtype
  std::thread worker_;                   // delayed update: the CPU step of the previous step
  std::exception_ptr worker_error_;
  std::shared_ptr<NvmeOffload> nvme_;    // NVMe: the swap file, staging buffers, upload events
  std::shared_ptr<NvmeParams> param_nvme_;  // offload_param nvme: the parameter file, its slots' upload events
  StepReport::Nvme nvme_step_;           // NVMe: the last step's swap (nvme_update)

  // Stage 3 state.
  enum class UnitKind { kBlock, kRoot, kPersistent };
  struct UnitState {
    std::string name;
    UnitKind kind = UnitKind::kBlock;
    torch::Tensor full;        // gathered buffer (numel of the bucket); its storage is empty when released
    bool live = false;         // `full` holds (or is receiving) the unit's parameters
    comm::WorkPtr work;        // pending all-gather into `full`
    bool prefetched = false;
    bool attached = false;     // the parameters point into `full`
  };
  struct TagCheck {
    int bucket;
    int64_t seq;
    torch::Tensor tags;        // (world, 2) int64: what every rank gathered as gather #seq
  };
  torch::Tensor param_shard_;            // (shard) compute dtype: only while initialize() partitions
  torch::Tensor empty_;                  // what released parameters point at
  std::vector<std::vector<int64_t>> shapes_;  // layout index -> full shape
  std::vector<UnitState> units_;         // per bucket
  std::vector<int> unit_bucket_;         // engine unit id -> bucket, -1 when all persistent
  int root_ = -1, persistent_ = -1;      // buckets of the root / persistent units
  std::vector<int> trace_;               // forward order of block units (last complete forward)
  bool trace_valid_ = false;
  bool hold_all_ = false;                // gather_all(): nothing is released until release_all()
  std::vector<int> rec_;                 // this forward's order
  int64_t bwd_pos_ = 0;
  int64_t gather_seq_ = 0;
  std::vector<TagCheck> tag_checks_;
  Zero3Stats z3_;
  int64_t buckets_launched_ = 0, buckets_in_backward_ = 0;
};

}  // namespace zt::zero

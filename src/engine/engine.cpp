// Engine: orchestration only. Accumulation boundaries, loss scaling, schedules, phase
// timers and the per-step report; partitioning and communication live in src/zero.
#include "zerotrain/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <type_traits>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/tp_reshard.h"
#include "comm/consensus.h"
#include "common/phase_timer.h"
#ifdef ZT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif
#include "io/safetensors.h"
#include "monitor/monitor.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "zero/grad_norm.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/error.h"
#include "zerotrain/model.h"
#include "log/log.h"

namespace zt {

torch::Device default_device() {
  if (torch::cuda::is_available()) {
    const char* lr = std::getenv("LOCAL_RANK");
    int local = lr ? std::atoi(lr) : comm::discover_rank().local_rank;
    int n = static_cast<int>(torch::cuda::device_count());
    return torch::Device(torch::kCUDA, n > 0 ? local % n : 0);
  }
  return torch::Device(torch::kCPU);
}

namespace {

// [TP Reshard] (ckpt/tp_reshard.h) This rank's checkpoint layout from the model's
// tensor_parallel_spec() for the managed parameters `names` (local shapes `shapes`); empty
// (the default layout) when the model is null or splits nothing over more than one rank.
// Here, not in ckpt/, because the checkpoint layer sits below the model interface.
// EngineOptions.tensor_parallel_spec takes the model's place when set; a spec replicated over
// tp (not split, size > 1) only sets this rank's tp coordinates (it saves from tp rank 0).
ckpt::ShardLayout tp_checkpoint_layout(const ZeroModel* model,
                                       const std::function<TensorParallelSpec(const std::string&)>& spec_of,
                                       const std::vector<std::string>& names,
                                       const std::vector<std::vector<int64_t>>& shapes) {
  ckpt::ShardLayout l;
  if (model == nullptr && !spec_of) return l;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorParallelSpec s = spec_of ? spec_of(names[i]) : model->tensor_parallel_spec(names[i]);
    if (s.size <= 1) continue;
    if (!s.split()) {
      ZT_ASSERT(s.rank >= 0 && s.rank < s.size, "tensor_parallel_spec('", names[i], "'): rank ", s.rank, " of ", s.size);
      l.tp_rank = s.rank;
      l.tp_size = s.size;
      continue;
    }
    ZT_ASSERT(s.dim < static_cast<int64_t>(shapes[i].size()) && s.full_size > 0 && s.rank >= 0 && s.rank < s.size,
              "tensor_parallel_spec('", names[i], "'): dim ", s.dim, ", full size ", s.full_size, ", rank ", s.rank,
              " of ", s.size);
    l.params[names[i]] = ckpt::ShardCoord{.tp_rank = s.rank, .tp_size = s.size, .tp_dim = static_cast<int>(s.dim)};
    ckpt::TpSplit t{s.blocks, s.padded, shapes[i]};
    t.full_shape[static_cast<size_t>(s.dim)] = s.full_size;
    l.splits[names[i]] = std::move(t);
    l.tp_rank = s.rank;
    l.tp_size = s.size;
  }
  return l;
}

class EngineImpl : public Engine {
 public:
  EngineImpl(std::shared_ptr<torch::nn::Module> model, const Config& cfg, EngineOptions o)
      : model_(std::move(model)), cfg_(cfg), opts_(std::move(o)) {
    group_ = opts_.group ? opts_.group : comm::world_group();
    device_ = opts_.device.value_or(default_device());
#ifdef ZT_WITH_CUDA
    // The rank's device becomes the thread's current device (DeepSpeed's
    // torch.cuda.set_device(local_rank)): CUDA work that follows the current device
    // instead of a tensor's -- page-locked allocations, library handles, raw launches --
    // then lands on it. Rank 1 of ZeRO-3 with offload_param hit an illegal address
    // without this.
    if (device_.is_cuda()) c10::cuda::set_device(device_.index());
#endif
    dtype_ = cfg_.compute_dtype();
    require_same_setup();
    ZT_CHECK_T(cfg_.dp_world_size == group_->size(), ConfigError, "the config was resolved for a world of ",
               cfg_.dp_world_size, " ranks but the engine runs on ", group_->size(),
               ": pass the data-parallel world size to Config::from_file");
    const bool stage3 = cfg_.zero_optimization.stage == 3;
    check_frozen_storage(stage3);

    // Collect managed parameters (in registration order).
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    auto named = model_->named_parameters(/*recurse=*/true);
    auto name_of = [&](const torch::Tensor& t) -> std::string {
      for (const auto& kv : named) {
        if (kv.value().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return kv.key();
      }
      return std::string();
    };
    std::vector<int> param_group;  // parameter groups: index into opts_.param_groups, per param
    if (!opts_.param_groups.empty()) {
      collect_groups(named, params, param_group);
    } else if (opts_.params.empty()) {
      for (const auto& kv : named) {
        if (kv.value().requires_grad()) params.push_back(kv.value());
      }
    } else {
      params = opts_.params;
      for (auto& p : params) {
        ZT_CHECK_T(!name_of(p).empty(), ConfigError,
                   "EngineOptions.params must be parameters of the model passed to initialize()");
      }
    }
    for (auto& p : params) names.push_back(name_of(p));
    names_ = names;
    // Placeholders (partitioned construction): a ZeroModel built with deferred_init knows
    // its shapes and initialisation (model_ keeps it alive).
    zero_model_ = dynamic_cast<ZeroModel*>(model_.get());
    if (ZeroModel* zm = zero_model_; zm && zm->deferred_init()) {
      if (!opts_.param_shape) opts_.param_shape = [zm](const std::string& n) { return zm->param_shape(n); };
      if (!opts_.param_init) opts_.param_init = [zm](const std::string& n, torch::Tensor& t) { zm->init_parameter(n, t); };
    }
    std::vector<std::vector<int64_t>> deferred(params.size());
    bool any_deferred = false;
    if (opts_.param_shape) {
      for (size_t i = 0; i < params.size(); ++i) {
        auto shape = opts_.param_shape(names[i]);
        if (c10::multiply_integers(shape) != params[i].numel()) {
          deferred[i] = shape;
          any_deferred = true;
        }
      }
      ZT_CHECK_T(!any_deferred || opts_.param_init, ConfigError,
                 "EngineOptions.param_shape marks placeholders but EngineOptions.param_init is not set");
    }
    // Each managed parameter's shape (this rank's tp slice under tensor parallelism), kept
    // for the checkpoint layout ([TP Reshard]): ZeRO-3 leaves released parameters empty.
    for (size_t i = 0; i < params.size(); ++i)
      param_shapes_.push_back(deferred[i].empty() ? params[i].sizes().vec() : deferred[i]);
    if (any_deferred && !stage3) {
      // Stages 0-2 keep full parameters anyway: materialise each on the device now.
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        if (deferred[i].empty()) continue;
        params[i].set_data(torch::empty(deferred[i], torch::TensorOptions().device(device_).dtype(dtype_)));
        opts_.param_init(names[i], params[i]);
      }
    }
    std::vector<torch::Tensor> frozen;  // stage 3: the frozen shard group's parameters
    std::vector<std::string> frozen_names;
    // Move and cast the model. Stage 3 leaves the managed parameters where they are: the
    // partitioner takes them one unit at a time, so the whole model is never on the device.
    if (!stage3) {
      model_->to(device_, dtype_);
    } else {
      torch::NoGradGuard no_grad;
      std::set<c10::TensorImpl*> managed;
      for (auto& p : params) managed.insert(p.unsafeGetTensorImpl());
      auto move = [&](torch::Tensor t) {
        auto dt = at::isFloatingType(t.scalar_type()) ? dtype_ : t.scalar_type();
        if (t.defined() && (t.device() != device_ || t.scalar_type() != dt)) t.set_data(t.to(device_, dt));
      };
      // Floating-point parameters without gradients (a LoRA base) are partitioned too, by
      // the frozen shard group ([Frozen Units] in src/zero/frozen_shards.h), one unit at a
      // time from where they are now.
      for (const auto& kv : named) {
        const auto& t = kv.value();
        if (managed.count(t.unsafeGetTensorImpl())) continue;
        if (!t.requires_grad() && t.defined() && at::isFloatingType(t.scalar_type()) && t.numel() > 0) {
          frozen.push_back(t);
          frozen_names.push_back(kv.key());
        } else {
          move(t);
        }
      }
      for (auto& b : model_->buffers()) move(b);
    }
    zero::ZeroOptions zo;
    zo.stage = static_cast<int>(cfg_.zero_optimization.stage);
    zo.dtype = dtype_;
    zo.device = device_;
    zo.reduce_bucket_numel = cfg_.zero_optimization.reduce_bucket_size;
    zo.allgather_bucket_numel = cfg_.zero_optimization.allgather_bucket_size;
    // Stage 0 reduces from hooks as DDP does; overlap_comm=false moves it to the step.
    zo.overlap_comm = cfg_.zero_optimization.stage == 0 ? true : cfg_.zero_optimization.overlap_comm;
    zo.prescale_gradients = cfg_.prescale_gradients;
    zo.gradient_predivide_factor = cfg_.gradient_predivide_factor;
    zo.optimizer = cfg_.optimizer;
    if (zo.optimizer.type.empty()) zo.optimizer.type = "AdamW";
    for (size_t g = 0; g < opts_.param_groups.size(); ++g) {
      const ParamGroup& pg = opts_.param_groups[g];
      zo.groups.push_back({group_name(g), pg.lr_scale, pg.weight_decay.value_or(cfg_.optimizer.params.weight_decay)});
    }
    zo.param_group = param_group;
    const auto& zc = cfg_.zero_optimization;
    zo.offload_optimizer = zc.offload_optimizer.device == OffloadDevice::cpu ||
                           zc.offload_optimizer.device == OffloadDevice::nvme;
    zo.offload_param = zc.offload_param.device == OffloadDevice::cpu || zc.offload_param.device == OffloadDevice::nvme;
    // The config layer checks the cross-section rules (src/config/sections.cpp).
    ZT_ASSERT(!zo.offload_param || zo.offload_optimizer, "offload_param without offload_optimizer");
    // ZeRO-Infinity parameters: the shard in a swap file, written by the CPU or NVMe step.
    zo.param_nvme = zc.offload_param.device == OffloadDevice::nvme;
    zo.param_nvme_path = zc.offload_param.nvme_path;
    zo.param_buffer_count = zc.offload_param.buffer_count;
    zo.param_buffer_size = zc.offload_param.buffer_size;
    // ZeRO-Infinity: master and Adam state in a swap file under nvme_path (src/zero/zero_offload_nvme.cpp).
    zo.nvme = zc.offload_optimizer.device == OffloadDevice::nvme;
    zo.nvme_path = zc.offload_optimizer.nvme_path;
    zo.buffer_count = zc.offload_optimizer.buffer_count;
    zo.aio.block_size = cfg_.aio.block_size;
    zo.aio.queue_depth = cfg_.aio.queue_depth;
    zo.aio.thread_count = cfg_.aio.thread_count;
    zo.aio.single_submit = cfg_.aio.single_submit;
    zo.aio.overlap_events = cfg_.aio.overlap_events;
    zo.pin_memory = zc.offload_optimizer.pin_memory || (zo.offload_param && zc.offload_param.pin_memory);
    zo.sub_group_numel = zc.sub_group_size;
    zo.delayed_update = zc.offload_optimizer.delayed_param_update;
    if (stage3) {
      setup_units(params, frozen, names, zo);
      zo.frozen = std::move(frozen);
      zo.frozen_names = std::move(frozen_names);
      for (const auto& fs : opts_.frozen_storage) {
        zo.frozen_storage.push_back(fs.bytes);
        zo.frozen_storage_names.push_back(fs.name);
      }
      if (any_deferred) {
        zo.deferred_shapes = deferred;
        auto init = opts_.param_init;
        zo.deferred_init = [init, names](int i, torch::Tensor& t) { init(names[i], t); };
      }
    }
    zo.model_parallel = opts_.model_parallel;
    if (opts_.norm_weight) {
      zo.norm_weight.resize(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        const double w = opts_.norm_weight(names[i]);
        ZT_CHECK_T(std::isfinite(w) && w >= 0.0, ConfigError, "EngineOptions.norm_weight('", names[i], "') = ", w,
                   ": a norm weight must be finite and >= 0");
        zo.norm_weight[i] = w;
      }
    }
    if (!split_experts(params, names, zo)) zero_ = std::make_unique<zero::ZeroOptimizer>(params, group_, zo);
    if (hooked_) {
      UnitHooks hooks;
      hooks.pre_forward = [this](int64_t i, bool recompute) { unit_pre_forward(static_cast<int>(i), recompute); };
      hooks.post_forward = [this](int64_t i, bool recompute) { unit_post_forward(static_cast<int>(i), recompute); };
      hooks.wrap_output = [this](int64_t i, const torch::Tensor& y) { return unit_output(static_cast<int>(i), y); };
      hooked_->set_unit_hooks(hooks);
    }

    optim::LossScalerOptions so;
    if (cfg_.fp16.enabled) {
      so.static_scale = cfg_.fp16.loss_scale;
      so.initial_scale_power = static_cast<int>(cfg_.fp16.initial_scale_power);
      so.scale_window = cfg_.fp16.loss_scale_window;
      so.hysteresis = static_cast<int>(cfg_.fp16.hysteresis);
      so.consecutive_hysteresis = cfg_.fp16.consecutive_hysteresis;
      so.min_scale = cfg_.fp16.min_loss_scale;
    } else {
      so.static_scale = 1.0;  // bf16/fp32: no scaling, but overflow still skips
      so.unscaled = true;
    }
    so.max_skips_at_min = static_cast<int>(std::clamp<int64_t>(opts_.max_skipped_steps, 0, INT32_MAX));
    scaler_ = std::make_unique<optim::LossScaler>(so);
    schedule_ = optim::make_lr_schedule(cfg_.scheduler, cfg_.optimizer.params.lr);
    timer_ = std::make_unique<PhaseTimer>(device_);
    timer_->set_cpu_bytes(model_state_bytes().total());
    if (!opts_.metrics_path.empty() && group_->rank() == 0) {
      metrics_.open(opts_.metrics_path, std::ios::out | std::ios::trunc);
      ZT_CHECK_T(metrics_.good(), Error, "cannot write metrics to ", opts_.metrics_path);
    }
    if (group_->rank() == 0) monitor_ = monitor::Monitor::create(cfg_);  // tensorboard, csv_monitor
  }

  ~EngineImpl() override {
    // Steps still waiting for the device are reported (metrics file) before the engine goes.
    if (std::uncaught_exceptions() == 0) {
      try {
        resolve_pending();
      } catch (const std::exception& ex) {
        log::error("reporting the last step failed: %s", ex.what());
      }
    }
    // Publishing is collective: only when not unwinding (a failing rank must not wait for
    // the others); otherwise the in-flight save is left unpublished (.TAG.partial).
    if (saver_.pending() && std::uncaught_exceptions() == 0) {
      try {
        saver_.wait(ckpt_group(), global_steps_);
      } catch (const std::exception& ex) {
        log::error("asynchronous checkpoint save failed: %s", ex.what());
      }
    }
    saver_.abandon();
    if (hooked_) hooked_->set_unit_hooks({});  // the hooks point at this engine
  }

  torch::Tensor forward(const std::function<torch::Tensor()>& fn) override {
    timer_->begin();
    torch::Tensor loss = in_phase("forward", [&] {
      zero_->begin_forward();
      if (expert_) expert_->begin_forward();
      torch::Tensor l = fn();
      zero_->end_forward();
      if (expert_) expert_->end_forward();
      return l;
    });
    fwd_phases_.push_back(timer_->end());
    return loss;
  }

  torch::Tensor run_unit(int unit, const std::function<torch::Tensor(const torch::Tensor&)>& fn,
                         const torch::Tensor& x) override {
    if (cfg_.zero_optimization.stage != 3) return fn(x);
    ZT_CHECK_T(unit >= 0 && unit < zero_->num_units(), ConfigError, "run_unit(", unit, "): the engine has ",
               zero_->num_units(), " units (EngineOptions.units)");
    unit_pre_forward(unit, false);
    auto y = fn(x);
    unit_post_forward(unit, false);
    return unit_output(unit, y);
  }
  // Stage 3: one unit index drives every shard group's gatherer ([Expert Groups]): the dense
  // group's, then the experts' (a unit without experts is a no-op there).
  void unit_pre_forward(int unit, bool recompute) {
    zero_->unit_pre_forward(unit, recompute);
    if (expert_) expert_->unit_pre_forward(unit, recompute);
  }
  void unit_post_forward(int unit, bool recompute) {
    zero_->unit_post_forward(unit, recompute);
    if (expert_) expert_->unit_post_forward(unit, recompute);
  }
  torch::Tensor unit_output(int unit, const torch::Tensor& y) {
    torch::Tensor out = zero_->unit_output(unit, y);
    return expert_ ? expert_->unit_output(unit, out) : out;
  }
  std::vector<std::string> unit_names() const override { return unit_names_; }
  void gather_params() override {
    zero_->gather_all();
    if (expert_) expert_->gather_all();
  }
  void release_params() override {
    zero_->release_all(/*persistent_too=*/false);
    if (expert_) expert_->release_all(/*persistent_too=*/false);
  }

  void backward(const torch::Tensor& loss) override {
    ZT_CHECK_T(loss.defined() && loss.numel() == 1, TrainingError, "backward() needs a scalar loss");
    // DeepSpeed scales the loss by 1/accumulation steps, and by the fp16 loss scale.
    const double factor = backward_scale();
    torch::Tensor scaled = factor == 1.0 ? loss : loss * factor;
    run_backward(loss, [&] { scaled.backward(); });
  }

  void backward(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads,
                const std::vector<torch::Tensor>& inputs, const torch::Tensor& loss) override {
    ZT_CHECK_T(!outputs.empty() && outputs.size() == grads.size(), TrainingError, "backward(outputs, grads) needs ",
               "one gradient per output (got ", outputs.size(), " outputs and ", grads.size(), " gradients)");
    for (size_t i = 0; i < outputs.size(); ++i) {
      ZT_CHECK_T(outputs[i].defined() && grads[i].defined() && outputs[i].sizes() == grads[i].sizes(), TrainingError,
                 "backward(outputs, grads): output ", i, " and its gradient differ in shape or are undefined");
    }
    ZT_CHECK_T(!loss.defined() || loss.numel() == 1, TrainingError, "backward(outputs, grads, inputs, loss): the loss must be a scalar");
    run_backward(loss, [&] {
      torch::autograd::backward(outputs, grads, /*retain_graph=*/std::nullopt, /*create_graph=*/false, inputs);
    });
  }

  double backward_scale() const override {
    return scaler_->scale() / static_cast<double>(cfg_.gradient_accumulation_steps);
  }

  // One micro-step: the ZeRO part's begin/end around `run`, which accumulates gradients.
  void run_backward(const torch::Tensor& loss, const std::function<void()>& run) {
    const bool boundary = (micro_ + 1) % cfg_.gradient_accumulation_steps == 0;
    const bool first = micro_ % cfg_.gradient_accumulation_steps == 0;
    if (loss.defined()) {
      // The step's loss stays on the device until the report reads it (no sync here).
      auto l = loss.detach().to(at::kFloat).reshape({});
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l.clone();
    }
    timer_->begin();
    zero_->begin_backward(boundary, first);
    if (expert_) expert_->begin_backward(boundary, first);
    in_phase("backward", [&] {
      run();
      exposed_.push_back(zero_->end_backward());
      if (expert_) exposed_.push_back(expert_->end_backward());
      return 0;
    });
    bwd_phases_.push_back(timer_->end());
    ++micro_;
    ++window_micro_;
  }

  bool step() override {
    if (micro_ % cfg_.gradient_accumulation_steps != 0 || window_micro_ == 0) return false;
    // The previous step's outcome (overflow) decides this step's lr and bias correction.
    // Its device work finished long ago unless the CPU is far ahead: this is the one
    // place per step where the CPU may wait for the GPU.
    resolve_pending();
    timer_->begin();
    zero::StepInputs in;
    // The schedule advances only on applied steps (DeepSpeed skips it on overflow).
    in.lr = schedule_->lr(applied_steps_);
    in.momentum = schedule_->momentum(applied_steps_);
    in.loss_scale = scaler_->scale();
    in.clip = cfg_.gradient_clipping;
    in.step = applied_steps_ + 1;
    // fp16's dynamic scale must be known before the next backward: decide at once there.
    in.defer = device_.is_cuda() && !cfg_.fp16.enabled;
    zero::StepOutcome out = in_phase("step", [&] { return step_shard_groups(in); });
    Pending p;
    p.deferred = out.norm_sq.defined();
    p.r.loss_scale = scaler_->scale();
    if (!p.deferred) apply_outcome(out.overflow, p.r);
    p.r.grad_norm = out.grad_norm;
    zero_->zero_grad();
    if (expert_) expert_->zero_grad();
    // What the report reads from the device: copied to host memory behind the step's work
    // and read once the step's end event has passed.
    {
      torch::NoGradGuard ng;
      auto loss = loss_sum_.defined() ? loss_sum_.reshape({1}).to(at::kDouble) : torch::zeros({1}, at::kDouble).to(device_);
      auto sq = p.deferred ? out.norm_sq.reshape({1}).to(at::kDouble) : torch::zeros({1}, loss.options());
      auto vals = torch::cat({loss, sq});
      if (device_.is_cuda()) {
        p.host = torch::empty({2}, torch::TensorOptions().dtype(at::kDouble).pinned_memory(true));
        p.host.copy_(vals, /*non_blocking=*/true);
      } else {
        p.host = vals;
      }
    }
    p.step = timer_->end();
    ++global_steps_;
    // DeepSpeed's global_samples: every step (skipped ones too) adds the batch it ran with.
    global_samples_ += cfg_.train_batch_size;

    StepReport& r = p.r;
    r.step = global_steps_;
    r.samples = global_samples_;
    r.micro_steps = window_micro_;
    r.lr = in.lr;
    r.model_state = model_state_bytes();
    r.buckets = zero_->buckets_launched();
    r.buckets_before_backward_end = zero_->buckets_launched_in_backward();
    const auto& z3 = zero_->zero3_stats();
    const int64_t esize = c10::elementSize(dtype_);
    r.gathers = z3.gathers;
    r.gathers_prefetched = z3.prefetched;
    r.gathered_peak_bytes = z3.peak_live_numel * esize;
    if (expert_) {
      // Stage 3 with experts ([Expert Groups]): both gatherers' gathers; the peaks summed
      // (an upper bound: the two peaks need not coincide).
      const auto& e3 = expert_->zero3_stats();
      r.gathers += e3.gathers;
      r.gathers_prefetched += e3.prefetched;
      r.gathered_peak_bytes += e3.peak_live_numel * esize;
    }
    r.frozen_gathered_peak_bytes =
        zero_->frozen_stats().peak_live_numel * esize + zero_->frozen_storage_stats().peak_live_numel;
    if (!out.overflow) r.nvme = zero_->nvme_step_stats();
    p.fwd = std::move(fwd_phases_);
    p.bwd = std::move(bwd_phases_);
    p.exposed = std::move(exposed_);
    pending_.push_back(std::move(p));
    fwd_phases_.clear();
    bwd_phases_.clear();
    exposed_.clear();
    loss_sum_ = torch::Tensor();
    window_micro_ = 0;
    zero_->reset_counters();
    if (expert_) expert_->reset_counters();
    if (!device_.is_cuda()) resolve_pending();  // nothing to wait for
    // An asynchronous checkpoint in flight is published once every rank's writer is done
    // (one small all-reduce per step until then; throws the writer's error).
    if (saver_.pending()) {
      resolve_pending();
      saver_.poll(ckpt_group(), global_steps_);
    }
    return true;
  }

  std::vector<StepReport> take_reports(bool wait) override {
    if (wait) {
      resolve_pending();
    } else {
      while (!pending_.empty() && pending_.front().step.span.ready()) resolve_one();
    }
    std::vector<StepReport> out;
    out.swap(ready_);
    return out;
  }

  bool was_step_skipped() override {
    resolve_pending();
    return skipped_;
  }
  double get_lr() override {
    resolve_pending();
    return schedule_->lr(applied_steps_);
  }
  double loss_scale() override {
    resolve_pending();
    return scaler_->scale();
  }
  int64_t global_steps() const override { return global_steps_; }
  int64_t global_samples() const override { return global_samples_; }
  int64_t micro_steps() const override { return micro_; }
  bool is_gradient_accumulation_boundary() const override {
    return (micro_ + 1) % cfg_.gradient_accumulation_steps == 0;
  }
  const Config& config() const override { return cfg_; }
  torch::Device device() const override { return device_; }
  at::ScalarType compute_dtype() const override { return dtype_; }
  const comm::GroupPtr& group() const override { return group_; }
  ModelStateBytes model_state_bytes() const override {
    auto m = zero_->state_bytes();
    if (expert_) {
      const auto e = expert_->state_bytes();
      m.params += e.params;
      m.grads += e.grads;
      m.master += e.master;
      m.optimizer += e.optimizer;
      m.expert_master = e.master;
      m.expert_optimizer = e.optimizer;
    }
    m.gathered = zero_->zero3_stats().live_numel * static_cast<int64_t>(c10::elementSize(dtype_));
    if (expert_) m.gathered += expert_->zero3_stats().live_numel * static_cast<int64_t>(c10::elementSize(dtype_));
    return m;
  }
  const StepReport& last_report() override {
    resolve_pending();
    return last_;
  }
  std::vector<torch::Tensor> gather_master_params() override {
    if (!expert_) return zero_->gather_master_params();
    // Both shard groups, back in the user's order (collective over dp and over expert-dp).
    auto dense = zero_->gather_master_params();
    auto experts = expert_->gather_master_params();
    std::vector<torch::Tensor> all(names_.size());
    for (size_t i = 0; i < dense.size(); ++i) all[static_cast<size_t>(dense_index_[i])] = dense[i];
    for (size_t i = 0; i < experts.size(); ++i) all[static_cast<size_t>(expert_index_[i])] = experts[i];
    return all;
  }

  // The 16-bit export holds one shard group (docs/moe.md: what is left).
  void refuse_experts(const char* what) const {
    ZT_CHECK_T(!expert_, ConfigError, what, " with expert parallelism (ep ", opts_.ep ? opts_.ep->size() : 1,
               ") is not supported yet: experts would need gathering by global index (docs/moe.md, what is left); "
               "save a checkpoint and consolidate it with `zerotrain convert`, or use gather_master_params()");
  }
  // [Expert Checkpoints] (src/ckpt/engine_checkpoint.cpp): the experts' shard group and the
  // global name each expert is stored under.
  void add_experts(ckpt::EngineParts& parts, const char* what) const {
    if (!expert_) return;
    ZT_CHECK_T(static_cast<bool>(opts_.expert_global_name), ConfigError, what, " with expert parallelism (ep ",
               opts_.ep->size(), ") stores each expert by its global index: set EngineOptions.expert_global_name "
               "(an expert's name at ep 1; GPT2Impl::global_param_name for the MoE GPT-2)");
    parts.expert = expert_.get();
    parts.expert_name = opts_.expert_global_name;
  }

  void save_16bit_model(const std::string& path) override {
    ZT_CHECK_T(cfg_.zero_optimization.stage != 3 || cfg_.zero_optimization.stage3_gather_16bit_weights_on_model_save,
               ConfigError, "save_16bit_model under ZeRO-3 gathers the full weights: set "
               "zero_optimization.stage3_gather_16bit_weights_on_model_save to true (or save a checkpoint and "
               "consolidate it with `zerotrain convert`)");
    refuse_experts("save_16bit_model");
    auto full = zero_->gather_master_params();  // collective
    if (group_->rank() != 0) return;
    std::map<std::string, torch::Tensor> tensors;
    for (size_t i = 0; i < full.size(); ++i) {
      const std::string name = names_[i].empty() ? "param_" + std::to_string(i) : names_[i];
      tensors[name] = full[i].to(dtype_);
    }
    io::save_safetensors(path, tensors, {{"format", "pt"}, {"producer", "zerotrain save_16bit_model"}});
  }

  void save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                       bool async) override {
    ZT_CHECK_T(window_micro_ == 0, CheckpointError, "save_checkpoint() between micro-steps of an accumulation window (",
               window_micro_, " of ", cfg_.gradient_accumulation_steps, " done): save after step() returned true");
    resolve_pending();  // the counters and the loss scaler must include the last step
    ckpt::Counters c{micro_, global_steps_, applied_steps_, skipped_, global_samples_};
    ckpt::EngineParts parts{*model_, *zero_, *scaler_, cfg_, ckpt_group(), device_, dtype_, c};
    parts.layout = ckpt_layout();
    parts.model_part = static_cast<bool>(opts_.checkpoint_group);  // [Pipeline Checkpoints]
    add_experts(parts, "save_checkpoint");
    saver_.save(parts, dir, tag, client_state, async);
  }
  void wait_checkpoint() override { saver_.wait(ckpt_group(), global_steps_); }
  bool checkpoint_pending() const override { return saver_.pending(); }
  const CheckpointSaveReport& last_checkpoint_save() const override { return saver_.last(); }
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag) override {
    ZT_CHECK_T(window_micro_ == 0, CheckpointError, "load_checkpoint() inside an accumulation window");
    resolve_pending();
    // The checkpoint being loaded may be the one in flight: settle it first; a failed
    // asynchronous save is thrown after the load ([Failed Previous Save], ckpt::load_after_settling).
    return ckpt::load_after_settling(
        [&] { saver_.wait(ckpt_group(), global_steps_); },
        [&](int64_t* step) {
          ckpt::Counters c{micro_, global_steps_, applied_steps_, skipped_, global_samples_};
          ckpt::EngineParts parts{*model_, *zero_, *scaler_, cfg_, ckpt_group(), device_, dtype_, c};
          parts.layout = ckpt_layout();
          parts.model_part = static_cast<bool>(opts_.checkpoint_group);  // [Pipeline Checkpoints]
          add_experts(parts, "load_checkpoint");
          auto client = ckpt::load_checkpoint(parts, dir, tag);
          // A checkpoint is saved at a step boundary (save_checkpoint refuses otherwise), so the
          // next window starts at micro-step 0 of the configured accumulation. Windows are
          // `micro_ % gas`: restart the count at global_steps x this engine's gas, not the saved
          // count, which is global_steps x the saving run's gas (a load at another
          // gradient_accumulation_steps would otherwise make the first window short). DeepSpeed
          // does not restore its micro_steps either; the saved count stays in the manifest.
          micro_ = c.global_steps * cfg_.gradient_accumulation_steps;
          global_steps_ = c.global_steps;
          applied_steps_ = c.applied_steps;
          skipped_ = c.last_skipped;
          // As saved (each saved step counted at the batch it ran with); the steps from here add
          // this run's train_batch_size. Derived from global_steps for an older checkpoint.
          global_samples_ = c.global_samples;
          *step = global_steps_;
          return client;
        },
        dir, tag);
  }

 private:
  // [TP Reshard] (ckpt/tp_reshard.h) A model split over tensor-parallel ranks (its
  // tensor_parallel_spec) checkpoints over all dp x tp ranks, which must be the whole world
  // (train --tp's layout), with each split parameter at its tp coordinates; any other model
  // over the engine's group at the default layout (null). Built at the first use.
  void init_ckpt_layout() {
    if (ckpt_group_) return;
    auto layout = tp_checkpoint_layout(zero_model_, opts_.tensor_parallel_spec, names_, param_shapes_);
    ckpt_group_ = group_;
    if (opts_.checkpoint_group) {
      // [Pipeline Checkpoints]: one part of a model cut by layers, saved with the other parts;
      // a stage's tp shards at their coordinates, as a tensor-parallel model's ([TP Reshard]).
      ZT_CHECK_T(!expert_, ConfigError, "checkpoints of a pipeline stage whose layers are experts split over ep "
                 "are not supported yet: save without pipeline parallelism");
      ZT_CHECK_T(opts_.checkpoint_group->size() % (group_->size() * layout.tp_size) == 0, ConfigError,
                 "EngineOptions.checkpoint_group (", opts_.checkpoint_group->size(),
                 " ranks) must contain the engine's data-parallel group (", group_->size(), " ranks) x tp ",
                 layout.tp_size);
      ckpt_group_ = opts_.checkpoint_group;
      if (layout.tp_size > 1) ckpt_layout_ = std::make_unique<ckpt::ShardLayout>(std::move(layout));
      return;
    }
    if (layout.tp_size > 1) {
      auto world = comm::world_group();
      const int mp = opts_.model_parallel ? opts_.model_parallel->size() : 1;
      ZT_CHECK_T(mp == layout.tp_size && world->size() == group_->size() * mp, ConfigError,
                 "checkpoints of a tensor-parallel model (tp ", layout.tp_size, ") save over all dp x tp ranks, which "
                 "must be the whole world: dp ", group_->size(), " x model-parallel ", mp, " != ", world->size(),
                 " ranks (pass the tp group as EngineOptions.model_parallel, without pipeline stages)");
      ckpt_group_ = world;
      ckpt_layout_ = std::make_unique<ckpt::ShardLayout>(std::move(layout));
    }
  }
  const comm::GroupPtr& ckpt_group() {
    init_ckpt_layout();
    return ckpt_group_;
  }
  const ckpt::ShardLayout* ckpt_layout() {
    init_ckpt_layout();
    return ckpt_layout_.get();
  }

  // Runs one phase; running out of device memory becomes an error naming the rank, the
  // phase and the step, with what to change (a CUDA OOM alone names none of them).
  template <class F>
  std::invoke_result_t<F> in_phase(const char* phase, F&& f) {
    try {
      return f();
    } catch (const c10::OutOfMemoryError& e) {
      throw TrainingError(detail::cat(
          "rank ", group_->rank(), ": out of device memory in the ", phase, " phase of step ", global_steps_ + 1, " (",
          e.what_without_backtrace(), "). `zerotrain estimate` shows the memory by kind for this job; lower "
          "train_micro_batch_size_per_gpu, turn on activation checkpointing, or use a higher ZeRO stage or "
          "offload_optimizer"));
    }
  }

  void report(const StepReport& r) {
    if (group_->rank() != 0) return;
    if (metrics_.is_open()) {
      metrics_ << r.to_json().dump() << "\n";
      metrics_.flush();
    }
    if (monitor_) monitor_->write(r);
    if (!opts_.print || cfg_.steps_per_print <= 0 || r.step % cfg_.steps_per_print != 0) return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    log::info("step %lld loss %.4f lr %.3g scale %g%s | ms fwd %.1f bwd %.1f step %.1f | "
              "peak GiB fwd %.2f bwd %.2f step %.2f | model states %.3f GiB",
                static_cast<long long>(r.step), r.loss, r.lr, r.loss_scale, r.skipped ? " SKIPPED" : "", r.forward.ms,
                r.backward.ms, r.step_phase.ms, r.forward.mem_peak / gib, r.backward.mem_peak / gib,
                r.step_phase.mem_peak / gib, r.model_state.total() / gib);
    if (cfg_.wall_clock_breakdown) {
      log::info("  model states: params %.3f grads %.3f master %.3f optimizer %.3f GiB | "
                "buckets %lld (%lld launched during backward), exposed comm %.2f ms",
                  r.model_state.params / gib, r.model_state.grads / gib, r.model_state.master / gib,
                  r.model_state.optimizer / gib, static_cast<long long>(r.buckets),
                  static_cast<long long>(r.buckets_before_backward_end), r.exposed_comm_ms);
      const auto& zc = cfg_.zero_optimization;
      const bool opt_nvme = zc.offload_optimizer.device == OffloadDevice::nvme;
      const bool param_nvme = zc.stage == 3 && zc.offload_param.device == OffloadDevice::nvme;
      if (r.model_state.nvme > 0) {
        log::info("  offload: %.3f GiB in host memory, %.3f GiB on NVMe (%s)", r.model_state.host / gib,
                    r.model_state.nvme / gib,
                    opt_nvme && param_nvme ? "master + optimizer state, and the parameters"
                    : opt_nvme             ? "master + optimizer state"
                                           : "the parameters");
        if (opt_nvme) {
          log::info("  nvme step: read %.3f GiB (waited %.1f ms), wrote %.3f GiB (waited %.1f ms), "
                    "CPU Adam + uploads %.1f ms",
                      r.nvme.bytes_read / gib, r.nvme.read_wait_ms, r.nvme.bytes_written / gib, r.nvme.write_wait_ms,
                      r.nvme.visit_ms);
        }
      } else if (r.model_state.host > 0) {
        log::info("  offload: %.3f GiB of model state in host memory", r.model_state.host / gib);
      }
      if (cfg_.zero_optimization.stage == 3) {
        log::info("  zero-3: %lld unit gathers (%lld prefetched), gathered peak %.3f GiB",
                    static_cast<long long>(r.gathers), static_cast<long long>(r.gathers_prefetched),
                    r.gathered_peak_bytes / gib);
      }
    }
    std::fflush(stdout);
  }

  // A step whose report still needs values from the device (CUDA: the loss, the phase
  // times and, for a deferred step, the gradient norm and overflow).
  struct Pending {
    StepReport r;  // filled except loss, times, and (deferred) skipped / grad_norm
    bool deferred = false;
    std::vector<PendingPhase> fwd, bwd;
    PendingPhase step;
    std::vector<DeviceSpan> exposed;
    torch::Tensor host;  // {loss sum over the micro-steps, norm_sq}: host memory once step.span passed
  };

  // Sums phase stats over the micro-steps of one step (peak = max).
  static PhaseStats sum_phases(const std::vector<PendingPhase>& v) {
    PhaseStats s;
    for (const auto& p : v) {
      const PhaseStats x = p.resolve();
      s.ms += x.ms;
      s.mem_after = x.mem_after;
      s.mem_peak = std::max(s.mem_peak, x.mem_peak);
    }
    return s;
  }

  // The loss scaler, the skip and the applied-step count for one step's overflow result.
  void apply_outcome(bool overflow, StepReport& r) {
    const double scale_used = scaler_->scale();
    skipped_ = scaler_->update(overflow);
    if (!skipped_) ++applied_steps_;
    r.skipped = skipped_;
    if (overflow && group_->rank() == 0) {
      log::info("step %lld: gradient overflow (inf/NaN); step skipped, loss scale %g -> %g",
                   static_cast<long long>(r.step > 0 ? r.step : global_steps_ + 1), scale_used, scaler_->scale());
    }
  }

  // Completes the oldest pending step: waits for its device work, reads its values,
  // applies a deferred outcome, and reports it (metrics line, printed line).
  void resolve_one() {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    p.step.span.wait();
    const double* h = p.host.data_ptr<double>();
    StepReport& r = p.r;
    r.loss = h[0] / std::max<int64_t>(1, r.micro_steps);
    if (p.deferred) {
      const double total_sq = h[1] / (r.loss_scale * r.loss_scale);
      const bool overflow = !std::isfinite(total_sq);
      apply_outcome(overflow, r);
      r.grad_norm = overflow ? 0.0 : std::sqrt(total_sq);
      if (overflow) r.nvme = {};
    }
    r.forward = sum_phases(p.fwd);
    r.backward = sum_phases(p.bwd);
    r.step_phase = p.step.resolve();
    r.exposed_comm_ms = 0;
    for (const auto& e : p.exposed) r.exposed_comm_ms += e.ms();
    if (opts_.on_report) opts_.on_report(r);
    last_ = r;
    report(r);
    // Kept for take_reports(); a caller that never takes them keeps only the newest.
    if (ready_.size() >= kMaxReady) ready_.erase(ready_.begin());
    ready_.push_back(r);
  }

  void resolve_pending() {
    while (!pending_.empty()) resolve_one();
  }

  // [Expert Groups] (src/zero/zero_optimizer.h): with experts under ep > 1, makes zero_
  // over the dense parameters (dp) and expert_ over the experts (expert-dp, grad_scale
  // 1/ep) and returns true; false (nothing made) when every parameter is dense.
  bool split_experts(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                     const zero::ZeroOptions& zo) {
    if (!opts_.is_expert || !opts_.ep || opts_.ep->size() <= 1) return false;
    std::vector<int> dense, expert;
    for (size_t i = 0; i < params.size(); ++i) (opts_.is_expert(names[i]) ? expert : dense).push_back(static_cast<int>(i));
    if (expert.empty()) return false;
    const int ep = opts_.ep->size();
    ZT_CHECK_T(opts_.expert_dp, ConfigError, "EngineOptions.is_expert marks ", expert.size(),
               " expert parameters (e.g. '", names[expert[0]], "') over an ep group of ", ep,
               " ranks but EngineOptions.expert_dp is not set: pass parallel::Topology::expert_dp()");
    ZT_CHECK_T(ep * opts_.expert_dp->size() == group_->size(), ConfigError, "EngineOptions.ep (", ep,
               " ranks) x EngineOptions.expert_dp (", opts_.expert_dp->size(), " ranks) != the data-parallel group (",
               group_->size(), " ranks): pass the ep() and expert_dp() groups of one parallel::Topology whose dp is "
               "the engine's group");
    // Two shard groups of one rank would share the rank's swap file name.
    ZT_CHECK_T(!zo.nvme, ConfigError, "zero_optimization.offload_optimizer.device nvme with expert parallelism (ep ",
               ep, ") is not supported yet: use offload_optimizer.device cpu, or train at ep 1 (docs/moe.md)");
    ZT_CHECK_T(!dense.empty(), ConfigError, "EngineOptions.is_expert marks every trainable parameter as an expert: "
               "an MoE model has a dense part (at least the gate); check the predicate");
    // Stage 3: each shard group keeps every unit (the same unit index drives both gatherers),
    // with its own members in it; the experts' units hold no frozen parameters.
    auto subset = [&](const std::vector<int>& idx, zero::ZeroOptions o, std::vector<torch::Tensor>& out) {
      out.clear();
      o.param_group.clear();
      o.norm_weight.clear();
      o.param_names.clear();
      o.deferred_shapes.clear();
      std::vector<int> local(params.size(), -1);
      for (int i : idx) {
        local[static_cast<size_t>(i)] = static_cast<int>(out.size());
        out.push_back(params[static_cast<size_t>(i)]);
        if (!zo.param_group.empty()) o.param_group.push_back(zo.param_group[static_cast<size_t>(i)]);
        if (!zo.norm_weight.empty()) o.norm_weight.push_back(zo.norm_weight[static_cast<size_t>(i)]);
        if (!zo.param_names.empty()) o.param_names.push_back(zo.param_names[static_cast<size_t>(i)]);
        if (!zo.deferred_shapes.empty()) o.deferred_shapes.push_back(zo.deferred_shapes[static_cast<size_t>(i)]);
      }
      for (auto& u : o.units) {
        std::vector<int> mine;
        for (int i : u.params) {
          if (local[static_cast<size_t>(i)] >= 0) mine.push_back(local[static_cast<size_t>(i)]);
        }
        u.params = std::move(mine);
      }
      if (zo.deferred_init) o.deferred_init = [init = zo.deferred_init, idx](int i, torch::Tensor& t) { init(idx[static_cast<size_t>(i)], t); };
      return o;
    };
    std::vector<torch::Tensor> dp_params, ex_params;
    zero::ZeroOptions dzo = subset(dense, zo, dp_params);
    zero::ZeroOptions ezo = subset(expert, zo, ex_params);
    ezo.frozen.clear();  // the frozen shard group (stage 3) stays with the dense one
    ezo.frozen_names.clear();
    ezo.frozen_storage.clear();
    ezo.frozen_storage_names.clear();
    for (auto& u : ezo.units) {
      u.frozen.clear();
      u.frozen_storage.clear();
    }
    // The engine sums the expert partial over ep and combines over model_parallel itself.
    ezo.model_parallel = nullptr;
    ezo.grad_scale = 1.0 / ep;
    zero_ = std::make_unique<zero::ZeroOptimizer>(dp_params, group_, dzo);
    expert_ = std::make_unique<zero::ZeroOptimizer>(ex_params, opts_.expert_dp, ezo);
    dense_index_ = dense;
    expert_index_ = expert;
    return true;
  }

  // One optimizer step of every shard group with one global norm ([Expert Groups]).
  zero::StepOutcome step_shard_groups(const zero::StepInputs& in) {
    if (!expert_) return zero_->step(in);
    torch::NoGradGuard no_grad;
    auto dense_sq = zero_->prepare_step();
    auto expert_sq = expert_->prepare_step();
    // The expert partial summed over ep (every expert once), then over model_parallel.
    auto sq = zero::combine_norm_sq(dense_sq, expert_sq, opts_.ep, opts_.model_parallel);
    zero::StepOutcome out = zero_->apply_step(sq, in);
    expert_->apply_step(sq, in);
    return out;
  }

  std::string group_name(size_t g) const {
    const std::string& n = opts_.param_groups[g].name;
    return n.empty() ? "group " + std::to_string(g) : n;
  }

  // EngineOptions::param_groups: the union of the groups, in registration order, and each
  // parameter's group. Validates the groups (ConfigError naming parameter and group).
  void collect_groups(const torch::OrderedDict<std::string, torch::Tensor>& named, std::vector<torch::Tensor>& params,
                      std::vector<int>& param_group) {
    ZT_CHECK_T(opts_.params.empty(), ConfigError,
               "EngineOptions.params and EngineOptions.param_groups are both set: put the parameters to train in "
               "param_groups only");
    std::map<c10::TensorImpl*, int> group_of;
    for (size_t g = 0; g < opts_.param_groups.size(); ++g) {
      const ParamGroup& pg = opts_.param_groups[g];
      const std::string gname = group_name(g);
      ZT_CHECK_T(!pg.params.empty(), ConfigError, "parameter group '", gname,
                 "' has no parameters: remove it from EngineOptions.param_groups");
      ZT_CHECK_T(!pg.weight_decay || (std::isfinite(*pg.weight_decay) && *pg.weight_decay >= 0), ConfigError,
                 "parameter group '", gname, "': weight_decay ", pg.weight_decay.value_or(0),
                 " must be finite and >= 0");
      ZT_CHECK_T(std::isfinite(pg.lr_scale) && pg.lr_scale >= 0, ConfigError, "parameter group '", gname,
                 "': lr_scale ", pg.lr_scale, " must be finite and >= 0");
      for (const auto& t : pg.params) {
        std::string name;
        for (const auto& kv : named) {
          if (kv.value().unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) name = kv.key();
        }
        ZT_CHECK_T(!name.empty(), ConfigError, "parameter group '", gname, "' holds a tensor of shape ", t.sizes(),
                   " that is not a parameter of the model passed to initialize()");
        ZT_CHECK_T(t.requires_grad(), ConfigError, "parameter '", name, "' in parameter group '", gname,
                   "' does not require grad (frozen): remove it from the group or set requires_grad");
        auto [it, fresh] = group_of.emplace(t.unsafeGetTensorImpl(), static_cast<int>(g));
        ZT_CHECK_T(fresh, ConfigError, "parameter '", name, "' is in two parameter groups ('",
                   group_name(static_cast<size_t>(it->second)), "' and '", gname, "'): keep it in one");
      }
    }
    for (const auto& kv : named) {
      auto it = group_of.find(kv.value().unsafeGetTensorImpl());
      if (it == group_of.end()) continue;
      params.push_back(kv.value());
      param_group.push_back(it->second);
    }
  }

  // [Rank Consensus] (comm/consensus.h): every rank of the group has the same resolved
  // config (but for the per-node NVMe paths) and the same parameters (names, shapes, dtypes, trainable) before the first
  // collective; a rank that differs is named with the key, on every rank.
  void require_same_setup() {
    std::vector<std::string> records, all;
    flatten_json(cfg_.to_json(), "", all);
    // Paths a rank may set for itself: the swap files on its node's NVMe drive.
    for (auto& r : all) {
      const auto key = r.substr(0, r.find(" = "));
      if (!key.ends_with("nvme_path")) records.push_back(std::move(r));
    }
    comm::require_consensus(group_, records, "config",
                            "start every rank with the same config file and command-line flags");
    records.clear();
    for (const auto& kv : model_->named_parameters(/*recurse=*/true)) {
      const auto& t = kv.value();
      records.push_back(detail::cat("parameter ", kv.key(), " = ", t.sizes(), " ", t.scalar_type(),
                                    t.requires_grad() ? " trainable" : " frozen"));
    }
    comm::require_consensus(group_, records, "model",
                            "build the same model on every rank of the data-parallel group");
  }

  static void flatten_json(const nlohmann::json& j, const std::string& path, std::vector<std::string>& out) {
    if (j.is_object()) {
      for (const auto& [k, v] : j.items()) flatten_json(v, path.empty() ? k : path + "." + k, out);
    } else if (j.is_array()) {
      for (size_t i = 0; i < j.size(); ++i) flatten_json(j[i], path + "[" + std::to_string(i) + "]", out);
      if (j.empty()) out.push_back(path + " = []");
    } else {
      out.push_back(path + " = " + j.dump());
    }
  }

  // EngineOptions.frozen_storage: ZeRO-3 only; uint8, 1-D, contiguous, not empty, once each.
  void check_frozen_storage(bool stage3) const {
    const auto& fs = opts_.frozen_storage;
    ZT_CHECK_T(fs.empty() || stage3, ConfigError, "EngineOptions.frozen_storage ('", fs.empty() ? "" : fs[0].name,
               "', ", fs.size(), " entries) is partitioned at ZeRO stage 3 only, but zero_optimization.stage is ",
               static_cast<int>(cfg_.zero_optimization.stage), ": leave it empty below stage 3 (the storage stays whole)");
    std::set<c10::TensorImpl*> seen;
    for (const auto& e : fs) {
      ZT_CHECK_T(e.bytes.defined() && e.bytes.scalar_type() == at::kByte && e.bytes.dim() == 1 &&
                     e.bytes.is_contiguous() && e.bytes.numel() > 0,
                 ConfigError, "EngineOptions.frozen_storage '", e.name, "' must be a non-empty contiguous 1-D uint8 "
                 "tensor; it is ", e.bytes.defined() ? detail::cat(e.bytes.scalar_type(), " ", e.bytes.sizes()) : "undefined");
      ZT_CHECK_T(seen.insert(e.bytes.unsafeGetTensorImpl()).second, ConfigError, "EngineOptions.frozen_storage '",
                 e.name, "' is listed twice");
    }
  }

  // ZeRO-3 units: EngineOptions.units, else the ZeroModel's zero_units() (driven by its unit
  // hooks), else none (all root).
  // frozen: the stage-3 frozen group's parameters (each unit's members go to Unit::frozen).
  void setup_units(const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& frozen,
                   const std::vector<std::string>& names, zero::ZeroOptions& zo) {
    const auto& z = cfg_.zero_optimization;
    zo.param_names = names;
    zo.prefetch_numel = z.stage3_prefetch_bucket_size;
    zo.max_live_numel = z.stage3_max_live_parameters;
    zo.max_reuse_distance = z.stage3_max_reuse_distance;
    zo.persistence_threshold = z.stage3_param_persistence_threshold;
    auto index_in = [](const std::vector<torch::Tensor>& list, const torch::Tensor& t) {
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int>(i);
      }
      return -1;
    };
    std::vector<std::vector<torch::Tensor>> units = opts_.units;
    std::vector<std::string> unit_names = opts_.unit_names;
    if (units.empty() && zero_model_) {
      for (auto& mu : zero_model_->zero_units()) {
        units.push_back(std::move(mu.params));
        unit_names.push_back(std::move(mu.name));
      }
      if (!units.empty()) hooked_ = zero_model_;
    }
    // (explicit units: the model calls Engine::run_unit itself)
    for (size_t u = 0; u < units.size(); ++u) {
      zero::ZeroOptions::Unit unit;
      unit.name = u < unit_names.size() ? unit_names[u] : "unit " + std::to_string(u);
      for (const auto& t : units[u]) {
        if (const int i = index_in(params, t); i >= 0) {
          unit.params.push_back(i);
        } else if (const int f = index_in(frozen, t); f >= 0) {
          unit.frozen.push_back(f);  // the frozen shard group's member of this unit
        }
        // Frozen storage joins the unit of its unit_member (EngineOptions::frozen_storage).
        for (size_t s = 0; s < opts_.frozen_storage.size(); ++s) {
          const auto& m = opts_.frozen_storage[s].unit_member;
          if (m.defined() && m.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
            unit.frozen_storage.push_back(static_cast<int>(s));
          }
        }
      }
      zo.units.push_back(unit);
      unit_names_.push_back(unit.name);
    }
  }

  std::shared_ptr<torch::nn::Module> model_;
  ZeroModel* zero_model_ = nullptr;  // model_ as a ZeroModel, or null
  ZeroModel* hooked_ = nullptr;      // set when the engine drives the model's unit hooks
  std::vector<std::string> names_;       // managed parameters' names, in the user's order
  std::vector<std::vector<int64_t>> param_shapes_;  // their shapes (full, before any ZeRO-3 partition)
  std::vector<std::string> unit_names_;  // ZeRO-3 gather units in forward order
  Config cfg_;
  EngineOptions opts_;
  comm::GroupPtr group_;
  torch::Device device_{torch::kCPU};
  at::ScalarType dtype_ = at::kFloat;
  std::unique_ptr<zero::ZeroOptimizer> zero_;
  // [Expert Groups]: the experts' shard group over expert-dp (null without experts at ep >
  // 1), and which managed parameters (user order) each shard group holds, in order.
  std::unique_ptr<zero::ZeroOptimizer> expert_;
  std::vector<int> dense_index_, expert_index_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<PhaseTimer> timer_;
  std::ofstream metrics_;
  std::unique_ptr<monitor::Monitor> monitor_;  // rank 0, when the config enables a monitor
  comm::GroupPtr ckpt_group_;                     // [TP Reshard]: the checkpoint's ranks (null: not built yet)
  std::unique_ptr<ckpt::ShardLayout> ckpt_layout_;  // null: the default layout
  ckpt::AsyncSaver saver_;  // declared after the state it snapshots; joined in ~EngineImpl
  int64_t micro_ = 0, window_micro_ = 0, global_steps_ = 0, applied_steps_ = 0;
  int64_t global_samples_ = 0;  // DeepSpeed's global_samples (see step())
  bool skipped_ = false;
  torch::Tensor loss_sum_;
  // The current accumulation window's phases and exposed-communication spans.
  std::vector<PendingPhase> fwd_phases_, bwd_phases_;
  std::vector<DeviceSpan> exposed_;
  std::deque<Pending> pending_;    // steps not yet resolved, oldest first
  std::vector<StepReport> ready_;  // resolved, not yet taken (take_reports), at most kMaxReady
  static constexpr size_t kMaxReady = 1024;
  StepReport last_;
};

}  // namespace

std::vector<ParamGroup> no_decay_groups(torch::nn::Module& model, double weight_decay) {
  ParamGroup decay, no_decay;
  decay.name = "decay";
  decay.weight_decay = weight_decay;
  no_decay.name = "no_decay";
  no_decay.weight_decay = 0.0;
  for (const auto& kv : model.named_parameters(/*recurse=*/true)) {
    if (!kv.value().requires_grad()) continue;
    (kv.value().dim() < 2 ? no_decay : decay).params.push_back(kv.value());
  }
  std::vector<ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   EngineOptions options) {
  ZT_CHECK_T(model != nullptr, ConfigError, "initialize() needs a model");
  return std::make_unique<EngineImpl>(std::move(model), config, std::move(options));
}

}  // namespace zt

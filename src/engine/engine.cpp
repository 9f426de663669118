// Engine: orchestration only. Accumulation boundaries, loss scaling, schedules, phase
// timers and the per-step report; partitioning and communication live in src/zero.
#include "zerotrain/engine.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ckpt/engine_checkpoint.h"
#include "engine/phase_timer.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/error.h"

namespace zt {

nlohmann::json StepReport::to_json() const {
  auto phase = [](const PhaseStats& p) { return nlohmann::json{{"after", p.mem_after}, {"peak", p.mem_peak}}; };
  return {{"step", step},
          {"micro_steps", micro_steps},
          {"loss", loss},
          {"lr", lr},
          {"loss_scale", loss_scale},
          {"skipped", skipped},
          {"grad_norm", grad_norm},
          {"phase_ms", {{"forward", forward.ms}, {"backward", backward.ms}, {"step", step_phase.ms}}},
          {"phase_mem", {{"forward", phase(forward)}, {"backward", phase(backward)}, {"step", phase(step_phase)}}},
          {"model_state_bytes",
           {{"params", model_state.params},
            {"grads", model_state.grads},
            {"master", model_state.master},
            {"optimizer", model_state.optimizer}}},
          {"comm", {{"buckets", buckets},
                    {"buckets_before_backward_end", buckets_before_backward_end},
                    {"exposed_ms", exposed_comm_ms}}}};
}

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

class EngineImpl : public Engine {
 public:
  EngineImpl(std::shared_ptr<torch::nn::Module> model, const Config& cfg, EngineOptions o)
      : model_(std::move(model)), cfg_(cfg), opts_(std::move(o)) {
    group_ = opts_.group ? opts_.group : comm::world_group();
    device_ = opts_.device.value_or(default_device());
    dtype_ = cfg_.compute_dtype();
    ZT_CHECK_T(cfg_.dp_world_size == group_->size(), ConfigError, "the config was resolved for a world of ",
               cfg_.dp_world_size, " ranks but the engine runs on ", group_->size(),
               ": pass the data-parallel world size to Config::from_file");
    ZT_CHECK_T(cfg_.zero_optimization.stage <= 2, ConfigError, "zero_optimization.stage ",
               cfg_.zero_optimization.stage, " is not supported yet by this engine (stages 0, 1, 2 are)");

    // Move and cast the model; collect managed parameters (in registration order).
    model_->to(device_, dtype_);
    std::vector<torch::Tensor> params;
    if (opts_.params.empty()) {
      for (auto& p : model_->parameters()) {
        if (p.requires_grad()) params.push_back(p);
      }
    } else {
      params = opts_.params;
      for (auto& p : params) {
        ZT_CHECK_T(p.device() == device_ && p.scalar_type() == dtype_, ConfigError,
                   "EngineOptions.params must be parameters of the model passed to initialize()");
      }
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
    zero_ = std::make_unique<zero::ZeroOptimizer>(params, group_, zo);

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
      so.max_skips_at_min = 0;
    }
    scaler_ = std::make_unique<optim::LossScaler>(so);
    schedule_ = optim::make_lr_schedule(cfg_.scheduler.type, cfg_.scheduler.params, cfg_.optimizer.params.lr);
    timer_ = std::make_unique<PhaseTimer>(device_);
    timer_->set_cpu_bytes(zero_->state_bytes().total());
    if (!opts_.metrics_path.empty() && group_->rank() == 0) {
      metrics_.open(opts_.metrics_path, std::ios::out | std::ios::trunc);
      ZT_CHECK_T(metrics_.good(), Error, "cannot write metrics to ", opts_.metrics_path);
    }
  }

  torch::Tensor forward(const std::function<torch::Tensor()>& fn) override {
    timer_->begin();
    torch::Tensor loss = fn();
    forward_.add(timer_->end());
    return loss;
  }

  void backward(const torch::Tensor& loss) override {
    ZT_CHECK_T(loss.defined() && loss.numel() == 1, TrainingError, "backward() needs a scalar loss");
    const bool boundary = (micro_ + 1) % cfg_.gradient_accumulation_steps == 0;
    const bool first = micro_ % cfg_.gradient_accumulation_steps == 0;
    // The step's loss stays on the device until the report reads it (no sync here).
    auto l = loss.detach().to(at::kFloat);
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l.clone();
    timer_->begin();
    zero_->begin_backward(boundary, first);
    // DeepSpeed scales the loss by 1/accumulation steps, and by the fp16 loss scale.
    double factor = scaler_->scale() / static_cast<double>(cfg_.gradient_accumulation_steps);
    torch::Tensor scaled = factor == 1.0 ? loss : loss * factor;
    scaled.backward();
    exposed_ms_ += zero_->end_backward();
    backward_.add(timer_->end());
    ++micro_;
    ++window_micro_;
  }

  bool step() override {
    if (micro_ % cfg_.gradient_accumulation_steps != 0 || window_micro_ == 0) return false;
    timer_->begin();
    zero::StepInputs in;
    // The schedule advances only on applied steps (DeepSpeed skips it on overflow).
    in.lr = schedule_->lr(applied_steps_);
    in.momentum = schedule_->momentum(applied_steps_);
    in.loss_scale = scaler_->scale();
    in.clip = cfg_.gradient_clipping;
    in.step = applied_steps_ + 1;
    zero::StepOutcome out = zero_->step(in);
    const double scale_used = scaler_->scale();
    skipped_ = scaler_->update(out.overflow);
    if (!skipped_) ++applied_steps_;
    if (out.overflow && group_->rank() == 0) {
      std::fprintf(stderr, "[zerotrain] step %lld: gradient overflow (inf/NaN); step skipped, loss scale %g -> %g\n",
                   static_cast<long long>(global_steps_ + 1), scale_used, scaler_->scale());
    }
    zero_->zero_grad();
    step_stats_ = timer_->end();
    ++global_steps_;

    StepReport r;
    r.step = global_steps_;
    r.micro_steps = window_micro_;
    r.loss = loss_sum_.defined() ? loss_sum_.item<double>() / window_micro_ : 0.0;
    r.lr = in.lr;
    r.loss_scale = scale_used;
    r.skipped = skipped_;
    r.grad_norm = out.grad_norm;
    r.forward = forward_.get();
    r.backward = backward_.get();
    r.step_phase = step_stats_;
    r.model_state = zero_->state_bytes();
    r.buckets = zero_->buckets_launched();
    r.buckets_before_backward_end = zero_->buckets_launched_in_backward();
    r.exposed_comm_ms = exposed_ms_;
    last_ = r;
    report(r);
    forward_ = {};
    backward_ = {};
    loss_sum_ = torch::Tensor();
    window_micro_ = 0;
    exposed_ms_ = 0;
    zero_->reset_counters();
    return true;
  }

  bool was_step_skipped() const override { return skipped_; }
  double get_lr() const override { return schedule_->lr(applied_steps_); }
  double loss_scale() const override { return scaler_->scale(); }
  int64_t global_steps() const override { return global_steps_; }
  int64_t micro_steps() const override { return micro_; }
  bool is_gradient_accumulation_boundary() const override {
    return (micro_ + 1) % cfg_.gradient_accumulation_steps == 0;
  }
  const Config& config() const override { return cfg_; }
  torch::Device device() const override { return device_; }
  at::ScalarType compute_dtype() const override { return dtype_; }
  const comm::GroupPtr& group() const override { return group_; }
  ModelStateBytes model_state_bytes() const override { return zero_->state_bytes(); }
  const StepReport& last_report() const override { return last_; }
  std::vector<torch::Tensor> gather_master_params() override { return zero_->gather_master_params(); }

  void save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state) override {
    ZT_CHECK_T(window_micro_ == 0, CheckpointError, "save_checkpoint() between micro-steps of an accumulation window (",
               window_micro_, " of ", cfg_.gradient_accumulation_steps, " done): save after step() returned true");
    ckpt::Counters c{micro_, global_steps_, applied_steps_, skipped_};
    ckpt::EngineParts parts{*model_, *zero_, *scaler_, cfg_, group_, device_, dtype_, c};
    ckpt::save_checkpoint(parts, dir, tag, client_state);
  }
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag) override {
    ZT_CHECK_T(window_micro_ == 0, CheckpointError, "load_checkpoint() inside an accumulation window");
    ckpt::Counters c{micro_, global_steps_, applied_steps_, skipped_};
    ckpt::EngineParts parts{*model_, *zero_, *scaler_, cfg_, group_, device_, dtype_, c};
    nlohmann::json client = ckpt::load_checkpoint(parts, dir, tag);
    micro_ = c.micro_steps;
    global_steps_ = c.global_steps;
    applied_steps_ = c.applied_steps;
    skipped_ = c.last_skipped;
    return client;
  }

 private:
  void report(const StepReport& r) {
    if (group_->rank() != 0) return;
    if (metrics_.is_open()) {
      metrics_ << r.to_json().dump() << "\n";
      metrics_.flush();
    }
    if (!opts_.print || cfg_.steps_per_print <= 0 || r.step % cfg_.steps_per_print != 0) return;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    std::printf("[zerotrain] step %lld loss %.4f lr %.3g scale %g%s | ms fwd %.1f bwd %.1f step %.1f | "
                "peak GiB fwd %.2f bwd %.2f step %.2f | model states %.3f GiB\n",
                static_cast<long long>(r.step), r.loss, r.lr, r.loss_scale, r.skipped ? " SKIPPED" : "", r.forward.ms,
                r.backward.ms, r.step_phase.ms, r.forward.mem_peak / gib, r.backward.mem_peak / gib,
                r.step_phase.mem_peak / gib, r.model_state.total() / gib);
    if (cfg_.wall_clock_breakdown) {
      std::printf("[zerotrain]   model states: params %.3f grads %.3f master %.3f optimizer %.3f GiB | "
                  "buckets %lld (%lld launched during backward), exposed comm %.2f ms\n",
                  r.model_state.params / gib, r.model_state.grads / gib, r.model_state.master / gib,
                  r.model_state.optimizer / gib, static_cast<long long>(r.buckets),
                  static_cast<long long>(r.buckets_before_backward_end), r.exposed_comm_ms);
    }
    std::fflush(stdout);
  }

  // Sums phase stats over the micro-steps of one step (peak = max).
  struct Accum {
    PhaseStats s;
    void add(const PhaseStats& p) {
      s.ms += p.ms;
      s.mem_after = p.mem_after;
      s.mem_peak = std::max(s.mem_peak, p.mem_peak);
    }
    PhaseStats get() const { return s; }
  };

  std::shared_ptr<torch::nn::Module> model_;
  Config cfg_;
  EngineOptions opts_;
  comm::GroupPtr group_;
  torch::Device device_{torch::kCPU};
  at::ScalarType dtype_ = at::kFloat;
  std::unique_ptr<zero::ZeroOptimizer> zero_;
  std::unique_ptr<optim::LossScaler> scaler_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<PhaseTimer> timer_;
  std::ofstream metrics_;
  int64_t micro_ = 0, window_micro_ = 0, global_steps_ = 0, applied_steps_ = 0;
  bool skipped_ = false;
  torch::Tensor loss_sum_;
  double exposed_ms_ = 0;
  Accum forward_, backward_;
  PhaseStats step_stats_;
  StepReport last_;
};

}  // namespace

std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   EngineOptions options) {
  ZT_CHECK_T(model != nullptr, ConfigError, "initialize() needs a model");
  return std::make_unique<EngineImpl>(std::move(model), config, std::move(options));
}

}  // namespace zt

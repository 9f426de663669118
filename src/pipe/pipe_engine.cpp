// The pipeline executor. See [Pipeline Execution] in pipe/pipe_engine.h.
#include "pipe/pipe_engine.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ckpt/engine_checkpoint.h"
#include "config/tensor_parallel_options.h"
#include "models/deferred_grad.h"
#include "models/gpt2_shapes.h"
#include "zerotrain/error.h"
#include "log/log.h"

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace zt::pipe {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// [Pipeline Checkpoints] x [TP Reshard]: the tensor_parallel_spec of a GPT-2 stage cut from a
// GPT2TP, by the whole model's names (GPT2TPImpl::tensor_parallel_spec's), and a replicated
// parameter as replicated over the stage's tp group (so its tp rank 0 alone saves it, even on
// a stage holding no split parameter). Unset for any other stage.
std::function<TensorParallelSpec(const std::string&)> pipe_stage_tp_spec(const torch::nn::Module& stage) {
  const auto* g = dynamic_cast<const GPT2StageImpl*>(&stage);
  if (g == nullptr || g->tp_size() <= 1) return {};
  return [cfg = g->config(), rank = g->tp_rank(), size = g->tp_size()](const std::string& name) {
    const tp::SplitSpec s = models::gpt2_tp_split_spec(cfg, size, name);
    TensorParallelSpec out;
    out.group = "tp";
    out.rank = rank;
    out.size = size;
    if (!s.split()) return out;
    out.dim = s.dim;
    out.blocks = s.blocks;
    out.padded = s.padded;
    out.full_size = models::gpt2_param_shape(cfg, name)[static_cast<size_t>(s.dim)];
    return out;
  };
}

// A switch that is on unless the environment sets it to "0" (ZT_PIPE_EAGER_COMMS,
// ZT_PIPE_ZB_DEFERRED_W, ZT_PIPE_ZB_RELEASE_GRAPH).
bool env_not_zero(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::string(v) != "0";
}

// [Pipeline Eager Groups] (on by default; ZT_PIPE_EAGER_COMMS=0 turns it off) The fix of
// issue 25's NCCL hang (interleaved 1F1B, ZeRO-2, pp 2 x dp 2, GPT-2 XL on 4 H100s: hung
// with lazy groups in 4 of 4 variants, completed with this; bench/results/2026-11-27_pipe_hang_h100x4).
// Every group a batch uses
// exchanges a 1 MiB message in each direction it will carry (or reduces), and waits
// for it, here in the constructor, while nothing else is in flight: under NCCL a group's
// communicator, and each peer's connection, is otherwise created lazily at its first use in
// the first batch -- ncclCommInitRank and NCCL's runtime connect block the host, collectively
// with the peer, while kernels of other communicators (the ZeRO-2 reduce-scatters launched
// from the backward hooks, the other channel's messages) may be spinning on a peer that is
// itself blocked the same way. The same calls on every rank in the same order.
void connect_pipeline_groups(const comm::GroupPtr& act, const comm::GroupPtr& grad, const comm::GroupPtr& pp,
                             const comm::GroupPtr& mp, const comm::GroupPtr& tp, const comm::GroupPtr& dp, int stage, int p,
                             torch::Device device) {
  const int next = (stage + 1) % p, prev = (stage + p - 1) % p;
  const auto opts = torch::TensorOptions().dtype(torch::kUInt8).device(device);
  constexpr int64_t kBytes = 1 << 20;  // one MiB: past NCCL's small-message paths
  std::vector<torch::Tensor> keep;
  auto both_ways = [&](const comm::GroupPtr& g, int to, int from) {
    auto out = torch::zeros({kBytes}, opts), in = torch::empty({kBytes}, opts);
    auto out2 = torch::zeros({kBytes}, opts), in2 = torch::empty({kBytes}, opts);
    keep.insert(keep.end(), {out, in, out2, in2});
    // Both directions in one batch (one NCCL group): never two sends head to head.
    g->batch_isend_irecv({comm::isend(out, to), comm::isend(out2, from), comm::irecv(in, from), comm::irecv(in2, to)})
        ->synchronize();
  };
  both_ways(act, next, prev);
  both_ways(grad, prev, next);
  // The tied weight's channel joins the first and the last stage only.
  if (stage == 0) both_ways(pp, p - 1, p - 1);
  if (stage == p - 1) both_ways(pp, 0, 0);
  auto one = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  if (mp && mp->size() > 1) mp->all_reduce(one, comm::ReduceOp::kSum, /*async=*/false)->synchronize();
  if (tp && tp->size() > 1) tp->all_reduce(one, comm::ReduceOp::kSum, /*async=*/false)->synchronize();
  if (dp && dp->size() > 1) {
    // The ZeRO reductions' shapes (its communicator exists since the optimizer's broadcast).
    const int64_t n = 4 * kBytes / dp->size() * dp->size();
    auto full = torch::zeros({n}, opts), part = torch::empty({n / dp->size()}, opts);
    auto f16 = full.view(torch::kBFloat16), p16 = part.view(torch::kBFloat16);
    dp->reduce_scatter(p16, f16, comm::ReduceOp::kSum, /*async=*/false)->synchronize();
    dp->all_gather(f16, p16, /*async=*/false)->synchronize();
  }
}

}  // namespace

PipeConfig pipeline_config(const nlohmann::json& ds_config, int world_size, const std::string& origin) {
  PipeConfig pc{Config::parse(ds_config, world_size, origin), config::pipeline_options(ds_config)};
  config::drop_pipeline_stages_note(pc.config.not_supported_yet);  // what this engine implements
  config::drop_tensor_parallel_note(pc.config.not_supported_yet);  // with a GPT2TP
  std::string rest;
  for (const auto& m : pc.config.not_supported_yet) rest += "\n  " + m;
  if (!rest.empty()) throw ConfigError(origin + ": settings zerotrain does not support yet:" + rest);
  return pc;
}

nlohmann::json PipeReport::to_json() const {
  nlohmann::json st = nlohmann::json::array();
  for (const auto& t : timing) {
    st.push_back({{"wall_ms", t.wall_ms},
                  {"busy_ms", t.busy_ms},
                  {"busy_fraction", t.busy_fraction()},
                  {"forward_ms", t.forward_ms},
                  {"backward_ms", t.backward_ms},
                  {"weight_ms", t.weight_ms},
                  {"step_ms", t.step_ms}});
  }
  nlohmann::json j = {{"pipeline_step", step},
                      {"loss", loss},
                      {"schedule", schedule},
                      {"stages", stages},
                      {"micro_batches", micro_batches},
                      {"virtual_stages", virtual_stages},
                      {"bubble", bubble},
                      {"bubble_formula", bubble_formula},
                      {"stage_timing", st}};
  if (zb_max_pending_w >= 0) j["zb_max_pending_w"] = zb_max_pending_w;
  return j;
}

// Waits on posted sends in a helper thread, and keeps MPI moving the prefetched receives
// while no send is pending; see [Pipeline Execution] and [Pipeline Receive Prefetch].
// Work::wait() polls MPI_Test with the group's timeout; the main thread never waits on a
// Work it handed here, and takes a watched receive back (unwatch) before waiting on it.
class PipeEngine::SendProgress {
 public:
  SendProgress() : thread_([this] { loop(); }) {}
  ~SendProgress() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(comm::WorkPtr w) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(w));
      ++inflight_;
    }
    cv_.notify_all();
  }
  // A posted receive: tested (MPI_Test, never waited on) between sends until unwatch().
  void watch(comm::Work* w) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      watched_.push_back({w, nullptr});
      nap_us_ = 50;
    }
    cv_.notify_all();
  }
  // Hands a watched receive back to the caller (who then waits on it); rethrows a failure
  // the helper saw while testing it.
  void unwatch(comm::Work* w) {
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto it = watched_.begin(); it != watched_.end(); ++it) {
        if (it->work != w) continue;
        e = it->error;
        watched_.erase(it);
        break;
      }
    }
    if (e) std::rethrow_exception(e);
  }
  // Blocks until every pushed send has completed; rethrows the first failure.
  void drain() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return inflight_ == 0; });
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  struct Watched {
    comm::Work* work;
    std::exception_ptr error;  // set once: completed() threw (the Work is abandoned)
  };
  bool testing() const {
    for (const auto& r : watched_)
      if (!r.error) return true;
    return false;
  }
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty() || testing(); });
      if (queue_.empty() && stop_) return;
      if (queue_.empty()) {
        // Only receives in flight: test each (MPI progresses every request of the rank,
        // which is what moves a large message on a shared-memory transport), then sleep,
        // 50 us doubling to 800 us while nothing completes (a stage that computes for
        // milliseconds is not interrupted 20 000 times a second).
        bool any = false;
        for (auto it = watched_.begin(); it != watched_.end();) {
          bool done = false;
          if (!it->error) {
            try {
              done = it->work->completed();
            } catch (...) {
              it->error = std::current_exception();
            }
          }
          any = any || done;
          it = done ? watched_.erase(it) : it + 1;
        }
        nap_us_ = any ? 50 : std::min(nap_us_ * 2, 800);
        lk.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(nap_us_));
        lk.lock();
        continue;
      }
      comm::WorkPtr w = std::move(queue_.front());
      queue_.pop_front();
      lk.unlock();
      try {
        w->wait();
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      w.reset();
      lk.lock();
      --inflight_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<comm::WorkPtr> queue_;
  std::vector<Watched> watched_;
  int nap_us_ = 50;  // the helper's sleep between tests of the watched receives
  int inflight_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

// The CUDA-event timing of one batch on a CUDA stage ([Pipeline Execution]). Events are
// recorded on the stage's current stream and read once, in finish().
class PipeEngine::EventTimer {
 public:
  explicit EventTimer(torch::Device d) : device_(d) {}
#ifdef ZT_WITH_CUDA
  void start() {
    spans_.clear();
    start_ = record();
  }
  void span(double* bucket, std::string label, const std::function<void()>& f) {
    auto a = record();
    f();
    spans_.push_back({bucket, std::move(label), std::move(a), record()});
  }
  void compute_end() { compute_end_ = record(); }
  // Waits for the stream, then adds each pass to its bucket and to busy_ms, and sets
  // wall_ms (start to compute end) and step_ms (compute end to now).
  // [Pipeline Stall Watchdog] Under NCCL every wait of the batch is the stream's (receives,
  // the ZeRO reductions), so the host runs ahead to here: this is where a message or
  // collective that never comes would hang the rank. The wait polls the stream's event
  // instead; past `timeout` (the group's, ZT_COMM_TIMEOUT) it logs where this rank's stream
  // stopped -- the first pass whose start or end event has not passed, i.e. the instruction
  // the stream waits in -- and past twice `timeout` throws CommError with the same text.
  void finish(StageTiming& t, std::chrono::milliseconds timeout, const std::string& who) {
    auto done = record();
    const auto t0 = std::chrono::steady_clock::now();
    bool logged = false;
    while (!done.query()) {
      const auto waited = std::chrono::steady_clock::now() - t0;
      if (waited > timeout) {
        const std::string msg = detail::cat(
            who, ": the stage's CUDA stream has not finished the batch after ",
            std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() / 1000.0, " s; it stopped ",
            stalled_at(), ". A peer's message or collective it waits for never came (a peer rank hung or issued ",
            "its operations in another order). Raise the limit with ZT_COMM_TIMEOUT=<seconds> if a rank is just slow.");
        if (!logged) log::error("%s", msg.c_str());
        logged = true;
        if (waited > 2 * timeout) throw CommError(msg);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    for (auto& s : spans_) {
      const double d = s.a.elapsed_time(s.b);
      *s.bucket += d;
      t.busy_ms += d;
    }
    spans_.clear();
    t.wall_ms = start_.elapsed_time(compute_end_);
    t.step_ms = compute_end_.elapsed_time(done);
  }

 private:
  // The first pass the stream has not completed (see finish).
  std::string stalled_at() const {
    for (size_t i = 0; i < spans_.size(); ++i) {
      const auto& s = spans_[i];
      if (!s.a.query()) {
        return detail::cat("before pass ", i + 1, " of ", spans_.size(), " '", s.label,
                           "' (waiting for the receive before it)");
      }
      if (!s.b.query()) {
        return detail::cat("inside pass ", i + 1, " of ", spans_.size(), " '", s.label,
                           "' (its compute, or, in a backward, the ZeRO reduce-scatters its end waits for)");
      }
    }
    if (!compute_end_.query()) return "after the last pass, before the batch's end";
    return "after every pass, in the optimizer step (the gradient norm, reductions or all-gathers over dp / mp)";
  }
  at::cuda::CUDAEvent record() {
    at::cuda::CUDAEvent e(/*flags=*/0);  // cudaEventDefault: timing on
    e.record(c10::cuda::getCurrentCUDAStream(device_.index()));
    return e;
  }
  struct Span {
    double* bucket;
    std::string label;  // the instruction, e.g. "B3.1"
    at::cuda::CUDAEvent a, b;
  };
  std::vector<Span> spans_;
  at::cuda::CUDAEvent start_, compute_end_;
#else
  [[noreturn]] static void no_cuda() { throw Error("pipeline: CUDA timing in a build without CUDA"); }
  void start() { no_cuda(); }
  void span(double*, const std::string&, const std::function<void()>&) { no_cuda(); }
  void compute_end() { no_cuda(); }
  void finish(StageTiming&, std::chrono::milliseconds, const std::string&) { no_cuda(); }
#endif
  torch::Device device_;
};

struct PipeEngine::Slot {
  torch::Tensor input;     // received activation (a leaf requiring grad) on non-first chunks
  torch::Tensor output;    // hidden state, or the loss on the head chunk
  torch::Tensor out_grad;  // gradient of output received from the next virtual stage
  torch::Tensor in_grad;   // gradient of input, to send back
  // zb-h1: the weight-gradient closures its B pass collected, run by its W.
  // [Deferred Weight Gradients] in models/deferred_grad.h
  std::shared_ptr<models::WeightGradCollector> deferred;
};

PipeEngine::PipeEngine(const models::GPT2& full, const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts)
    : PipeEngine(
          gpt2_layers(full->config()), 1,
          [&full](std::vector<std::pair<int, int>> chunks, int64_t interval) -> PipeStagePtr {
            return GPT2Stage(full, std::move(chunks), interval).ptr();
          },
          cfg, topo, std::move(opts)) {}

PipeEngine::PipeEngine(const models::GPT2TP& full, const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts)
    : PipeEngine(
          gpt2_layers(full->config()), full->tp_size(),
          [&full](std::vector<std::pair<int, int>> chunks, int64_t interval) -> PipeStagePtr {
            return GPT2Stage(full, std::move(chunks), interval).ptr();
          },
          cfg, topo, std::move(opts)) {}

PipeEngine::PipeEngine(const models::LlamaForCausalLM& full, const PipeConfig& cfg, parallel::Topology& topo,
                       PipeOptions opts)
    : PipeEngine(
          llama_layers(full->config()), 1,
          [&full](std::vector<std::pair<int, int>> chunks, int64_t interval) -> PipeStagePtr {
            return LlamaStage(full, std::move(chunks), interval).ptr();
          },
          cfg, topo, std::move(opts)) {}

PipeEngine::PipeEngine(const std::vector<LayerInfo>& layers, int model_tp,
                       const std::function<PipeStagePtr(std::vector<std::pair<int, int>>, int64_t)>& make_stage,
                       const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts)
    : cfg_(cfg), opts_(std::move(opts)) {
  const auto& d = topo.dims();
  const auto& po = cfg_.pipeline;
  // Every check below is a function of the config and the model, so every rank throws
  // alike before the first collective.
  ZT_CHECK_T(d.pp == po.stages, ConfigError, "pipeline.stages = ", po.stages, " but the topology has pp ", d.pp,
             ": build the Topology with pp = pipeline.stages");
  ZT_CHECK_T(d.ep == 1, ConfigError, "the pipeline engine runs dp x tp x pp (topology ", d.to_string(),
             "): expert parallelism with a pipeline is not implemented yet");
  ZT_CHECK_T(d.tp == model_tp, ConfigError, "the topology has tp ", d.tp, " but the model is cut over ", model_tp,
             " tensor-parallel ranks: ",
             model_tp == 1 ? "pass a GPT2TP built over topo.tp() for tp > 1 (a pipelined Llama runs at tp 1 only)"
                           : "build the GPT2TP over topo.tp()");
  ZT_CHECK_T(cfg_.config.tp_size() == d.tp, ConfigError, "tensor_parallel.autotp_size = ",
             cfg_.config.tensor_parallel.autotp_size, " but the topology has tp ", d.tp,
             ": set tensor_parallel.autotp_size to the topology's tp");
  // The activation_checkpointing section describes the engine's (and GPT2TP's) checkpoints;
  // the stages checkpoint with pipeline.activation_checkpoint_interval only, so a key set
  // there would be accepted and ignored.
  const auto& ac = cfg_.config.activation_checkpointing;
  const char* ac_key = ac.partition_activations            ? "partition_activations"
                       : ac.cpu_checkpointing              ? "cpu_checkpointing"
                       : ac.contiguous_memory_optimization ? "contiguous_memory_optimization"
                       : ac.number_checkpoints             ? "number_checkpoints"
                       : ac.synchronize_checkpoint_boundary ? "synchronize_checkpoint_boundary"
                       : ac.profile                         ? "profile"
                                                            : nullptr;
  ZT_CHECK_T(ac_key == nullptr, ConfigError, "activation_checkpointing.", ac_key ? ac_key : "",
             " with pipeline.stages > 1 is not supported: the pipeline stages checkpoint with "
             "pipeline.activation_checkpoint_interval; remove activation_checkpointing.", ac_key ? ac_key : "");
  ZT_CHECK_T(cfg_.config.zero_optimization.stage <= 2, ConfigError, "zero_optimization.stage = ",
             cfg_.config.zero_optimization.stage,
             " with pipeline.stages > 1 is not supported: use ZeRO stage 0, 1 or 2 over the data-parallel ranks "
             "(DeepSpeed's pipeline refuses stages 2 and 3)");
  ZT_CHECK_T(cfg_.config.dp_world_size == d.dp, ConfigError, "the config was resolved for ", cfg_.config.dp_world_size,
             " data-parallel ranks but the topology has dp ", d.dp, ": parse it for the world size ", d.world());
  const ScheduleSpec spec{parse_schedule_kind(po.schedule), d.pp,
                          static_cast<int>(cfg_.config.gradient_accumulation_steps),
                          static_cast<int>(po.virtual_stages), static_cast<int>(po.zb_max_pending_w)};
  schedule_ = make_schedule(spec);
  ZT_CHECK_T(!(po.activation_checkpoint_interval > 0 && splits_backward(spec.kind)), ConfigError,
             "pipeline.activation_checkpoint_interval > 0 cannot run with the zb-h1 schedule (a checkpointed range "
             "back-propagates its weights inside the input-gradient pass); use 1f1b or set it to 0");
  // Interleaved 1F1B with ZeRO-2 over dp > 1 hangs under NCCL when the pipeline's groups
  // connect lazily inside the first batch ([Pipeline Eager Groups]): with the eager setup
  // turned off (ZT_PIPE_EAGER_COMMS=0) it is refused on CUDA rather than left to hang;
  // ZT_PIPE_ALLOW_INTERLEAVED_ZERO2=1 lifts that refusal (diagnosis only).
  const bool eager_groups = env_not_zero("ZT_PIPE_EAGER_COMMS");
  if (opts_.device.value_or(default_device()).is_cuda() && spec.virtual_stages > 1 &&
      cfg_.config.zero_optimization.stage == 2 && d.dp > 1 && !eager_groups) {
    const char* allow = std::getenv("ZT_PIPE_ALLOW_INTERLEAVED_ZERO2");
    ZT_CHECK_T(allow != nullptr && std::string(allow) == "1", ConfigError, "pipeline.virtual_stages = ",
               spec.virtual_stages, " (interleaved schedule) with zero_optimization.stage = 2 over ", d.dp,
               " data-parallel GPUs with ZT_PIPE_EAGER_COMMS=0 hangs under NCCL (lazily connected pipeline "
               "groups); unset ZT_PIPE_EAGER_COMMS, or use zero_optimization.stage 1, or the 1f1b / zb-h1 schedule");
    if (topo.parent()->rank() == 0) {
      log::warn("ZT_PIPE_ALLOW_INTERLEAVED_ZERO2=1 with ZT_PIPE_EAGER_COMMS=0: running the interleaved schedule "
                "with ZeRO-2 over %d data-parallel GPUs and lazy pipeline groups, which HANGS under NCCL (issue "
                "25) -- for diagnosis only; set ZT_COMM_TIMEOUT "
                "so a stalled stream is reported (docs/pipeline.md)", d.dp);
    }
  }
  // [Deferred Weight Gradients]: on by default for zb-h1; ZT_PIPE_ZB_DEFERRED_W=0 runs every W
  // as the autograd pass through the stage (for A/B timing).
  defer_weight_pass_ = env_not_zero("ZT_PIPE_ZB_DEFERRED_W");
  release_b_graph_ = env_not_zero("ZT_PIPE_ZB_RELEASE_GRAPH");  // [B Graph Release]
  if (!defer_weight_pass_ && splits_backward(spec.kind) && topo.parent()->rank() == 0) {
    log::warn("ZT_PIPE_ZB_DEFERRED_W=0: zb-h1's weight passes run as autograd passes through the stage "
              "(recomputing B's activation gradients) [Deferred Weight Gradients]");
  }
  const int chunks = spec.stages * spec.virtual_stages;
  bounds_ = partition_layers(layers, chunks, po.partition,
                             spec.virtual_stages > 1 ? "pipeline.stages x virtual_stages" : "pipeline.stages");
  stage_ = topo.coords().pp;
  std::vector<std::pair<int, int>> mine;
  for (int c = 0; c < spec.virtual_stages; ++c) {
    const size_t part = static_cast<size_t>(c * spec.stages + stage_);
    mine.emplace_back(bounds_[part], bounds_[part + 1]);
  }
  module_ = make_stage(mine, po.activation_checkpoint_interval);

  // Groups, in the same order on every rank (the splits are collective).
  world_ = topo.parent();
  auto dp = topo.dp();
  auto mp = topo.model_parallel();
  pp_ = topo.pp();
  if (spec.stages > 1) {
    act_ = pp_->split(0, pp_->rank());
    grad_ = pp_->split(0, pp_->rank());
  }
  // The stage engine counts one micro-step per backward call, and a stage with v chunks
  // makes v of them per micro-batch: its window is m * v calls, and the loss gradient
  // entering the head carries v * backward_scale() = loss scale / m (see roots in run()).
  Config stage_cfg = cfg_.config;
  stage_cfg.gradient_accumulation_steps *= spec.virtual_stages;
  stage_cfg.train_batch_size *= spec.virtual_stages;
  EngineOptions eo;
  eo.group = dp;
  eo.model_parallel = mp;
  if (module_->tp_size() > 1) eo.norm_weight = [m = module_.get()](const std::string& name) { return m->norm_weight(name); };
  eo.device = opts_.device;
  eo.print = false;
  eo.checkpoint_group = world_;  // [Pipeline Checkpoints]: one checkpoint over every stage
  eo.tensor_parallel_spec = pipe_stage_tp_spec(*module_);  // each stage's tp shards ([TP Reshard])
  engine_ = initialize(module_, stage_cfg, eo);
  module_->place_tied_copy(engine_->device(), engine_->compute_dtype());
  for (const auto& p : module_->parameters()) params_.push_back(p);
  if (spec.stages > 1 && eager_groups) {
    connect_pipeline_groups(act_, grad_, pp_, mp, module_->tp_group(), dp, stage_, spec.stages, engine_->device());
  }
  int thread_level = 0;
  MPI_Query_thread(&thread_level);
  if (spec.stages > 1 && engine_->device().is_cpu() && thread_level == MPI_THREAD_MULTIPLE)
    progress_ = std::make_unique<SendProgress>();
  if (engine_->device().is_cuda()) events_ = std::make_unique<EventTimer>(engine_->device());
}

PipeEngine::~PipeEngine() {
  // Sends still in flight complete in their Work's destructor ([P2P Rules]).
  abandon_prefetched();  // none outside a batch, unless one failed
  progress_.reset();
  pending_.clear();
  events_.reset();
}

void PipeEngine::post_send(const comm::GroupPtr& g, const torch::Tensor& t, int peer) {
  auto w = g->batch_isend_irecv({comm::isend(t, peer)});
  if (progress_) {
    progress_->push(std::move(w));
  } else {
    pending_.push_back(std::move(w));
  }
}

bool PipeEngine::partitioned_p2p() const { return module_->tp_size() > 1 && !module_->sequence_parallel(); }

void PipeEngine::send_p2p(const comm::GroupPtr& g, const torch::Tensor& t, int peer) {
  auto flat = t.contiguous().view(-1);
  if (partitioned_p2p()) {
    const int64_t n = flat.numel() / module_->tp_size();  // C divides by n_head, which divides by tp
    flat = flat.narrow(0, module_->tp_rank() * n, n);
  }
  p2p_bytes_ += flat.numel() * static_cast<int64_t>(flat.element_size());
  post_send(g, flat, peer);
}

torch::Tensor PipeEngine::recv_p2p(const comm::GroupPtr& g, std::vector<int64_t> shape, int peer) {
  auto raw = recv_buffer(shape);
  g->recv(raw, peer);
  return assemble_p2p(raw, shape);
}

torch::Tensor PipeEngine::recv_buffer(const std::vector<int64_t>& shape) const {
  const auto opts = torch::TensorOptions().dtype(engine_->compute_dtype()).device(engine_->device());
  if (!partitioned_p2p()) return torch::empty(shape, opts);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int n = module_->tp_size();
  ZT_ASSERT(numel % n == 0, "pipeline p2p: ", numel, " elements do not divide by tp ", n);
  return torch::empty({numel / n}, opts);
}

torch::Tensor PipeEngine::assemble_p2p(const torch::Tensor& raw, const std::vector<int64_t>& shape) {
  if (!partitioned_p2p()) return raw;
  auto whole = torch::empty(shape, raw.options());
  auto flat = whole.view(-1);
  module_->tp_group()->all_gather(flat, raw);
  return whole;
}

// [Pipeline Receive Prefetch]: posts the first receive at or after instruction `from` of
// this stage's list on `channel` (0: activations, 1: gradients), if there is one.
void PipeEngine::prefetch_from(int channel, size_t from, const std::vector<MicroBatch>& mbs) {
  const auto& instrs = schedule_.stages[static_cast<size_t>(stage_)];
  const Op want = channel == 0 ? Op::kRecvAct : Op::kRecvGrad;
  Prefetched& pf = prefetch_[channel];
  pf = Prefetched{};
  for (size_t i = from; i < instrs.size(); ++i) {
    if (instrs[i].op != want) continue;
    const int p = schedule_.spec.stages;
    const int peer = channel == 0 ? (stage_ + p - 1) % p : (stage_ + 1) % p;
    const auto& idx = mbs[static_cast<size_t>(instrs[i].mb)].idx;
    pf.shape = {idx.size(0), module_->hidden_len(idx.size(1)), module_->hidden_size()};
    pf.buf = recv_buffer(pf.shape);
    pf.work = (channel == 0 ? act_ : grad_)->batch_isend_irecv({comm::irecv(pf.buf, peer)});
    pf.instr = i;
    progress_->watch(pf.work.get());
    return;
  }
}

// The prefetched receive of instruction `at` (waited for here, with the group's timeout);
// posts the channel's next one before returning.
torch::Tensor PipeEngine::take_prefetched(int channel, size_t at, const std::vector<MicroBatch>& mbs) {
  Prefetched pf = std::move(prefetch_[channel]);
  prefetch_[channel] = Prefetched{};
  ZT_ASSERT(pf.work && pf.instr == at, "pipeline: no receive prefetched for instruction ", at + 1);
  progress_->unwatch(pf.work.get());
  pf.work->wait();
  prefetch_from(channel, at + 1, mbs);
  return assemble_p2p(pf.buf, pf.shape);
}

// After a failure inside a batch: a receive still posted may yet be written by MPI (or
// never complete), so it and its buffer are kept alive forever, as the comm layer does
// with an abandoned request; the batch's messages are out of step from here on anyway.
void PipeEngine::abandon_prefetched() {
  for (auto& pf : prefetch_) {
    if (!pf.work) continue;
    if (progress_) {
      try {
        progress_->unwatch(pf.work.get());
      } catch (...) {
      }
    }
    new Prefetched(std::move(pf));  // NOLINT: intentional leak, see above
    pf = Prefetched{};
  }
}

void PipeEngine::finish_sends() {
  if (progress_) progress_->drain();
  for (auto& w : pending_) w->wait();
  pending_.clear();
}

// [Deferred Weight Gradients]: W can run from the closures B collected when every
// parameter of the stage that requires grad has one and every closure is for a parameter;
// otherwise (a module of plain ATen ops, e.g. the CPU RMSNorm reference) W is an autograd
// pass through the kept graph, and the first such micro-batch logs the parameter. Decided
// right after B.
bool PipeEngine::weight_pass_covered(const models::WeightGradCollector& c) {
  std::string missing;
  size_t trainable = 0;
  for (const auto& p : params_) {
    if (!p.requires_grad()) continue;
    ++trainable;
    if (missing.empty() && !c.covers(p)) missing = "parameter '" + param_name(p) + "'";
  }
  // Every trainable parameter is covered: any further covered tensor is not one of them.
  if (missing.empty() && c.num_covered() != trainable) {
    missing = "a deferred gradient for a tensor that is not one of the stage's parameters";
  }
  if (missing.empty()) return trainable > 0;
  if (!fallback_logged_) {
    fallback_logged_ = true;
    log::warn("pipeline stage %d: zb-h1's weight pass runs as an autograd pass through the stage (recomputing the "
              "activation gradients of B): %s got no deferred weight gradient in B (a module of plain ATen ops); "
              "logged once [Deferred Weight Gradients]",
              stage_, missing.c_str());
  }
  return false;
}

std::string PipeEngine::param_name(const torch::Tensor& p) const {
  for (const auto& kv : module_->named_parameters()) {
    if (kv.value().unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return kv.key();
  }
  return "?";
}

void PipeEngine::run(const Instr& in, size_t at, std::vector<MicroBatch>& mbs, std::vector<Slot>& slots,
                     StageTiming& t) {
  const int p = schedule_.spec.stages, v = schedule_.spec.virtual_stages;
  const int next = (stage_ + 1) % p, prev = (stage_ + p - 1) % p;
  Slot* slot = in.mb >= 0 ? &slots[static_cast<size_t>(in.mb * v + in.chunk)] : nullptr;
  const bool head = slot && module_->has_head(in.chunk);
  const bool first_vs = slot && schedule_.virtual_stage(stage_, in.chunk) == 0;
  const int64_t C = module_->hidden_size();
  auto hidden_shape = [&] {
    const auto& idx = mbs[static_cast<size_t>(in.mb)].idx;
    return std::vector<int64_t>{idx.size(0), module_->hidden_len(idx.size(1)), C};
  };
  // What a backward of `slot` starts from: the loss (gradient = the engine's scale) on the
  // head chunk, else the output with the gradient the next stage sent.
  auto roots = [&](std::vector<torch::Tensor>& outs, std::vector<torch::Tensor>& grads) {
    outs = {slot->output};
    grads = {head ? torch::full_like(slot->output, engine_->backward_scale() * v) : slot->out_grad};
  };
  // Before the first stage's last backward of chunk 0: the tied gradient from the last
  // stage joins it through a view of wte ([Pipeline Tied Weights]).
  auto add_tied = [&](std::vector<torch::Tensor>& outs, std::vector<torch::Tensor>& grads) {
    if (!tied_grad_ready_ || !first_vs || !module_->holds_embedding()) return;
    auto w = module_->embedding_weight();
    outs.push_back(w.view_as(w));
    grads.push_back(tied_grad_);
    tied_grad_ready_ = false;
  };
  auto timed = [&](double& bucket, const std::function<void()>& f) {
    if (events_) return events_->span(&bucket, in.str(v > 1), f);
    const auto a = Clock::now();
    f();
    const double d = ms_since(a, Clock::now());
    bucket += d;
    t.busy_ms += d;
  };
  switch (in.op) {
    case Op::kRecvAct: {
      auto x = progress_ ? take_prefetched(0, at, mbs) : recv_p2p(act_, hidden_shape(), prev);
      slot->input = x.requires_grad_(true);
      break;
    }
    case Op::kForward: {
      const auto& mb = mbs[static_cast<size_t>(in.mb)];
      const torch::Tensor x = module_->has_embedding(in.chunk) ? mb.idx : slot->input;
      const torch::Tensor targets = head ? mb.targets : torch::Tensor();
      timed(t.forward_ms, [&] {
        slot->output = engine_->forward([&] { return module_->forward(in.chunk, x, targets); });
      });
      if (head) {
        auto l = slot->output.detach().to(torch::kDouble);
        loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l;
      }
      break;
    }
    case Op::kSendAct:
      send_p2p(act_, slot->output.detach(), next);
      break;
    case Op::kRecvGrad: {
      slot->out_grad = progress_ ? take_prefetched(1, at, mbs) : recv_p2p(grad_, hidden_shape(), next);
      break;
    }
    case Op::kBackward: {
      timed(t.backward_ms, [&] {
        std::vector<torch::Tensor> outs, grads;
        roots(outs, grads);
        add_tied(outs, grads);
        engine_->backward(outs, grads, {}, head ? slot->output.detach() : torch::Tensor());
        if (slot->input.defined()) slot->in_grad = slot->input.grad();
      });
      slot->output = torch::Tensor();
      slot->out_grad = torch::Tensor();
      break;
    }
    case Op::kBackwardInput: {
      if (first_vs) break;  // token ids have no gradient: W does the whole backward
      // [Input Backward Peak]: B is no phase of the stage engine (whose phases restart the
      // allocator's peak when they begin), so its peak is taken here.
      const bool cuda_peak = engine_->device().is_cuda();
#ifdef ZT_WITH_CUDA
      if (cuda_peak) c10::cuda::CUDACachingAllocator::resetPeakStats(engine_->device().index());
#endif
      timed(t.backward_ms, [&] {
        std::vector<torch::Tensor> outs, grads;
        roots(outs, grads);
        std::vector<torch::Tensor> ins{slot->input};
        const bool tied = head && module_->holds_tied_copy();
        if (tied) ins.push_back(module_->tied_copy());
        // The parametered nodes leave their weight gradients to W as closures
        // ([Deferred Weight Gradients]); the graph is kept for a fallback W, freed below otherwise.
        if (defer_weight_pass_) slot->deferred = std::make_shared<models::WeightGradCollector>();
        // [B Graph Release]: once a B's closures covered every parameter of the stage, B runs
        // without retaining the graph -- autograd frees each node's saved tensors once it has
        // run, as a plain backward does, instead of holding the whole micro-batch's until B
        // returns -- since W will need only the closures. ZT_PIPE_ZB_RELEASE_GRAPH=0 keeps it.
        const bool retain = !(slot->deferred && release_b_graph_ && closures_cover_stage_);
        torch::autograd::variable_list res;
        {
          models::CollectWeightGrads collect(slot->deferred.get());
          res = torch::autograd::grad(outs, ins, grads, retain, /*create_graph=*/false, /*allow_unused=*/true);
        }
        slot->in_grad = res[0];
        if (tied && res[1].defined()) tied_grad_ = tied_grad_.defined() ? tied_grad_ + res[1] : res[1];
        if (slot->deferred && !weight_pass_covered(*slot->deferred)) {
          ZT_CHECK_T(retain, InternalError, "pipeline stage ", stage_, ": micro-batch ", in.mb,
                     "'s input-gradient pass left a parameter without a deferred weight gradient after earlier "
                     "ones covered the stage, and its graph is already released [B Graph Release]; run with "
                     "ZT_PIPE_ZB_RELEASE_GRAPH=0");
          slot->deferred.reset();  // W recomputes everything the closures hold
          ++fallback_weight_passes_;
        } else if (slot->deferred) {
          closures_cover_stage_ = true;
        }
        if (slot->deferred) {
          // W needs only the closures and what they captured: the rest of the graph (and
          // the received gradient) is freed now, not at W.
          slot->output = slot->output.detach();
          slot->out_grad = torch::Tensor();
        }
      });
#ifdef ZT_WITH_CUDA
      if (cuda_peak) {
        const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(engine_->device().index());
        input_backward_peak_ = std::max<int64_t>(
            input_backward_peak_,
            st.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
      }
#endif
      (void)cuda_peak;
      break;
    }
    case Op::kBackwardWeight: {
      timed(t.weight_ms, [&] {
        const torch::Tensor loss = head ? slot->output.detach() : torch::Tensor();
        const auto deferred = std::move(slot->deferred);
        std::vector<torch::Tensor> outs, grads;
        if (deferred) {
          // [Deferred Weight Gradients]: one micro-step over a 0-dim root per parameter whose
          // backward runs that parameter's closures (then its AccumulateGrad and hooks).
          outs = deferred->roots(params_);
          for (const auto& r : outs) grads.push_back(torch::ones_like(r));
          engine_->backward(outs, grads, {}, loss);
          deferred_closures_run_ += deferred->closures_run();
          ++deferred_weight_passes_;
          deferred->clear();
          return;
        }
        // The first virtual stage's whole backward, or a B whose closures did not cover the stage.
        roots(outs, grads);
        add_tied(outs, grads);
        engine_->backward(outs, grads, params_, loss);
      });
      slot->output = torch::Tensor();
      slot->out_grad = torch::Tensor();
      slot->input = torch::Tensor();
      break;
    }
    case Op::kSendGrad:
      ZT_ASSERT(slot->in_grad.defined(), "no input gradient to send for micro-batch ", in.mb);
      send_p2p(grad_, slot->in_grad, prev);
      slot->in_grad = torch::Tensor();
      slot->input = torch::Tensor();
      break;
    case Op::kSendTiedGrad: {
      if (!module_->holds_tied_copy()) break;
      torch::Tensor g = splits_backward(schedule_.spec.kind) ? tied_grad_ : module_->tied_copy().grad();
      if (!g.defined()) g = torch::zeros_like(module_->tied_copy());
      post_send(pp_, g.contiguous(), 0);
      tied_grad_ = torch::Tensor();
      module_->tied_copy().mutable_grad() = torch::Tensor();
      break;
    }
    case Op::kRecvTiedGrad:
      if (!module_->holds_embedding()) break;
      tied_grad_ = torch::empty_like(module_->embedding_weight());
      pp_->recv(tied_grad_, p - 1);
      tied_grad_ready_ = true;
      break;
    case Op::kReduceGrads:
      break;  // inside the engine's step (and its backward at ZeRO stages 0 and 2)
    case Op::kOptimizerStep: {
      finish_sends();
      ZT_ASSERT(!tied_grad_ready_, "the tied gradient was received but not used");
      bool boundary = true;
      try {
        boundary = engine_->step();
      } catch (const CheckpointError&) {
        // [Pipeline Checkpoints]: an asynchronous save's failure, thrown on every rank by the
        // step that publishes it (the step itself is done). The rest of the schedule (the
        // tied weight's exchange) still runs; train_batch rethrows it at its end.
        step_error_ = std::current_exception();
      }
      ZT_ASSERT(boundary, "the pipeline's optimizer step is not at an accumulation boundary");
      break;
    }
    case Op::kSendTiedWeight:
      if (!module_->holds_embedding()) break;
      post_send(pp_, module_->embedding_weight().detach().clone(), p - 1);
      break;
    case Op::kRecvTiedWeight: {
      if (!module_->holds_tied_copy()) break;
      auto w = torch::empty_like(module_->tied_copy());
      pp_->recv(w, 0);
      torch::NoGradGuard ng;
      module_->tied_copy().copy_(w);
      break;
    }
  }
}

double PipeEngine::train_batch(const std::function<MicroBatch()>& next) {
  const auto& spec = schedule_.spec;
  ZT_CHECK_T(engine_->micro_steps() % (spec.micro_batches * spec.virtual_stages) == 0, TrainingError,
             "train_batch: the stage engine is in the middle of an accumulation window");
  std::vector<MicroBatch> mbs;
  for (int i = 0; i < spec.micro_batches; ++i) {
    mbs.push_back(next());
    const auto& mb = mbs.back();
    ZT_CHECK_T(mb.idx.defined() && mb.idx.dim() == 2 && mb.targets.defined() && mb.targets.sizes() == mb.idx.sizes(),
               ConfigError, "train_batch: micro-batch ", i, " must be idx and targets of the same (B, T) shape");
    mbs.back().idx = mb.idx.to(engine_->device());
    mbs.back().targets = mb.targets.to(engine_->device());
  }
  std::vector<Slot> slots(static_cast<size_t>(spec.micro_batches * spec.virtual_stages));
  loss_sum_ = torch::Tensor();
  tied_grad_ = torch::Tensor();
  tied_grad_ready_ = false;
  input_backward_peak_ = 0;
  StageTiming t;
  pp_->barrier();
  const auto t0 = Clock::now();
  auto compute_end = t0;
  if (events_) events_->start();
  const auto& instrs = schedule_.stages[static_cast<size_t>(stage_)];
  // A peer stage that stops (dies, hangs) surfaces as the group's CommError at its timeout
  // ([P2P Rules]); it is rethrown naming the instruction this stage was waiting in.
  size_t at = 0;
  try {
    if (progress_) {
      prefetch_from(0, 0, mbs);
      prefetch_from(1, 0, mbs);
    }
    for (; at < instrs.size(); ++at) {
      const auto& in = instrs[at];
      if (in.op == Op::kReduceGrads) {
        compute_end = Clock::now();
        if (events_) events_->compute_end();
      }
      run(in, at, mbs, slots, t);
    }
    finish_sends();
  } catch (const CommError& e) {
    abandon_prefetched();
    const bool in_loop = at < instrs.size();
    throw CommError(detail::cat("pipeline stage ", stage_, " of ", spec.stages, " (", schedule_name(spec.kind),
                                ", ", spec.micro_batches, " micro-batches), batch ", steps_ + 1, ": ",
                                in_loop ? "instruction " + std::to_string(at + 1) + " of " +
                                              std::to_string(instrs.size()) + " '" +
                                              instrs[at].str(spec.virtual_stages > 1) + "'"
                                        : std::string("waiting for its posted sends at the end of the batch"),
                                (in_loop && instrs[at].mb >= 0 ? " (micro-batch " + std::to_string(instrs[at].mb) + ")"
                                                                : std::string()),
                                " failed; a peer stage's rank stopped or died: ", e.what()));
  } catch (...) {
    abandon_prefetched();
    throw;
  }
  if (events_) {
    events_->finish(t, pp_->timeout(),
                    detail::cat("pipeline stage ", stage_, " of ", spec.stages, " (", schedule_name(spec.kind), ", ",
                                spec.micro_batches, " micro-batches), batch ", steps_ + 1));
  } else {
    const auto t1 = Clock::now();
    t.wall_ms = ms_since(t0, compute_end);
    t.step_ms = ms_since(compute_end, t1);
  }
  const double loss_sum = loss_sum_.defined() ? loss_sum_.item<double>() : 0.0;
  ++steps_;

  // Every stage's timing and the loss, over the pp group (CPU tensors: MPI).
  const int p = spec.stages;
  auto mine = torch::tensor({t.wall_ms, t.busy_ms, t.forward_ms, t.backward_ms, t.weight_ms, t.step_ms, loss_sum},
                            torch::kDouble);
  auto all = torch::empty({p * 7}, torch::kDouble);
  if (p > 1) {
    pp_->all_gather(all, mine);
  } else {
    all.copy_(mine);
  }
  report_ = PipeReport{};
  report_.step = steps_;
  report_.schedule = schedule_name(spec.kind);
  report_.stages = p;
  report_.micro_batches = spec.micro_batches;
  report_.virtual_stages = spec.virtual_stages;
  report_.zb_max_pending_w = spec.max_pending_w;
  report_.bubble_formula = bubble_formula(spec);
  auto a = all.accessor<double, 1>();
  double max_wall = 0, max_busy = 0, loss = 0;
  for (int s = 0; s < p; ++s) {
    StageTiming st;
    st.wall_ms = a[s * 7 + 0];
    st.busy_ms = a[s * 7 + 1];
    st.forward_ms = a[s * 7 + 2];
    st.backward_ms = a[s * 7 + 3];
    st.weight_ms = a[s * 7 + 4];
    st.step_ms = a[s * 7 + 5];
    loss += a[s * 7 + 6];
    max_wall = std::max(max_wall, st.wall_ms);
    max_busy = std::max(max_busy, st.busy_ms);
    report_.timing.push_back(st);
  }
  report_.loss = loss / spec.micro_batches;
  report_.bubble = max_busy > 0 ? (max_wall - max_busy) / max_busy : 0;
  if (world_->rank() == 0) {
    if (!opts_.metrics_path.empty()) {
      std::ofstream f(opts_.metrics_path, std::ios::app);
      ZT_CHECK_T(f.good(), ConfigError, "cannot open the pipeline metrics file ", opts_.metrics_path);
      f << report_.to_json().dump() << "\n";
    }
    if (opts_.print) {
      const std::string cap = spec.max_pending_w >= 0 ? " zb_max_pending_w " + std::to_string(spec.max_pending_w) : "";
      log::info("pipe step %lld: loss %.4f, %s%s p %d m %d v %d, bubble %.3f (formula %.3f)",
                  static_cast<long long>(report_.step), report_.loss, report_.schedule.c_str(), cap.c_str(), p,
                  spec.micro_batches, spec.virtual_stages, report_.bubble, report_.bubble_formula);
    }
  }
  if (step_error_) std::rethrow_exception(std::exchange(step_error_, nullptr));
  return report_.loss;
}

void PipeEngine::save_checkpoint(const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
                                 bool async) {
  nlohmann::json cs = client_state.is_null() ? nlohmann::json::object() : client_state;
  if (cs.is_object() && !cs.contains("pipeline")) {
    cs["pipeline"] = {{"stages", schedule_.spec.stages},
                      {"virtual_stages", schedule_.spec.virtual_stages},
                      {"schedule", schedule_name(schedule_.spec.kind)},
                      {"partition", bounds_}};
  }
  engine_->save_checkpoint(dir, tag, cs, async);
}

nlohmann::json PipeEngine::load_checkpoint(const std::string& dir, const std::string& tag) {
  // [Failed Previous Save] as Engine::load_checkpoint: settle a save in flight first; if it
  // failed, load anyway, finish the tied-weight exchange and the step count, then throw the
  // failure (the engine's own throw would skip them and leave the last stage's tied copy
  // stale). The failure is the same on every rank, so every rank takes the same path.
  return ckpt::load_after_settling(
      [&] { engine_->wait_checkpoint(); },
      [&](int64_t* step) {
        auto client = engine_->load_checkpoint(dir, tag);  // nothing in flight: it throws only its own failure
        // [Pipeline Tied Weights]: the checkpoint holds wte once; the last stage's copy takes the
        // first stage's loaded value (as after every step).
        if (module_->holds_embedding() && stages() > 1)
          post_send(pp_, module_->embedding_weight().detach().clone(), stages() - 1);
        if (module_->holds_tied_copy()) {
          auto w = torch::empty_like(module_->tied_copy());
          pp_->recv(w, 0);
          torch::NoGradGuard ng;
          module_->tied_copy().copy_(w);
        }
        finish_sends();
        *step = steps_ = engine_->global_steps();
        return client;
      },
      dir, tag);
}

void PipeEngine::wait_checkpoint() { engine_->wait_checkpoint(); }

double PipeEngine::eval_batch(const std::function<MicroBatch()>& next) {
  const auto& spec = schedule_.spec;
  const int p = spec.stages, v = spec.virtual_stages;
  const int nxt = (stage_ + 1) % p, prv = (stage_ + p - 1) % p;
  torch::NoGradGuard ng;
  double loss_sum = 0;
  for (int i = 0; i < spec.micro_batches; ++i) {
    MicroBatch mb = next();
    auto idx = mb.idx.to(engine_->device());
    auto targets = mb.targets.to(engine_->device());
    // Chunks in virtual-stage order: a valid order on every rank, and the messages of each
    // (sender, receiver) pair go in the same order on both sides.
    for (int c = 0; c < v; ++c) {
      const int vs = schedule_.virtual_stage(stage_, c);
      torch::Tensor x = idx;
      if (vs > 0) {
        x = recv_p2p(act_, {idx.size(0), module_->hidden_len(idx.size(1)), module_->hidden_size()}, prv);
      }
      auto y = module_->forward(c, x, module_->has_head(c) ? targets : torch::Tensor());
      if (module_->has_head(c)) {
        loss_sum += y.item<double>();
      } else {
        send_p2p(act_, y, nxt);
      }
    }
  }
  finish_sends();
  auto l = torch::tensor({loss_sum}, torch::kDouble);
  if (p > 1) pp_->all_reduce(l, comm::ReduceOp::kSum);
  return l.item<double>() / spec.micro_batches;
}

}  // namespace zt::pipe

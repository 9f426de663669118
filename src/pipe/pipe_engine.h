// zt::pipe::PipeEngine: runs a pipeline schedule (pipe/schedule.h) over the pp group of a
// parallel::Topology, one zt::Engine per stage over the stage's data-parallel group --
// DeepSpeed's PipelineEngine (runtime/pipe/engine.py: train_batch / eval_batch), with
// ZeRO stages 0, 1 and 2 over dp (DeepSpeed refuses 2) and the gpipe, 1f1b, interleaved
// and zb-h1 schedules.
//
//   auto pc = zt::pipe::pipeline_config(json, world->size());
//   zt::parallel::Topology topo(world, zt::parallel::ParallelDims::make(world->size(), dp, 1, pp));
//   torch::manual_seed(1);
//   zt::models::GPT2 full(cfg);                 // the whole model; each stage keeps its layers
//   zt::pipe::PipeEngine pipe(full, pc, topo);
//   for (...) double loss = pipe.train_batch(next_micro_batch);
//
// [Pipeline Execution]
//  * Micro-batches per batch = gradient_accumulation_steps. train_batch calls `next` that
//    many times on EVERY rank (the first stage uses the token ids, the last stage the
//    targets, the others the shape), like a data loader per rank.
//  * A stage's engine sees one micro-step per backward call, one per micro-batch and chunk
//    (its gradient_accumulation_steps is m x virtual_stages): the chunk's full backward
//    (gpipe, 1f1b, interleaved; Engine::backward(outputs, grads), the outputs being the
//    loss on the head chunk) or its weight pass (zb-h1: the input gradient comes first
//    from torch::autograd::grad(...; the graph retained until a B's closures have covered
//    the stage, [B Graph Release] in pipe_engine.cpp), the weight gradient later from the
//    closures the parametered nodes left in B, run as one Engine::backward over a root per
//    parameter -- [Deferred Weight Gradients] in models/deferred_grad.h -- or, when a
//    parameter got none, from Engine::backward(outputs, grads, parameters)). The loss gradient is
//    virtual_stages x backward_scale() = loss scale / m, and the gradients sent back carry
//    it, so every stage's gradients carry the scale of the non-pipelined engine.
//  * Activations and gradients travel on two groups split from the pp group, so each
//    (sender, receiver) pair sees its messages in schedule order ([P2P Rules],
//    [Pipeline Schedules]); sends are posted without waiting and completed before the
//    optimizer step; receives block with the group's timeout (a dead stage is a CommError
//    naming the op and peer, never a hang). On CPU ranks a helper thread waits on the
//    posted sends while the stage computes: MPI moves a large message only while the
//    sender is inside MPI, so without it a send posted before a forward completed only at
//    the stage's next receive, and the stages ran one after the other (measured bubble
//    ~1.0 for 1f1b at p 2, m 8). Needs MPI_THREAD_MULTIPLE (else sends complete at the
//    next MPI call, as before).
//  * [Pipeline Receive Prefetch] With that helper thread (CPU ranks), each channel's next
//    receive of the batch is posted as soon as the previous one is taken (the first at
//    the batch start), into a buffer of its own, and the helper tests it while no send
//    is pending, so MPI moves the message while the stage computes (MPI's shared-memory
//    transport without single-copy moves a large message only while both ranks are
//    inside MPI: each 512 KiB receive cost ~1 ms at the instruction, 32 per batch in the
//    interleaved schedule at p 2, m 8). The receive instruction then waits only for what
//    has not arrived, with the group's timeout counted from there. Messages still pair in
//    schedule order per channel; one extra buffer per channel. CUDA stages receive at the
//    instruction, as before (NCCL runs on its own stream).
//  * The gradient norm (clipping, overflow) is summed over the model-parallel group (the
//    tp x pp ranks of one replica), so every stage and tp rank clips and skips alike.
//    Tied weights: see [Pipeline Tied Weights]; tensor parallelism: see [Pipeline x Tensor
//    Parallel] in pipe/gpt2_pipe.h.
//  * Timing: the batch starts after a barrier over the pp group; a stage's wall time runs
//    to the end of its last forward/backward, its busy time sums them. On CPU ranks both
//    are host wall clock. On CUDA they are CUDA events on the stage's compute stream
//    (one pair around each forward/backward/weight pass, one at the batch start, one at
//    the end of the last pass, one after the step), read once at the end of the batch:
//    no synchronize between passes, so the schedule runs as it would untimed, and the
//    wall time includes the stream's waits for a peer's activations or gradients. The
//    head's losses are summed on the device and read once per batch. The measured bubble
//    is (max wall - max busy) / max busy over the stages, the quantity the formulas give.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/pipeline_options.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "parallel/topology.h"
#include "pipe/gpt2_pipe.h"
#include "pipe/llama_pipe.h"
#include "pipe/stage.h"
#include "pipe/schedule.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt::models {
class WeightGradCollector;  // models/deferred_grad.h
}  // namespace zt::models

namespace zt::pipe {

struct PipeConfig {
  Config config;                     // resolved for world / pp data-parallel ranks
  config::PipelineOptions pipeline;  // the pipeline section
};
// Config::parse of a DeepSpeed config for `world_size` ranks with the pipeline section
// read as well; pipeline.stages > 1 and tensor_parallel.autotp_size > 1 are accepted here
// (they are "not supported" for zt::initialize; a tensor-parallel pipeline takes a GPT2TP),
// any other not-supported setting throws ConfigError as from_json does.
PipeConfig pipeline_config(const nlohmann::json& ds_config, int world_size, const std::string& origin = "<json>");

struct MicroBatch {
  torch::Tensor idx;      // (B, T) int64 token ids
  torch::Tensor targets;  // (B, T) int64, -1 = ignored
};

// One stage's times in one batch (milliseconds, wall clock).
struct StageTiming {
  double wall_ms = 0;  // batch start to the end of the stage's last forward/backward
  double busy_ms = 0;  // forward + backward (+ weight) time
  double forward_ms = 0, backward_ms = 0, weight_ms = 0;
  double step_ms = 0;  // the optimizer step (and tied-weight exchange), after wall_ms
  double busy_fraction() const { return wall_ms > 0 ? busy_ms / wall_ms : 0; }
};

struct PipeReport {
  int64_t step = 0;
  double loss = 0;  // mean over the batch's micro-batches (this data-parallel replica)
  std::string schedule;
  int stages = 1, micro_batches = 1, virtual_stages = 1;
  int zb_max_pending_w = -1;        // pipeline.zb_max_pending_w (-1: not set; in the JSON only when set)
  std::vector<StageTiming> timing;  // per stage (pp rank)
  double bubble = 0;                // measured: (max wall - max busy) / max busy
  double bubble_formula = 0;        // bubble_formula(spec)
  nlohmann::json to_json() const;
};

struct PipeOptions {
  std::optional<torch::Device> device;  // unset: zt::default_device()
  std::string metrics_path;             // JSON lines, one PipeReport per batch (world rank 0)
  bool print = false;                   // one line per batch on world rank 0
};

class PipeEngine {
 public:
  // Collective over the topology's parent group. `full` is the whole GPT-2 (built from one
  // seed on every rank); this rank keeps the layers of its stage's chunks
  // (pipeline.partition over gpt2_layers; interleaved: pp x virtual_stages chunks, chunk c
  // of stage s = part c*pp + s). ConfigError, before any step, for: topology pp !=
  // pipeline.stages, tp > 1 (the GPT2TP overload below), ep > 1, ZeRO stage 3, fewer
  // pipeline layers than chunks, a schedule that does not fit the micro-batches, and an
  // activation_checkpointing key (the stages use pipeline.activation_checkpoint_interval).
  PipeEngine(const models::GPT2& full, const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts = {});
  // Tensor x pipeline parallelism ([Pipeline x Tensor Parallel] in pipe/gpt2_pipe.h): `full`
  // is GPT2TP over topo.tp() (built, e.g. with load_full, from the same whole GPT-2 on every
  // rank); each rank keeps its stage's layers of its tp slice. The topology's tp must be the
  // model's and the config's (tensor_parallel.autotp_size); the partition is the one of the
  // whole GPT-2 (the same stage boundaries at every tp). The norm sums over the
  // model-parallel group (tp x pp ranks of one replica), replicated parameters weighing 1/tp.
  PipeEngine(const models::GPT2TP& full, const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts = {});
  // A Llama-family model ([Llama Pipeline] in pipe/llama_pipe.h): the same, with the
  // partition over llama_layers; tp 1 (ConfigError for a topology with tp > 1).
  PipeEngine(const models::LlamaForCausalLM& full, const PipeConfig& cfg, parallel::Topology& topo,
             PipeOptions opts = {});
  ~PipeEngine();

  // One batch: gradient_accumulation_steps micro-batches through the schedule, then the
  // optimizer step on every stage. Collective over the world. Returns the batch's mean loss
  // (on every rank). When the step publishes a failed asynchronous save, the batch completes
  // (last_report() holds it) and CheckpointError is thrown on every rank at the end.
  double train_batch(const std::function<MicroBatch()>& next);
  // Forward only, no gradients, no step: the mean loss over gradient_accumulation_steps
  // micro-batches (on every rank). Collective.
  double eval_batch(const std::function<MicroBatch()>& next);

  // [Pipeline Checkpoints] (src/ckpt/engine_checkpoint.cpp; docs/pipeline.md#checkpoints)
  // Collective over every rank of the pipeline, between batches. Every stage's engine saves
  // its parameters, optimizer state and counters into ONE checkpoint under the whole GPT-2's
  // names ("h.3..." for stage 1's first block at pp 2 of 6 blocks), each parameter once
  // (the last stage's tied copy of wte is not stored): the files a non-pipelined engine
  // writes, so it loads at any pp (and without a pipeline) and any dp / ZeRO stage 0-2; a
  // non-pipelined GPT-2 checkpoint loads here. Same pp, dp and schedule: the resume is
  // bit-exact. Stages cut from a GPT2TP store each split parameter as tp shards with their
  // cut ([TP Reshard] in ckpt/tp_reshard.h) and a replicated one once: a tp x pp checkpoint
  // loads at any tp, pp and dp, and a plain or tp-only one loads here.
  // `client_state` (world rank 0's) is stored with a "pipeline" entry added
  // (stages, virtual stages, partition; informational). async: Engine::save_checkpoint's
  // asynchronous save, published at a later train_batch or wait_checkpoint().
  void save_checkpoint(const std::string& dir, const std::string& tag = "", const nlohmann::json& client_state = {},
                       bool async = false);
  // Restores every stage's engine from `dir` (tag "" = latest), then sends the loaded wte to
  // the last stage's tied copy. Returns the client state.
  nlohmann::json load_checkpoint(const std::string& dir, const std::string& tag = "");
  // Publishes an asynchronous save in flight (collective).
  void wait_checkpoint();

  const Schedule& schedule() const { return schedule_; }
  int stage() const { return stage_; }
  int stages() const { return schedule_.spec.stages; }
  Engine& engine() { return *engine_; }
  // This rank's stage (pipe/stage.h): a GPT2Stage or a LlamaStage.
  const PipeStagePtr& module() { return module_; }
  // [first, last) pipeline layers of each stage's chunks: parts()[c * pp + s].
  const std::vector<int>& partition() const { return bounds_; }
  const PipeReport& last_report() const { return report_; }
  // Bytes of activations and activation gradients this rank has sent to its pipeline
  // neighbours so far (not the tied weight's messages): with tp, 1/tp of the hidden state
  // per message ([Pipeline x Tensor Parallel]).
  int64_t p2p_bytes_sent() const { return p2p_bytes_; }
  // zb-h1 ([Deferred Weight Gradients] in models/deferred_grad.h), counted since construction:
  // weight passes (W) run from the closures collected in B, W passes that fell back to an
  // autograd pass through the stage (some parameter got no closure), and the closures run.
  // The first virtual stage's W, a whole backward (token ids have no gradient), is neither.
  int64_t deferred_weight_passes() const { return deferred_weight_passes_; }
  int64_t fallback_weight_passes() const { return fallback_weight_passes_; }
  int64_t deferred_closures_run() const { return deferred_closures_run_; }
  // [Input Backward Peak] The largest CUDA allocator peak (bytes) of zb-h1's input-gradient
  // passes (B) in the last batch; 0 on CPU and for schedules without B. B runs outside the
  // stage engine's phases (forward, backward, step), whose peaks engine().last_report()
  // holds, so a stage's batch peak is the largest of those and this.
  int64_t input_backward_mem_peak() const { return input_backward_peak_; }
  // [B Graph Release] in pipe_engine.cpp: whether B now runs without retaining the graph (a
  // B's closures covered every parameter of the stage; ZT_PIPE_ZB_RELEASE_GRAPH=0: never).
  bool releases_input_backward_graph() const { return release_b_graph_ && closures_cover_stage_; }

 private:
  PipeEngine(const std::vector<LayerInfo>& layers, int model_tp,
             const std::function<PipeStagePtr(std::vector<std::pair<int, int>>, int64_t)>& make_stage,
             const PipeConfig& cfg, parallel::Topology& topo, PipeOptions opts);
  struct Slot;  // one (micro-batch, chunk)'s tensors
  class SendProgress;  // see [Pipeline Execution]: completes CPU sends while the stage computes
  class EventTimer;    // see [Pipeline Execution]: the CUDA-event timing of a batch
  void run(const Instr& in, size_t at, std::vector<MicroBatch>& mbs, std::vector<Slot>& slots, StageTiming& t);
  void finish_sends();
  bool weight_pass_covered(const models::WeightGradCollector& c);
  std::string param_name(const torch::Tensor& p) const;

  PipeConfig cfg_;
  PipeOptions opts_;
  int stage_ = 0;
  Schedule schedule_;
  std::vector<int> bounds_;
  PipeStagePtr module_;
  std::unique_ptr<Engine> engine_;
  std::vector<torch::Tensor> params_;
  comm::GroupPtr pp_, act_, grad_, world_;
  std::vector<comm::WorkPtr> pending_;
  std::unique_ptr<SendProgress> progress_;  // CPU ranks with MPI_THREAD_MULTIPLE only
  std::unique_ptr<EventTimer> events_;      // CUDA stages only
  void post_send(const comm::GroupPtr& g, const torch::Tensor& t, int peer);
  // [Pipeline x Tensor Parallel] DeepSpeed's pipe_partitioned / grad_partitioned (true, the
  // only value the config takes): under tp without sequence parallelism the activation and
  // its gradient are the same on every tp rank, so each sends its 1/tp part of the
  // flattened tensor and the receiver all-gathers the parts over tp (1/tp of the p2p bytes).
  bool partitioned_p2p() const;
  void send_p2p(const comm::GroupPtr& g, const torch::Tensor& t, int peer);
  torch::Tensor recv_p2p(const comm::GroupPtr& g, std::vector<int64_t> shape, int peer);
  torch::Tensor recv_buffer(const std::vector<int64_t>& shape) const;  // the message: whole, or 1/tp part
  torch::Tensor assemble_p2p(const torch::Tensor& raw, const std::vector<int64_t>& shape);  // all-gathers a part
  // [Pipeline Receive Prefetch] (CPU ranks with the helper thread): per channel (0
  // activations, 1 gradients) the next receive of this batch's list, posted early.
  struct Prefetched {
    comm::WorkPtr work;
    torch::Tensor buf;
    std::vector<int64_t> shape;
    size_t instr = 0;  // its index in this stage's instruction list
  };
  Prefetched prefetch_[2];
  void prefetch_from(int channel, size_t from, const std::vector<MicroBatch>& mbs);
  torch::Tensor take_prefetched(int channel, size_t at, const std::vector<MicroBatch>& mbs);
  void abandon_prefetched();
  int64_t p2p_bytes_ = 0;
  int64_t deferred_weight_passes_ = 0, fallback_weight_passes_ = 0, deferred_closures_run_ = 0;
  int64_t input_backward_peak_ = 0;  // [Input Backward Peak], this batch's
  bool fallback_logged_ = false;
  bool defer_weight_pass_ = true;  // ZT_PIPE_ZB_DEFERRED_W (default on)
  bool release_b_graph_ = true;    // ZT_PIPE_ZB_RELEASE_GRAPH (default on), [B Graph Release]
  bool closures_cover_stage_ = false;  // a B's closures covered every parameter of the stage
  torch::Tensor tied_grad_;      // last stage: accumulated tied-copy gradient (zb-h1); first: received
  bool tied_grad_ready_ = false;  // first stage: received, not yet added
  torch::Tensor loss_sum_;  // the head's losses of this batch, summed on the device (double)
  PipeReport report_;
  int64_t steps_ = 0;
  std::exception_ptr step_error_;  // an asynchronous save's failure, rethrown by train_batch
};

}  // namespace zt::pipe

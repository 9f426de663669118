// Deferred weight gradients: zb-h1's weight pass (W) without a second trip through autograd.
//
// [Deferred Weight Gradients]
// The zb-h1 schedule (pipe/schedule.h) splits a stage's backward into B, the input gradient
// (torch::autograd::grad(outputs, {input}, ..., retain_graph)), and W, the weight gradient.
// During B autograd asks no parametered node for its weights' gradients
// (ctx->needs_input_grad(weight) is false), so each such node drops them. While a
// WeightGradCollector is active (CollectWeightGrads, set by PipeEngine around its B pass),
// the custom Functions that own weights -- GPT-2's LinearFn and LayerNormFn
// (models/gpt2.cpp), SharedInputLinearFn (models/shared_linear.cpp), RmsNormFn
// (models/llama_fused.cpp, CUDA) and the LM-head loss (models/lm_head_loss.cpp) -- push a
// closure instead that computes those gradients later from what it captured (the upstream
// gradient g, the saved input, the parameter). W then runs the closures only: the weight
// GEMMs and reductions, no activation gradient again.
//
// W is still ONE engine micro-step (Engine::backward over roots()): one DeferredGradFn node
// per parameter whose backward runs that parameter's closures, then the parameter's
// AccumulateGrad with its post hooks, so ZeRO's gradient-ready hooks, buckets and
// begin/end of the micro-step (zero/grad_reducer.cpp) see what a plain backward gives them.
// A closure may add its gradient into p.grad in place (LinearFn's addmm into an existing
// W.grad) and return an undefined tensor; AccumulateGrad then gets nothing and its hooks
// still fire. The nodes are created in parameter order, so autograd runs them (and the
// hooks) from the last parameter to the first, one parameter's gradient alive at a time.
//
// The active collector is process-wide, not thread-local: on CUDA autograd runs backward on
// its device thread, not on the thread that called torch::autograd::grad. One B pass at a
// time per process (one PipeEngine per rank); pushes are serialised by a mutex.
//
// Coverage: a parameter reached by B through plain ATen ops (the CPU RMSNorm reference, an
// adapter) gets no closure; covers() tells the caller, which then runs W as an autograd
// pass instead and discards the closures (PipeEngine logs the parameter once).
#pragma once
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace zt::models {

class WeightGradCollector {
 public:
  // Computes the gradients of the parameters it was added with, one per parameter, in that
  // order; an undefined entry means "already added into p.grad in place" (or zero).
  using Fn = std::function<std::vector<torch::Tensor>()>;

  // Thread-safe. `params` are the parameters themselves (leaves; matched by identity).
  void add(const std::vector<torch::Tensor>& params, Fn fn);
  // Whether some closure computes p's gradient.
  bool covers(const torch::Tensor& p) const;
  // How many parameters have closures, for the caller's coverage check.
  size_t num_covered() const;
  bool empty() const;
  // One 0-dim root per parameter of `params` (in order) that requires grad: backward of
  // roots()[i] with gradient 1 runs params[i]'s closures and hands AccumulateGrad the sum
  // of their results. Engine::backward(roots, ones) is then the weight pass.
  std::vector<torch::Tensor> roots(const std::vector<torch::Tensor>& params);
  // Runs (or takes the stored result of) p's closures: the sum of what they returned for p,
  // undefined when all of them accumulated in place. Called by DeferredGradFn's backward.
  torch::Tensor run_for(const torch::Tensor& p);
  // Closures run so far (each counted once, however many parameters it serves).
  int64_t closures_run() const { return runs_; }
  // Drops every closure and what it captured (after W, or when W falls back to autograd).
  void clear();

 private:
  struct Record {
    std::vector<torch::Tensor> params;
    Fn fn;
    std::vector<torch::Tensor> results;  // filled by the first run_for of any of its params
    bool done = false;
  };
  struct Entry {
    std::shared_ptr<Record> rec;
    size_t index = 0;  // p's position in rec->params
  };
  mutable std::mutex mu_;
  std::unordered_map<const c10::TensorImpl*, std::vector<Entry>> by_param_;
  int64_t runs_ = 0;
};

// The active collector (nullptr: none). See [Deferred Weight Gradients].
WeightGradCollector* active_weight_grad_collector();

// RAII: makes `c` the active collector for its lifetime (the previous one after).
class CollectWeightGrads {
 public:
  explicit CollectWeightGrads(WeightGradCollector* c);
  ~CollectWeightGrads();
  CollectWeightGrads(const CollectWeightGrads&) = delete;
  CollectWeightGrads& operator=(const CollectWeightGrads&) = delete;

 private:
  WeightGradCollector* prev_;
};

// For a custom Function's backward: when a collector is active, adds `fn` for those of
// `params` that are defined and require grad and returns true; else false (the caller
// drops the gradients as before). Call it only for gradients autograd did not ask for
// (!ctx->needs_input_grad(i)); `fn` must compute them without touching the graph.
bool defer_weight_grads(const std::vector<torch::Tensor>& params, WeightGradCollector::Fn fn);

}  // namespace zt::models

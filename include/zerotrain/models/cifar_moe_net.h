// The MoE variant of DeepSpeed's CIFAR-10 tutorial net (DeepSpeedExamples
// training/cifar/cifar10_deepspeed.py with --moe): CifarNet's conv1 .. fc2 (ReLU after fc2),
// then one MoE layer of Linear(84, 84) experts per entry of num_experts (the tutorial's
// --num-experts list: {2, 4} is the PR-MoE pyramid, two MoE layers of 2 and 4 experts), then
// fc4 84 -> 10. The MoE layers are DeepSpeed-MoE's (src/models/moe.h, docs/moe.md): top-k,
// capacity factor, min capacity, noisy gate policy, and with use_residual PR-MoE (each layer
// also runs a dense Linear(84, 84) `mlp` mixed in by a learned 2-way `coefficient`).
//
// [CIFAR MoE] Choices against the tutorial:
// - loss() adds aux_loss_coef x the sum of the layers' load-balancing losses to the cross
//   entropy (the tutorial discards them: `x, _, _ = layer(x)`; aux_loss_coef 0 is that).
// - Each expert is initialised on its own (the tutorial's experts are deep copies of one
//   fc3, all equal at the start, as DeepSpeed's Experts copies its module).
// - Expert parallelism: with an ep group of P ranks each rank holds num_experts[l] / P experts
//   of every layer (each entry must divide by P: ConfigError naming --num-experts and --ep).
//   Every rank first builds the ep-1 net from the current torch seed and keeps the dense part
//   and its own experts by global index, so ep P starts from ep 1's weights.
//   Parameter names: moe_layer_list.<l>.gate.weight, moe_layer_list.<l>.experts.<i>.{weight,
//   bias} (i local; global_param_name() gives the ep-1 name), with use_residual
//   moe_layer_list.<l>.mlp.* and moe_layer_list.<l>.coefficient.*.
// - Routing noise (RSample, Jitter) and random token selection draw from set_generator()'s
//   generator (the device's default one when unset); give each rank the same seed at every
//   ep and the routing is ep 1's.
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "zerotrain/comm.h"
#include "zerotrain/model.h"

namespace zt::models {

struct CifarMoEOptions {
  // One MoE layer per entry (--num-experts); each >= 1 and, at ep P, divisible by P.
  std::vector<int64_t> num_experts{1};
  int64_t top_k = 1;                        // --top-k: 1 or 2
  double capacity_factor = 1.0;             // training capacity factor (DeepSpeed MoE default)
  double eval_capacity_factor = 1.0;        // in eval()
  int64_t min_capacity = 0;                 // --min-capacity (the tutorial's default 0)
  std::string noisy_gate_policy = "None";   // --noisy-gate-policy: None, RSample (top-1), Jitter
  bool use_residual = false;                // --mlp-type residual (PR-MoE)
  bool drop_tokens = true;                  // DeepSpeed's default: tokens beyond capacity drop
  double aux_loss_coef = 0.01;              // loss = CE + coef x sum of the layers' aux losses
  comm::GroupPtr ep_group;                  // experts split over it; null or size 1 = ep 1
};

// ConfigError naming the flag and the fix for what the net cannot take at expert-parallel
// size `ep` (an empty num_experts list, an entry < 1 or not divisible by ep, top-k not 1/2,
// top-2 over 1 expert, RSample with top-2, an unknown policy, factors <= 0, negative
// min capacity or coefficient). The constructor calls it with the ep group's size.
void check_cifar_moe_options(const CifarMoEOptions& o, int ep);

// The expert-parallel groups of `ep` over `world` (dp = world): ep groups of ep consecutive
// ranks, expert-dp groups of the ranks holding the same experts (parallel::Topology's
// layout, DeepSpeed's "E + D"). ConfigError naming --ep when ep does not divide the world.
// Collective over `world`.
struct CifarMoEGroups {
  comm::GroupPtr ep, expert_dp;
};
CifarMoEGroups cifar_moe_groups(const comm::GroupPtr& world, int ep);

struct CifarMoENetImpl : torch::nn::Module, zt::ZeroModel {
  explicit CifarMoENetImpl(CifarMoEOptions o);
  // Training FLOPs per image (3 x 2 x multiply-adds, as kCifarNetFlopsPerSample): the gate
  // and the top-k experts a token uses per layer, plus mlp and coefficient with use_residual.
  double flops_per_token(int64_t /*seq*/) const override;
  // x (B, 3, 32, 32) -> logits (B, 10); keeps this call's aux losses (last_aux_loss()).
  torch::Tensor forward(const torch::Tensor& x);
  // Cross entropy (fp32) + aux_loss_coef x last_aux_loss().
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& labels);
  // The sum over the MoE layers of the last forward's aux losses (fp32 scalar, with graph),
  // and the mean of their dropped fractions.
  torch::Tensor last_aux_loss() const { return last_aux_; }
  double last_dropped_fraction() const { return last_dropped_; }
  // Seeds the routing noise / random token selection of every MoE layer.
  void set_generator(std::optional<torch::Generator> gen);

  // EngineOptions::is_expert: "moe_layer_list.<l>.experts.*" (PR-MoE's mlp is dense).
  static bool is_expert(const std::string& name);
  // EngineOptions::expert_global_name: local expert i of layer l -> its ep-1 name.
  std::string global_param_name(const std::string& name) const;
  // Experts of MoE layer l on this rank, and the global index of the first.
  int64_t local_experts(size_t layer) const;
  int64_t first_expert(size_t layer) const;
  size_t moe_layers() const { return moe_layer_list->size(); }
  const CifarMoEOptions& options() const { return opt_; }

  torch::nn::Conv2d conv1{nullptr};   // weight (6, 3, 5, 5)
  torch::nn::Conv2d conv2{nullptr};   // weight (16, 6, 5, 5)
  torch::nn::Linear fc1{nullptr};     // weight (120, 400)
  torch::nn::Linear fc2{nullptr};     // weight (84, 120)
  torch::nn::ModuleList moe_layer_list{nullptr};  // models::MoE (src/models/moe.h), hidden 84
  torch::nn::Linear fc4{nullptr};     // weight (10, 84)

 private:
  CifarMoEOptions opt_;
  torch::Tensor last_aux_;
  double last_dropped_ = 0.0;
};
TORCH_MODULE(CifarMoENet);

}  // namespace zt::models

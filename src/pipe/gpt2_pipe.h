// GPT-2 as a sequence of pipeline layers (DeepSpeed's PipelineModule with LayerSpecs and
// a TiedLayerSpec for the embedding): layer 0 is the embedding (wte, wpe), layers
// 1..n_layer the transformer blocks, layer n_layer + 1 the head (ln_f, the LM head tied to
// wte, and the loss). A stage holds the layers of its model chunks under the whole
// model's parameter names ("wte.weight", "h.3.attn.c_attn.weight", "ln_f.bias"), taken
// from one GPT2 built from one seed, so its parameters and its math are the
// non-pipelined model's.
//
// [Pipeline Tied Weights]
//  The embedding's wte is a parameter of the stage holding layer 0. The stage holding the
//  head without layer 0 keeps a copy of it that is NOT a parameter (the ZeRO engine never
//  sees it): its gradient accumulates over the micro-batches, goes to the first stage
//  (SendTiedGrad), which adds it in its last backward, so the first stage's engine reduces,
//  clips and steps the whole tied gradient once; after the step the first stage sends the
//  updated weight back (SendTiedWeight) and the copy takes it. Both stages therefore hold
//  identical values after every step, the global gradient norm counts the tied weight
//  once (no 1/2 norm weight needed), and it composes with ZeRO stages 0-2, whose
//  reduction of the first stage's wte is the one of any parameter. DeepSpeed instead
//  all-reduces the tied gradients of both ends (ReduceTiedGrads) and steps both copies;
//  that all-reduce would have to happen inside ZeRO-2's backward, which is why DeepSpeed
//  refuses pipeline + ZeRO-2.
//
// [Pipeline x Tensor Parallel]
//  A stage cut from a GPT2TP (models/gpt2_tp.h) holds the same layers as tensor-parallel
//  modules over the model's tp group: the vocab-parallel wte, TPBlocks, and a head that
//  runs the tied weight's slice as a column-parallel LM head into the vocab-parallel cross
//  entropy (GPT2TP::loss's math). Every tp rank of a stage holds the same layers and runs
//  the same schedule, so the collectives inside a layer (and its backward) meet in the
//  same order on every tp rank. Between stages each tp rank talks to the same tp rank of
//  the next stage (the pp group holds one tp coordinate): the hidden state is the whole
//  (B, T, C), replicated over tp, or under sequence parallelism this rank's (B, T/tp, C)
//  slice; without sequence parallelism each tp rank sends only its 1/tp part and the
//  receiver all-gathers (DeepSpeed's pipe_partitioned / grad_partitioned, see
//  PipeEngine::send_p2p). The tied copy on the last stage is this tp rank's (Vp/tp, C)
//  slice of wte and travels to and from the same tp rank of the first stage. In the model-parallel norm a
//  replicated parameter (wpe, LayerNorms, row-parallel biases) weighs 1/tp (norm_weight).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "models/gpt2_tp.h"
#include "pipe/partition.h"
#include "pipe/stage.h"

namespace zt::pipe {

// The pipeline layers of GPT-2 with their types ("GPT2Embedding", "GPT2Block", "GPT2Head")
// and trainable parameter counts (the head counts its tied wte, as DeepSpeed counts a
// TiedLayerSpec): the input of partition_layers.
std::vector<LayerInfo> gpt2_layers(const models::GPT2Config& cfg);

class GPT2StageImpl : public PipeStageImpl {
 public:
  // `chunks[c]` = [begin, end) pipeline layers of local chunk c (ascending, disjoint).
  // Takes (shares) those layers' modules from `full`. `checkpoint_interval` > 0 checkpoints
  // the blocks of each range of that many layers (DeepSpeed's activation_checkpoint_interval).
  GPT2StageImpl(const models::GPT2& full, std::vector<std::pair<int, int>> chunks, int64_t checkpoint_interval);
  // The same from a tensor-parallel GPT-2: the layers of this rank's tp slice, see
  // [Pipeline x Tensor Parallel].
  GPT2StageImpl(const models::GPT2TP& full, std::vector<std::pair<int, int>> chunks, int64_t checkpoint_interval);

  // The tensor-parallel size of the layers (1 for a stage cut from GPT2).
  int tp_size() const override { return tp_ ? tp_->size() : 1; }
  bool sequence_parallel() const override { return sp_; }
  const comm::GroupPtr& tp_group() const override { return tp_; }  // null for a stage cut from GPT2
  int tp_rank() const override { return tp_ ? tp_->rank() : 0; }
  // The weight of a parameter's gradient in the model-parallel norm: 1/tp for a parameter
  // replicated over tp, else 1 (models::GPT2TPImpl::norm_weight).
  double norm_weight(const std::string& name) const override;
  int64_t hidden_size() const override { return cfg_.n_embd; }

  // Chunk `chunk` on `x`: token ids (B, T) int64 when it has the embedding, else the
  // hidden state (B, T, C). Returns the hidden state, or the scalar fp32 mean loss against
  // `targets` (B, T) when it has the head (GPT2::loss's math).
  torch::Tensor forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets) override;

  // The embedding's weight (on the stage holding layer 0).
  torch::Tensor embedding_weight() const override {
    return tp_model_ ? (tp_wte_ ? tp_wte_->weight : torch::Tensor()) : (wte_ ? wte_->weight : torch::Tensor());
  }

  const models::GPT2Config& config() const { return cfg_; }

 private:
  torch::Tensor run_blocks(int first, int last, const torch::Tensor& x);  // blocks [first, last) of h
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets);
  torch::Tensor embed(const torch::Tensor& idx);
  torch::Tensor final_norm(const torch::Tensor& x);

  models::GPT2Config cfg_;
  int64_t ckpt_interval_ = 0;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleDict h_{nullptr};
  std::vector<models::Block> blocks_;  // index = block number; null where not held
  torch::nn::LayerNorm ln_f_{nullptr};
  // Tensor-parallel stages only ([Pipeline x Tensor Parallel]).
  bool tp_model_ = false;  // cut from a GPT2TP
  comm::GroupPtr tp_;
  bool sp_ = false;
  tp::VocabParallelEmbedding tp_wte_{nullptr};
  std::vector<models::TPBlock> tp_blocks_;  // index = block number; null where not held
};
TORCH_MODULE(GPT2Stage);

}  // namespace zt::pipe

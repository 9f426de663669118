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
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/gpt2.h"
#include "pipe/partition.h"

namespace zt::pipe {

// The pipeline layers of GPT-2 with their types ("GPT2Embedding", "GPT2Block", "GPT2Head")
// and trainable parameter counts (the head counts its tied wte, as DeepSpeed counts a
// TiedLayerSpec): the input of partition_layers.
std::vector<LayerInfo> gpt2_layers(const models::GPT2Config& cfg);

class GPT2StageImpl : public torch::nn::Module {
 public:
  // `chunks[c]` = [begin, end) pipeline layers of local chunk c (ascending, disjoint).
  // Takes (shares) those layers' modules from `full`. `checkpoint_interval` > 0 checkpoints
  // the blocks of each range of that many layers (DeepSpeed's activation_checkpoint_interval).
  GPT2StageImpl(const models::GPT2& full, std::vector<std::pair<int, int>> chunks, int64_t checkpoint_interval);

  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const std::pair<int, int>& chunk_layers(int chunk) const { return chunks_.at(static_cast<size_t>(chunk)); }
  bool has_embedding(int chunk) const { return chunk_layers(chunk).first == 0; }
  bool has_head(int chunk) const { return chunk_layers(chunk).second == num_layers_; }
  // Holds the head but not the embedding: keeps the tied copy (see [Pipeline Tied Weights]).
  bool holds_tied_copy() const { return tied_copy_.defined(); }
  bool holds_embedding() const { return !wte_.is_empty(); }

  // Chunk `chunk` on `x`: token ids (B, T) int64 when it has the embedding, else the
  // hidden state (B, T, C). Returns the hidden state, or the scalar fp32 mean loss against
  // `targets` (B, T) when it has the head (GPT2::loss's math).
  torch::Tensor forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets);

  // The embedding's weight (on the stage holding layer 0) or the tied copy.
  torch::Tensor& tied_copy() { return tied_copy_; }
  torch::Tensor embedding_weight() const { return wte_->weight; }
  // Moves the tied copy to `device` / `dtype` (the engine moves only parameters).
  void place_tied_copy(torch::Device device, at::ScalarType dtype);

  const models::GPT2Config& config() const { return cfg_; }

 private:
  torch::Tensor run_blocks(int first, int last, const torch::Tensor& x);  // blocks [first, last) of h
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets);

  models::GPT2Config cfg_;
  int num_layers_ = 0;  // pipeline layers: n_layer + 2
  std::vector<std::pair<int, int>> chunks_;
  int64_t ckpt_interval_ = 0;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleDict h_{nullptr};
  std::vector<models::Block> blocks_;  // index = block number; null where not held
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::Tensor tied_copy_;
};
TORCH_MODULE(GPT2Stage);

}  // namespace zt::pipe

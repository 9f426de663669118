// zt::pipe::PipeStageImpl: what the pipeline executor (pipe/pipe_engine.h) asks of one
// stage of a model cut into pipeline layers, whatever the family: the chunks of layers it
// holds, the forward of a chunk, the hidden state's shape between stages, and the two ends
// of a tied embedding ([Pipeline Tied Weights] in pipe/gpt2_pipe.h). GPT2Stage
// (pipe/gpt2_pipe.h) and LlamaStage (pipe/llama_pipe.h) implement it.
//
// Contract of a stage built from the whole model of one seed:
//  * pipeline layer 0 is the embedding, layers 1..L the decoder blocks, layer L + 1 the head
//    (final norm, LM head and the loss); the stage holds the layers of its chunks under the
//    whole model's parameter names, registered in the whole model's order, so a stage's
//    engine flattens, reduces and checkpoints them as the non-pipelined engine does.
//  * forward(chunk, x, targets): x is token ids (B, T) int64 on the chunk holding layer 0,
//    else the hidden state (B, hidden_len(T), hidden_size()); returns the hidden state of
//    that shape, or the scalar fp32 mean loss on the chunk holding the head.
//  * A model whose head is tied to its embedding: the stage holding the head without
//    layer 0 keeps the tied copy (holds_tied_copy), the stage holding layer 0 is the other
//    end (holds_embedding); an untied model has neither, and the executor's tied-weight
//    messages are skipped on both ends.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zerotrain/comm.h"

namespace zt::pipe {

class PipeStageImpl : public torch::nn::Module {
 public:
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  // [begin, end) pipeline layers of local chunk `chunk`.
  const std::pair<int, int>& chunk_layers(int chunk) const { return chunks_.at(static_cast<size_t>(chunk)); }
  bool has_embedding(int chunk) const { return chunk_layers(chunk).first == 0; }
  bool has_head(int chunk) const { return chunk_layers(chunk).second == num_layers_; }
  // Holds the head but not the embedding of a tied model: keeps the tied copy.
  bool holds_tied_copy() const { return tied_copy_.defined(); }
  // Holds layer 0 of a model whose head is tied to it: the first end of the tied-weight
  // exchange (false on every stage of an untied model).
  bool holds_embedding() const { return has_embedding_ && tied_; }

  // Tensor parallelism inside the stage (a GPT2Stage cut from a GPT2TP); 1 / none otherwise.
  virtual int tp_size() const { return 1; }
  virtual bool sequence_parallel() const { return false; }
  virtual const comm::GroupPtr& tp_group() const { return no_group_; }
  virtual int tp_rank() const { return 0; }
  // The weight of a parameter's gradient in the model-parallel norm (1/tp if replicated).
  virtual double norm_weight(const std::string& /*name*/) const { return 1.0; }
  // The sequence length of the hidden state between stages for a (B, T) micro-batch.
  int64_t hidden_len(int64_t T) const { return sequence_parallel() ? T / tp_size() : T; }
  // The width of the hidden state between stages (GPT-2's n_embd, Llama's hidden_size).
  virtual int64_t hidden_size() const = 0;

  virtual torch::Tensor forward(int chunk, const torch::Tensor& x, const torch::Tensor& targets) = 0;

  // The tied copy (last stage of a tied model), see holds_tied_copy.
  torch::Tensor& tied_copy() { return tied_copy_; }
  // The embedding's weight on the stage holding layer 0 (undefined elsewhere).
  virtual torch::Tensor embedding_weight() const = 0;
  // Moves the tied copy to `device` / `dtype` (the engine moves only parameters).
  void place_tied_copy(torch::Device device, at::ScalarType dtype) {
    if (!tied_copy_.defined()) return;
    tied_copy_ = tied_copy_.detach().to(device, dtype).clone().set_requires_grad(true);
  }

 protected:
  // `num_layers`: the model's pipeline layers; `chunks` ascending, disjoint ranges of them;
  // `tied`: the model ties its LM head to the embedding.
  PipeStageImpl(int num_layers, std::vector<std::pair<int, int>> chunks, bool tied)
      : num_layers_(num_layers), chunks_(std::move(chunks)), tied_(tied) {}

  int num_layers_ = 0;
  std::vector<std::pair<int, int>> chunks_;
  bool tied_ = true;
  bool has_embedding_ = false;  // holds layer 0
  torch::Tensor tied_copy_;

 private:
  inline static const comm::GroupPtr no_group_{};
};

using PipeStagePtr = std::shared_ptr<PipeStageImpl>;

// The layers a stage's chunks hold: the embedding (layer 0), the head (the last of
// `num_layers`) and the block numbers in between (layer - 1), ascending. ConfigError for
// chunks out of order or range.
struct StageLayers {
  bool embedding = false, head = false;
  std::vector<int> blocks;
};
StageLayers stage_layers(const std::vector<std::pair<int, int>>& chunks, int num_layers);

}  // namespace zt::pipe

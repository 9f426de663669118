// Megatron-style tensor-parallel layers (Shoeybi et al. 2019; sequence parallelism:
// Korthikanti et al. 2022) on torch::nn, over the tp group of parallel/topology.h.
// The communication is tp/mappings.h's; see [TP Regions] there.
//
//   ColumnParallelLinear   y = x A^T + b with A (out, in) cut along out: rank r holds rows
//                          [r*out/tp, (r+1)*out/tp) of A and b. Input: the full x
//                          (copy_to_region), or with sequence parallelism x's slice of
//                          the sequence (all-gathered). Output: this rank's columns of y,
//                          or all of them (gather_output).
//   RowParallelLinear      y = x A^T + b with A (out, in) cut along in: rank r holds
//                          columns [r*in/tp, (r+1)*in/tp). Input: this rank's slice of x's
//                          last dim (input_is_parallel, what a column layer produced), else
//                          the full x, cut here. The partial products are summed
//                          (all-reduce), or with sequence parallelism reduce-scattered
//                          along the sequence; b (replicated) is added after the sum.
//   VocabParallelEmbedding a (V, C) table padded with zero rows to Vp (a multiple of
//                          tp * pad_multiple) and cut along V: rank r holds rows
//                          [r*Vp/tp, (r+1)*Vp/tp). A token id outside this rank's rows
//                          looks up zeros; the partial lookups are summed (or
//                          reduce-scattered along the sequence). Padding rows are never
//                          selected by an id < V.
//
// Parameters are named "weight" and "bias" like torch::nn::Linear / Embedding, so a model
// built from them keeps the names of its unsplit twin; each holds only this rank's slice.
// Initialisation: torch::nn's (uniform +-1/sqrt(fan_in of the FULL layer), N(0,1) for the
// embedding), drawn on this rank's slice; load the full weights with tp/shard.h to match
// an unsplit layer.
#pragma once
#include <torch/torch.h>

#include <cstdint>

#include "zerotrain/comm.h"

namespace zt::tp {

// The column-parallel product on its own: x (..., in) full, or with sequence_parallel this
// rank's slice of dim seq_dim (all-gathered here; only the slice is kept for backward, see
// [Sequence-Parallel Linear] in layers.cpp); w (out/tp, in); b (out/tp) or undefined.
// Returns (..., out/tp) over the full sequence.
torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                     const comm::GroupPtr& group, bool sequence_parallel = false, int64_t seq_dim = 1);

struct ColumnParallelOptions {
  bool bias = true;
  bool gather_output = false;      // all-gather y's last dim (the full output on every rank)
  bool sequence_parallel = false;  // x holds this rank's slice of dim seq_dim
  int64_t seq_dim = 1;             // (B, T, C): the sequence is dim 1
  // The output dimension is `blocks` equal blocks (q, k, v stacked: 3), each cut into tp
  // slices; rank r holds slice r of every block, concatenated. 1 = one block.
  int64_t blocks = 1;
};

struct ColumnParallelLinearImpl : torch::nn::Module {
  // ConfigError when out (or out / blocks) does not divide by the group size.
  ColumnParallelLinearImpl(int64_t in, int64_t out, comm::GroupPtr group, ColumnParallelOptions o = {});
  torch::Tensor forward(const torch::Tensor& x);  // (..., in) -> (..., out/tp) or (..., out)

  int64_t in_features, out_features;  // full sizes
  ColumnParallelOptions options;
  comm::GroupPtr group;
  torch::Tensor weight;  // (out/tp, in)
  torch::Tensor bias;    // (out/tp) or undefined
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelOptions {
  bool bias = true;
  bool input_is_parallel = true;   // x is already this rank's slice of the last dim
  bool sequence_parallel = false;  // output: this rank's slice of dim seq_dim
  int64_t seq_dim = 1;
};

struct RowParallelLinearImpl : torch::nn::Module {
  // ConfigError when in does not divide by the group size.
  RowParallelLinearImpl(int64_t in, int64_t out, comm::GroupPtr group, RowParallelOptions o = {});
  torch::Tensor forward(const torch::Tensor& x);  // (..., in/tp) or (..., in) -> (..., out)

  int64_t in_features, out_features;
  RowParallelOptions options;
  comm::GroupPtr group;
  torch::Tensor weight;  // (out, in/tp)
  torch::Tensor bias;    // (out), replicated, or undefined
};
TORCH_MODULE(RowParallelLinear);

// Vp: `vocab` rounded up to a multiple of size * pad_multiple (Megatron's
// make_vocab_size_divisible_by * tp).
int64_t padded_vocab(int64_t vocab, int size, int64_t pad_multiple = 1);

struct VocabParallelEmbeddingImpl : torch::nn::Module {
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, comm::GroupPtr group, int64_t pad_multiple = 1,
                             bool sequence_parallel = false, int64_t seq_dim = 1);
  // idx int64 (any shape) with ids in [0, vocab) -> (*idx.shape, dim); with sequence
  // parallelism this rank's slice of dim seq_dim of that.
  torch::Tensor forward(const torch::Tensor& idx);

  int64_t vocab_size, padded_size, embedding_dim;
  int64_t vocab_start, vocab_end;  // this rank's rows [vocab_start, vocab_end) of the padded table
  bool sequence_parallel;
  int64_t seq_dim;
  comm::GroupPtr group;
  torch::Tensor weight;  // (Vp/tp, dim)
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace zt::tp

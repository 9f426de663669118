// The LM head and the cross-entropy loss as one autograd function, computed in row chunks.
//
// Unfused, the loss of a (N, C) hidden state against a (V, C) tied embedding keeps the
// (N, V) logits three times at the end of forward (compute dtype, their fp32 copy, the
// fp32 log-softmax saved for backward): 4.1 GB for GPT-2 Large at 8 x 1024 tokens. Here
// forward walks `chunk_rows` rows at a time: logits of the chunk in fp32, the loss terms,
// and right away the chunk's gradient (softmax - one-hot) pushed through both matmuls. What
// stays for backward is dx (N, C) and dw (V, C); backward only scales them by the incoming
// gradient / the number of counted targets. The matmuls are the same three as unfused.
// Only the gradients backward will ask for are made: with a frozen w (LoRA, QLoRA) there is
// no dw and no third matmul, so the loss keeps dx alone, N x C in x's dtype (the head of
// Llama-3-8B otherwise held V x C x 4 = 2.1 GB from forward to the end of backward). Same
// for x when it needs no gradient, and for both under NoGradGuard (evaluation).
//
// The vocabulary is padded with zero rows of w to a multiple of `pad_multiple` (aligned
// cuBLAS kernels; see GPT2Config::lm_head_pad_multiple) and the padding columns are masked
// with -inf, so they take no probability.
//
// Targets equal to -1 are ignored; the loss is the mean over the others (0 when none).
// Not for fp16: the unscaled gradient (softmax probabilities of ~1/V) would underflow fp16
// before the loss scale could lift it; GPT2 uses the unfused loss for fp16.
#pragma once
#include <torch/torch.h>

namespace zt::models {

// Bytes per logit of a chunk lm_head_cross_entropy computes for x: x's element size on the
// fused CUDA path (the chunk's logits stay in x's dtype and become their gradient in place:
// 2 for bf16/fp16), else 4 (the unfused path's fp32 copy). A caller sizing `chunk_rows` to
// a byte budget divides by this.
int64_t lm_head_logit_bytes(const torch::Tensor& x);

// x (N, C) in the compute dtype, w (V, C) in the same dtype, targets (N) int64.
// Returns the scalar fp32 mean loss; differentiable in x and w (in those that require grad).
torch::Tensor lm_head_cross_entropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                                    int64_t pad_multiple, int64_t chunk_rows);

}  // namespace zt::models

// [Stale Gradients] Skipping the gradient buffer's fill between steps.
//
// ZeRO stages 0-1 keep every .grad as a view of one flat buffer that the step used to zero
// (on Llama-3.2-1B: a 2.5 GB fill per step, and every weight GEMM of the next backward then
// read its C matrix back only to add zeros). Instead, zero_grad() marks each view stale: its
// contents are last step's and count as zero. The first writer of a stale gradient
// overwrites it (a beta-0 GEMM, a plain store) and clears the mark; later writers (the next
// micro-steps of an accumulation window, a tied weight's second use) add as before. A stale
// gradient that no writer took is zeroed before anything reads it: by the reducer's hook
// before autograd's AccumulateGrad adds into it, when its ready hook fires, and at the end
// of backward (the reducer, src/zero/grad_reducer.cpp).
//
// The marks live here, keyed by the gradient's first element's address, so that a model's
// backward (src/models) can ask about a parameter's .grad without knowing the optimizer.
// A mark is only ever set on memory its owner keeps alive (the flat buffer) and is dropped
// by the owner before that memory is freed (GradReducer's destructor).
// `ZT_STALE_GRADS=0` turns the scheme off (zero_grad fills again): for A/B measurements.
#pragma once
#include <torch/types.h>

namespace zt {

// Whether zero_grad() may mark instead of fill (ZT_STALE_GRADS unset or not "0", read once,
// unless set_stale_grads_enabled overrode it).
bool stale_grads_enabled();
// Overrides ZT_STALE_GRADS for this process (tests compare both ways in one process).
void set_stale_grads_enabled(bool on);
// Marks g's contents as stale (numel 0: nothing to mark).
void mark_grad_stale(const torch::Tensor& g);
// True if g was marked stale: the caller must overwrite g (not add into it). Clears the mark.
bool take_grad_stale(const torch::Tensor& g);
// Whether g is marked, without clearing.
bool grad_is_stale(const torch::Tensor& g);
// If g is marked: zero it and clear the mark. Returns whether it did.
bool settle_grad(torch::Tensor g);
// Drops g's mark, if any, without touching g (its owner frees it or fills it itself).
void forget_grad(const torch::Tensor& g);
// How many gradients are marked (process-wide; tests).
size_t stale_grad_count();

}  // namespace zt

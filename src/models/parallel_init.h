// Random initialisation on many threads that draws exactly what the serial one draws.
//
// [Parallel Init]
// The default CPU generator is one MT19937 stream; a model built in order draws each
// tensor's values from it one after another, on one thread (Llama-3-8B: two passes of
// 8e9 draws, the constructors' kaiming_uniform_ and then init_parameter's normal_, about
// 70 s on one core). The values only depend on where in the stream each tensor starts, and
// where the next one starts is cheap to compute: skipping n 32-bit draws is one MT19937
// state update per 624 draws (discard_draws), no tempering, no float conversion, no store.
// So ParallelNormal walks the tensors in order on the calling thread, records a copy of the
// generator at the start of each chunk (a multiple of 16 elements, the block normal_ works
// in), skips the chunk's draws on the default generator, and fills the chunks later on the
// intra-op threads, each with its own copy: the same values as t.normal_() in order, and the
// default generator left where the serial code leaves it. This relies on how many draws
// libtorch's CPU normal_ takes for a contiguous float tensor (normal_draws); ParallelNormal
// checks that once per process against the real op and throws InternalError if it differs.
#pragma once
#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <vector>

namespace zt::models {

// Advances `gen` (a CPU generator) as n calls of its random() would (n 32-bit draws).
void discard_draws(at::Generator& gen, int64_t n);

// 32-bit draws that libtorch's CPU t.normal_() takes for a contiguous float tensor of n >= 16
// elements: n uniforms, and 16 more when n is not a multiple of 16 (the last 16 are redrawn).
int64_t normal_draws(int64_t n);

// 32-bit draws of t.uniform_() on a float CPU tensor of n elements (one each).
inline int64_t uniform_draws(int64_t n) { return n; }

// See [Parallel Init]. add() in the order the serial code would call normal_; run() fills.
class ParallelNormal {
 public:
  ParallelNormal();
  // t: contiguous fp32 on the CPU. Records t's chunks and advances the default CPU generator
  // past them (a tensor of fewer than 16 elements is filled here, serially).
  void add(const torch::Tensor& t, double mean, double std);
  // Fills every added chunk on the intra-op threads; the plan is then empty.
  void run();

 private:
  struct Chunk {
    torch::Tensor view;  // a contiguous 1-D slice of an added tensor
    at::Generator gen;   // the default generator as it stood at the slice's first draw
    double mean = 0, std = 1;
  };
  std::vector<Chunk> chunks_;
};

}  // namespace zt::models

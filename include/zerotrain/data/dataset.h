// The dataset interface the Loader consumes: random access by index, one example at a
// time. Examples of one dataset share shapes and dtypes so the loader can stack them.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace zt::data {

struct Example {
  Example() = default;
  Example(torch::Tensor x_, torch::Tensor y_, torch::Tensor pos_ = {})
      : x(std::move(x_)), y(std::move(y_)), pos(std::move(pos_)) {}
  torch::Tensor x;  // model input, e.g. (T) int64 tokens or (3, 32, 32) float image
  torch::Tensor y;  // target, e.g. (T) int64 next tokens or () int64 label
  // Optional (T) int64 position ids, restarting at 0 where a packed example starts
  // (per-example attention); undefined when the dataset has none.
  torch::Tensor pos;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Must be thread-safe and deterministic: the Loader calls it from its background
  // thread, and exact resume relies on index i always giving the same example.
  virtual Example get(int64_t index) const = 0;
};

}  // namespace zt::data

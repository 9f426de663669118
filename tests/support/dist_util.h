// Helpers shared by the multi-rank tests (tests/dist): the small MLP the engine tests
// train, their deterministic global batches, and scratch directories (per rank, or one
// for the whole group). Header-only; everything is inline in namespace zt::test_support.
#pragma once
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <utility>

#include "ckpt/fs.h"
#include "zerotrain/comm.h"

namespace zt::test_support {

// 8 -> 16 -> 16 -> 4 with tanh: small enough for CPU ranks, with three weight matrices
// and three biases (several buckets at the tests' small bucket sizes).
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t in = 8, int64_t hidden = 16, int64_t out = 4) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

// Data for step s: the global batch (n samples of MLP input and target), identical on
// every rank; each rank trains on its slice.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int64_t n) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(1234 + step);
  auto x = at::randn({n, 8}, g);
  auto y = at::randn({n, 4}, g);
  return {x, y};
}

// A fresh directory under the build tree for this rank alone, removed with its contents.
struct LocalTempDir {
  explicit LocalTempDir(const std::string& prefix) {
    std::string templ = std::string(ZT_BINARY_DIR) + "/" + prefix + "_XXXXXX";
    EXPECT_NE(mkdtemp(templ.data()), nullptr) << templ;
    path = templ;
  }
  ~LocalTempDir() { zt::ckpt::remove_tree(path); }
  LocalTempDir(const LocalTempDir&) = delete;
  LocalTempDir& operator=(const LocalTempDir&) = delete;
  std::string path;
};

// One directory for the whole group: rank 0 creates it and broadcasts its name.
inline std::string shared_dir(const zt::comm::GroupPtr& g, const std::string& prefix) {
  auto buf = torch::zeros({256}, torch::kUInt8);
  if (g->rank() == 0) {
    std::string templ = std::string(ZT_BINARY_DIR) + "/" + prefix + "_XXXXXX";
    char* d = mkdtemp(templ.data());
    EXPECT_NE(d, nullptr) << templ;
    std::memcpy(buf.data_ptr(), templ.data(), templ.size());
  }
  if (g->size() > 1) g->broadcast(buf, 0);
  return std::string(static_cast<const char*>(buf.data_ptr()));
}

// shared_dir for the lifetime of the object; rank 0 removes it after a barrier.
struct SharedTempDir {
  SharedTempDir(zt::comm::GroupPtr g, const std::string& prefix) : group(std::move(g)), path(shared_dir(group, prefix)) {}
  ~SharedTempDir() {
    group->barrier();
    if (group->rank() == 0) zt::ckpt::remove_tree(path);
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;
  zt::comm::GroupPtr group;
  std::string path;
};

}  // namespace zt::test_support

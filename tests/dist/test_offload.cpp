// ZeRO-Offload with real ranks (CPU, MPI): training with offload_optimizer (the CPU Adam
// over host-resident state) follows the same run without offload, for stages 1-3, and
// bad combinations are named. Run at world 1, 2 and 4.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <algorithm>
#include <string>
#include <sys/stat.h>
#include <torch/torch.h>

#include "ckpt/fs.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/dist_util.h"

namespace zt_test_offload {

namespace {

constexpr int64_t kWidth = 24, kMicro = 2;
constexpr int kSteps = 4;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(kWidth, kWidth));
    b = register_module("b", torch::nn::Linear(kWidth, kWidth));
    c = register_module("c", torch::nn::Linear(kWidth, 3));
  }
  torch::Tensor forward(torch::Tensor x, zt::Engine* e) {
    auto fa = [this](const torch::Tensor& t) { return torch::tanh(a(t)); };
    auto fb = [this](const torch::Tensor& t) { return torch::tanh(b(t)); };
    x = e->run_unit(0, fa, x);
    x = e->run_unit(1, fb, x);
    return c(x);
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, c{nullptr};
};
TORCH_MODULE(Net);

// nvme_dir non-empty: offload_optimizer device nvme there (sub-groups of 200 elements, so
// the swap pipeline has several sub-groups to overlap), with `buffers` staging buffers.
nlohmann::json config(int stage, const std::string& dtype, int gas, bool offload, bool offload_param = false,
                      const std::string& nvme_dir = "", int buffers = 4, bool param_nvme = false) {
  nlohmann::json z = {{"stage", stage}, {"reduce_bucket_size", 300}, {"sub_group_size", 500},
                      {"stage3_param_persistence_threshold", 0}};
  if (offload) z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (offload && !nvme_dir.empty()) {
    z["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_dir}, {"pin_memory", true}, {"buffer_count", buffers}};
    z["sub_group_size"] = 200;
  }
  if (offload_param) z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (offload_param && param_nvme) {  // ZeRO-Infinity parameters, 2 staging slots
    z["offload_param"] = {{"device", "nvme"}, {"nvme_path", nvme_dir}, {"pin_memory", true}, {"buffer_count", 2}};
  }
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", gas},
      {"gradient_clipping", 0.5},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 5e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", z},
  };
  if (dtype == "bf16") j["bf16"] = {{"enabled", true}};
  return j;
}

// An engine on the CPU for a fresh Net (seed 3) with units a and b, quiet.
std::unique_ptr<zt::Engine> net_engine(Net& m, const nlohmann::json& j) {
  torch::manual_seed(3);
  m = Net();
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.units = {m->a->parameters(), m->b->parameters()};
  return zt::initialize(m.ptr(), zt::Config::from_json(j, zt::comm::world_group()->size()), o);
}

std::vector<torch::Tensor> train(const nlohmann::json& j, int gas, int64_t* host_bytes = nullptr,
                                 zt::ModelStateBytes* state = nullptr) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  Net m{nullptr};
  auto engine = net_engine(m, j);
  if (host_bytes) *host_bytes = engine->model_state_bytes().host;
  if (state) *state = engine->model_state_bytes();
  for (int s = 0; s < kSteps; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(777 + s);
    auto x = at::randn({kMicro * gas * world, kWidth}, g), y = at::randn({kMicro * gas * world, 3}, g);
    for (int k = 0; k < gas; ++k) {
      const int64_t start = (static_cast<int64_t>(rank) * gas + k) * kMicro;
      auto xb = x.narrow(0, start, kMicro).to(engine->compute_dtype());
      auto yb = y.narrow(0, start, kMicro);
      auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb, engine.get()).to(torch::kFloat), yb); });
      engine->backward(loss);
      engine->step();
    }
  }
  return engine->gather_master_params();
}

struct Case {
  int stage;
  const char* dtype;
  int gas;
  bool offload_param;
};
void PrintTo(const Case& c, std::ostream* os) { *os << "stage " << c.stage << " " << c.dtype << " gas " << c.gas; }

class OffloadEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(OffloadEquivalence, MatchesTheSameRunWithoutOffload) {
  const Case c = GetParam();
  int64_t host_ref = -1, host_got = -1;
  auto ref = train(config(c.stage, c.dtype, c.gas, false), c.gas, &host_ref);
  auto got = train(config(c.stage, c.dtype, c.gas, true, c.offload_param), c.gas, &host_got);
  EXPECT_EQ(host_ref, 0);
  EXPECT_GT(host_got, 0);  // the offloaded run really kept its state in host buffers
  ASSERT_EQ(got.size(), ref.size());
  // fp32: the CPU Adam and ATen's fused Adam order their fp32 operations differently.
  // bf16: as in the stage equivalence tests, a one-ulp difference of a bf16 copy can move a
  // weight by up to ~lr the other way (Adam normalises).
  const bool bf16 = std::string(c.dtype) == "bf16";
  const double tol = bf16 ? 1e-2 : 1e-5, mean_tol = bf16 ? 5e-4 : 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LE((got[i] - ref[i]).abs().max().item<double>(), tol) << "parameter " << i;
    EXPECT_LE((got[i] - ref[i]).abs().mean().item<double>(), mean_tol) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, OffloadEquivalence,
                         ::testing::Values(Case{1, "fp32", 1, false}, Case{1, "bf16", 2, false},
                                           Case{2, "fp32", 2, false}, Case{2, "bf16", 1, false},
                                           Case{3, "fp32", 1, false}, Case{3, "bf16", 2, false},
                                           Case{3, "fp32", 2, true}, Case{3, "bf16", 1, true}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" + info.param.dtype + "_gas" +
                                  std::to_string(info.param.gas) + (info.param.offload_param ? "_param" : "");
                         });

TEST(OffloadConfig, BadCombinationsAreNamed) {
  const int world = zt::comm::world_group()->size();
  auto expect_error = [&](nlohmann::json j, const std::string& needle) {
    torch::manual_seed(3);
    Net m;
    zt::EngineOptions o;
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    try {
      zt::initialize(m.ptr(), zt::Config::from_json(j, world), o);
      ADD_FAILURE() << "no error for " << j.dump();
    } catch (const zt::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto sgd = config(2, "fp32", 1, true);
  sgd["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.1}}}};
  expect_error(sgd, "use optimizer.type Adam or AdamW");
  auto param_only = config(3, "fp32", 1, false, true);
  expect_error(param_only, "offload_optimizer.device to \"cpu\"");
}

}  // namespace

namespace {

// The model's parameters (stage 2: full on every rank) after `steps` optimizer steps.
std::vector<torch::Tensor> params_after(const nlohmann::json& j, int steps) {
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  Net m{nullptr};
  auto engine = net_engine(m, j);
  for (int s = 0; s < steps; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(777 + s);
    auto x = at::randn({kMicro * world, kWidth}, g), y = at::randn({kMicro * world, 3}, g);
    auto xb = x.narrow(0, rank * kMicro, kMicro), yb = y.narrow(0, rank * kMicro, kMicro);
    auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb, engine.get()), yb); });
    engine->backward(loss);
    engine->step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Delayed parameter update: the CPU step of step t runs during step t+1 and is applied at
// its end. So after one step the model still has its initial weights, and after two steps
// it has exactly the weights a plain offloaded run has after one (same gradients, same
// CPU Adam). Over more steps the trajectory differs (stale gradients) but stays close.
TEST(OffloadDelayed, UpdatesLandOneStepLate) {
  auto j = config(2, "fp32", 1, true);
  j["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = true;
  const auto plain = config(2, "fp32", 1, true);
  auto init = params_after(plain, 0);
  auto d1 = params_after(j, 1), d2 = params_after(j, 2), p1 = params_after(plain, 1);
  for (size_t i = 0; i < init.size(); ++i) {
    EXPECT_TRUE(torch::equal(d1[i], init[i])) << "parameter " << i << " changed before its delayed update landed";
    EXPECT_TRUE(torch::equal(d2[i], p1[i])) << "parameter " << i << ": second delayed step != first plain step";
  }
  auto delayed = train(j, 1), straight = train(plain, 1);
  double max_diff = 0;
  for (size_t i = 0; i < straight.size(); ++i) {
    max_diff = std::max(max_diff, (delayed[i] - straight[i]).abs().max().item<double>());
  }
  EXPECT_GT(max_diff, 1e-7) << "the delayed run followed the plain trajectory exactly";
  EXPECT_LT(max_diff, 5e-2);
}

TEST(OffloadDelayed, NeedsCpuOffloadAndNoParamOffload) {
  auto j = config(3, "fp32", 1, false, false);
  j["zero_optimization"]["offload_optimizer"] = {{"device", "none"}, {"delayed_param_update", true}};
  EXPECT_THROW(zt::Config::from_json(j, zt::comm::world_group()->size()), zt::ConfigError);
  auto k = config(3, "fp32", 1, true, true);
  k["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = true;
  EXPECT_THROW(zt::Config::from_json(k, zt::comm::world_group()->size()), zt::ConfigError);
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------------------
// ZeRO-Infinity: offload_optimizer device nvme. Each rank swaps its state through its own
// file in a fresh directory under the build tree.

// This rank's NVMe swap directory for one test.
struct NvmeDir : zt::test_support::LocalTempDir {
  NvmeDir() : LocalTempDir("nvme_test") {}
};

// This rank's swap file in `dir`: the n-th engine alive at once gets name n.
std::string swap_file(const std::string& dir, int n = 0) {
  return dir + "/zerotrain_rank" + std::to_string(zt::comm::discover_rank().rank) + "_optimizer" +
         (n == 0 ? "" : "." + std::to_string(n)) + ".swp";
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

struct NvmeCase {
  int stage;
  const char* dtype;
  int gas;
  bool offload_param;
  int buffers;  // offload_optimizer.buffer_count: 1 synchronous, 2 write overlap, 4 reads and writes
  bool param_nvme = false;  // offload_param device nvme too (the parameter file, [NVMe Params])
};
void PrintTo(const NvmeCase& c, std::ostream* os) {
  *os << "stage " << c.stage << " " << c.dtype << " gas " << c.gas << " buffers " << c.buffers;
}

class NvmeEquivalence : public ::testing::TestWithParam<NvmeCase> {};

// The same run without offload within the CPU-offload tolerance, and bit for bit the CPU
// offload run (same CPU Adam, same gradients: only where the state lives differs).
TEST_P(NvmeEquivalence, MatchesNoOffloadAndEqualsCpuOffload) {
  const NvmeCase c = GetParam();
  NvmeDir dir;
  zt::ModelStateBytes cpu_state, nvme_state;
  auto ref = train(config(c.stage, c.dtype, c.gas, false), c.gas);
  auto cpu = train(config(c.stage, c.dtype, c.gas, true, c.offload_param), c.gas, nullptr, &cpu_state);
  auto got = train(config(c.stage, c.dtype, c.gas, true, c.offload_param, dir.path, c.buffers, c.param_nvme), c.gas,
                   nullptr, &nvme_state);
  EXPECT_EQ(file_size(swap_file(dir.path)), -1) << "the swap file outlived its engine";
  const std::string param_file =
      dir.path + "/zerotrain_rank" + std::to_string(zt::comm::discover_rank().rank) + "_params.swp";
  EXPECT_EQ(file_size(param_file), -1) << "the parameter file outlived its engine";

  // Accounting: the same master and Adam state, now in the swap file (each 200-element
  // sub-group's three arrays padded to 4096 bytes); the host keeps the gradient buffer,
  // the staging buffers (master, m, v and a compute-dtype copy for the upload each) and,
  // with offload_param, the compute-dtype shard.
  const int64_t owned = cpu_state.master / 4;
  const int64_t groups = (owned + 199) / 200, d = std::string(c.dtype) == "bf16" ? 2 : 4;
  // With offload_param nvme the compute-dtype shard is in its own file instead (rounded up
  // to 4096 bytes); the host keeps its staging slots and write buffer, and the step's
  // compute-dtype copy goes through the optimizer buffers' scratch again.
  const bool scratch = d == 2 && (!c.offload_param || c.param_nvme);
  const int64_t staging = std::min<int64_t>(c.buffers, groups) * (3 * 4096 + (scratch ? 4096 : 0));
  const int64_t param_file_bytes = (d * owned + 4095) / 4096 * 4096;
  EXPECT_EQ(nvme_state.master, cpu_state.master);
  EXPECT_EQ(nvme_state.optimizer, cpu_state.optimizer);
  EXPECT_EQ(cpu_state.nvme, 0);
  EXPECT_EQ(nvme_state.nvme, groups * 3 * 4096 + (c.param_nvme ? param_file_bytes : 0));
  if (c.param_nvme) {
    // Two slots of at least one page each, and the write buffer (the shard plus two pages).
    EXPECT_GE(nvme_state.host, d * owned + staging + 2 * 4096 + param_file_bytes + 2 * 4096);
    EXPECT_LT(nvme_state.host, d * owned + staging + 2 * (param_file_bytes + 4096) + param_file_bytes + 2 * 4096 + 1);
  } else {
    EXPECT_EQ(nvme_state.host, d * owned + staging + (c.offload_param ? d * owned : 0));
  }
  EXPECT_EQ(cpu_state.host, 12 * owned + d * owned + d * owned);

  ASSERT_EQ(got.size(), ref.size());
  const bool bf16 = d == 2;
  const double tol = bf16 ? 1e-2 : 1e-5, mean_tol = bf16 ? 5e-4 : 1e-6;  // as OffloadEquivalence
  for (size_t i = 0; i < ref.size(); ++i) {
    EXPECT_LE((got[i] - ref[i]).abs().max().item<double>(), tol) << "parameter " << i;
    EXPECT_LE((got[i] - ref[i]).abs().mean().item<double>(), mean_tol) << "parameter " << i;
    EXPECT_TRUE(torch::equal(got[i], cpu[i])) << "parameter " << i << " differs from the CPU-offload run by "
                                              << (got[i] - cpu[i]).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, NvmeEquivalence,
                         ::testing::Values(NvmeCase{1, "fp32", 1, false, 4}, NvmeCase{1, "bf16", 2, false, 1},
                                           NvmeCase{2, "bf16", 1, false, 4}, NvmeCase{2, "fp32", 2, false, 2},
                                           NvmeCase{3, "fp32", 2, false, 4}, NvmeCase{3, "bf16", 1, false, 3},
                                           NvmeCase{3, "bf16", 2, true, 4}, NvmeCase{3, "bf16", 2, true, 4, true},
                                           NvmeCase{3, "fp32", 1, true, 1, true}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" + info.param.dtype + "_gas" +
                                  std::to_string(info.param.gas) +
                                  (info.param.offload_param ? (info.param.param_nvme ? "_paramnvme" : "_param") : "") +
                                  "_buffers" + std::to_string(info.param.buffers);
                         });

TEST(OffloadNvme, SwapFileLivesWithItsEngine) {
  NvmeDir dir;
  const std::string path = swap_file(dir.path);
  const auto j = config(2, "fp32", 1, true, false, dir.path);
  {
    Net m{nullptr};
    auto engine = net_engine(m, j);
    const int64_t bytes = engine->model_state_bytes().nvme;
    EXPECT_GT(bytes, 0);
    EXPECT_EQ(file_size(path), bytes) << path;
    {
      // A second engine alive at the same time (another job on the same nvme_path alike)
      // claims the next name instead of overwriting the first one's file.
      Net m2{nullptr};
      auto second = net_engine(m2, j);
      EXPECT_EQ(file_size(swap_file(dir.path, 1)), bytes);
    }
    EXPECT_EQ(file_size(swap_file(dir.path, 1)), -1) << "the second engine's swap file was not removed";
    const int world = zt::comm::world_group()->size(), rank = zt::comm::world_group()->rank();
    for (int s = 0; s < 2; ++s) {
      auto g = at::make_generator<at::CPUGeneratorImpl>(5 + s);
      auto x = at::randn({kMicro * world, kWidth}, g), y = at::randn({kMicro * world, 3}, g);
      auto xb = x.narrow(0, rank * kMicro, kMicro), yb = y.narrow(0, rank * kMicro, kMicro);
      auto loss = engine->forward([&] { return torch::mse_loss(m->forward(xb, engine.get()), yb); });
      engine->backward(loss);
      engine->step();
      EXPECT_EQ(file_size(path), bytes) << "during training";
      // The step swapped the whole state through the staging buffers once each way.
      EXPECT_EQ(engine->last_report().nvme.bytes_read, bytes);
      EXPECT_EQ(engine->last_report().nvme.bytes_written, bytes);
    }
  }
  EXPECT_EQ(file_size(path), -1) << "the swap file outlived its engine";
}

TEST(OffloadNvme, MissingPathFailsAtInitializeNamingKeyAndPath) {
  const std::string missing = std::string(ZT_BINARY_DIR) + "/no_such_nvme_dir_for_tests/swap";
  for (int stage : {1, 3}) {
    Net m{nullptr};
    try {
      net_engine(m, config(stage, "fp32", 1, true, false, missing));
      ADD_FAILURE() << "no error at stage " << stage;
    } catch (const zt::ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("zero_optimization.offload_optimizer.nvme_path"), std::string::npos) << msg;
      EXPECT_NE(msg.find("'" + missing + "' does not exist"), std::string::npos) << msg;
    }
  }
}

// offload_param nvme with the CPU optimizer: the step writes each bucket's compute-dtype copy
// into the parameter file; the result is bit for bit the run with offload_param cpu.
TEST(OffloadNvme, ParamsOnNvmeWithTheCpuOptimizerEqualCpuOffload) {
  for (const auto& [dtype, gas] : {std::pair<const char*, int>{"bf16", 2}, {"fp32", 1}}) {
    NvmeDir dir;
    zt::ModelStateBytes cpu_state, nvme_state;
    auto cpu = train(config(3, dtype, gas, true, true), gas, nullptr, &cpu_state);
    auto j = config(3, dtype, gas, true, true);
    j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", dir.path}, {"pin_memory", true},
                                               {"buffer_count", 2}};
    auto got = train(j, gas, nullptr, &nvme_state);
    const int64_t owned = cpu_state.master / 4, d = std::string(dtype) == "bf16" ? 2 : 4;
    EXPECT_EQ(nvme_state.nvme, (d * owned + 4095) / 4096 * 4096) << dtype;  // the parameter file only
    EXPECT_EQ(nvme_state.master, cpu_state.master);
    const std::string param_file =
        dir.path + "/zerotrain_rank" + std::to_string(zt::comm::discover_rank().rank) + "_params.swp";
    EXPECT_EQ(file_size(param_file), -1) << "the parameter file outlived its engine";
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i], cpu[i])) << dtype << " parameter " << i << " differs by "
                                                << (got[i] - cpu[i]).abs().max().item<double>();
    }
  }
}

// offload_param nvme: named errors at initialize for a missing path and a staging buffer
// too small for a unit's shard.
TEST(OffloadNvme, ParamNvmeErrorsNameTheKeyAndTheFix) {
  NvmeDir dir;
  auto expect = [](const nlohmann::json& j, const std::vector<std::string>& parts) {
    Net m{nullptr};
    try {
      net_engine(m, j);
      ADD_FAILURE() << "accepted: " << j.dump();
    } catch (const zt::ConfigError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  const std::string missing = std::string(ZT_BINARY_DIR) + "/no_such_nvme_dir_for_tests/params";
  auto no_dir = config(3, "fp32", 1, true, true, dir.path, 2, true);
  no_dir["zero_optimization"]["offload_param"]["nvme_path"] = missing;
  expect(no_dir, {"zero_optimization.offload_param.nvme_path", "'" + missing + "' does not exist"});
  auto small = config(3, "fp32", 1, true, true, dir.path, 2, true);
  small["zero_optimization"]["offload_param"]["buffer_size"] = 10;
  expect(small, {"zero_optimization.offload_param.buffer_size = 10", "raise buffer_size to at least"});
}

TEST(OffloadNvme, DelayedUpdateAndGdsAreRejected) {
  NvmeDir dir;
  const int world = zt::comm::world_group()->size();
  auto delayed = config(2, "fp32", 1, true, false, dir.path);
  delayed["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = true;
  try {
    zt::Config::from_json(delayed, world);
    ADD_FAILURE() << "delayed_param_update with nvme accepted";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("delayed_param_update"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not supported with \"nvme\""), std::string::npos) << e.what();
  }
  auto gds = config(2, "fp32", 1, true, false, dir.path);
  gds["aio"] = {{"use_gds", true}};
  try {
    zt::Config::from_json(gds, world);
    ADD_FAILURE() << "aio.use_gds accepted";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("aio.use_gds = true is not supported yet"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// Running out of device memory inside a phase is reported with the rank, the phase and the
// step (the CUDA allocator's own error names none of them). Injected from the user's
// forward, as the caching allocator would throw it.
TEST(EngineErrors, OutOfMemoryNamesRankPhaseAndStep) {
  auto group = zt::comm::world_group();
  Net m{nullptr};
  auto engine = net_engine(m, config(2, "fp32", 1, false));
  try {
    engine->forward([&]() -> torch::Tensor {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 18.40 GiB");
      return {};
    });
    FAIL() << "no error";
  } catch (const zt::TrainingError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank " + std::to_string(group->rank()) + ": out of device memory in the forward phase of step 1"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("Tried to allocate 18.40 GiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("zerotrain estimate"), std::string::npos) << msg;
  }
}

// Host bytes a CPU-offload run holds after two steps (the delayed update's second gradient
// buffer exists from its first step on).
int64_t host_after_two_steps(const nlohmann::json& j) {
  Net m{nullptr};
  auto engine = net_engine(m, j);
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  auto x = at::randn({kMicro, kWidth}, g), y = at::randn({kMicro, 3}, g);
  for (int s = 0; s < 2; ++s) {
    auto loss = engine->forward(
        [&] { return torch::mse_loss(m->forward(x.to(engine->compute_dtype()), engine.get()).to(torch::kFloat), y); });
    engine->backward(loss);
    engine->step();
  }
  return engine->model_state_bytes().host;
}

// Too little host memory for the offloaded state is a ConfigError on every rank at
// initialize, before any of it is allocated, naming the key, the bytes, where the figure came
// from and the fix; exactly enough passes. The boundary is the host memory the run then
// holds, so the check and the allocations agree byte for byte (stages 1-3, the delayed
// update, offload_param cpu, bf16 and fp32).
TEST(OffloadHostMemory, TooLittleHostMemoryIsAConfigErrorAtInitialize) {
  const int64_t local = std::max(1, zt::comm::discover_rank().local_world_size);
  struct C {
    int stage;
    bool offload_param, delayed;
    const char* dtype;
  };
  for (const C c : {C{1, false, false, "bf16"}, C{2, false, true, "bf16"}, C{2, false, false, "fp32"},
                    C{3, false, false, "bf16"}, C{3, true, false, "bf16"}}) {
    SCOPED_TRACE(::testing::Message() << "stage " << c.stage << " offload_param " << c.offload_param << " delayed "
                                      << c.delayed << " " << c.dtype);
    auto j = config(c.stage, c.dtype, 1, /*offload=*/true, c.offload_param);
    if (c.delayed) j["zero_optimization"]["offload_optimizer"]["delayed_param_update"] = true;
    unsetenv("ZT_HOST_MEMORY_AVAILABLE");
    const int64_t host = host_after_two_steps(j);
    ASSERT_GT(host, 0);
    Net m{nullptr};
    setenv("ZT_HOST_MEMORY_AVAILABLE", std::to_string(host * local - 1).c_str(), 1);
    try {
      net_engine(m, j);
      ADD_FAILURE() << "no error with " << host * local - 1 << " bytes for " << host * local;
    } catch (const zt::ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("zero_optimization.offload_optimizer"), std::string::npos) << msg;
      EXPECT_NE(msg.find("ZT_HOST_MEMORY_AVAILABLE"), std::string::npos) << msg;
      EXPECT_NE(msg.find("\"nvme\""), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank(s) on this host"), std::string::npos) << msg;
    }
    setenv("ZT_HOST_MEMORY_AVAILABLE", std::to_string(host * local).c_str(), 1);
    EXPECT_NO_THROW(net_engine(m, j));
    unsetenv("ZT_HOST_MEMORY_AVAILABLE");
  }
}

}  // namespace

}  // namespace zt_test_offload

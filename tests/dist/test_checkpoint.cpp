// Checkpoints with real ranks (CPU, MPI): exact resume per stage and dtype, loading
// across world sizes and stages, verification failures that name the file, and the
// asynchronous save (same files as a synchronous one, training during the write, errors).
// Run at world 1, 2 and 4 by ctest. The crash-during-save test is in
// tests/unit/test_checkpoint_crash.cpp (it needs to kill ranks).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>
#include <tuple>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/fs.h"
#include "log/log.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "zerotrain/version.h"

namespace zt_test_checkpoint {

namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 16) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, 4));
    // A buffer: stored as a model tensor (rank 0's file), not as optimizer state.
    offset = register_buffer("offset", torch::zeros({4}));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))) + offset.to(x.dtype()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::Tensor offset;
};
TORCH_MODULE(Net);

constexpr int64_t kMicro = 2;

nlohmann::json config(int stage, const std::string& dtype, int gas, int64_t micro = kMicro) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", micro},
      {"gradient_accumulation_steps", gas},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      // The LR changes every step, so a wrong schedule position shows.
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 1e-2}, {"warmup_num_steps", 8}}}}},
      // Small buckets: parameters spread over several buckets and shards.
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 200}, {"allgather_bucket_size", 300}, {"stage3_param_persistence_threshold", 0}}},
  };
  if (dtype == "bf16") j["bf16"] = {{"enabled", true}};
  // fp16: a dynamic scale that grows during the test (window 2), so it must be restored.
  if (dtype == "fp16") j["fp16"] = {{"enabled", true}, {"initial_scale_power", 4}, {"loss_scale_window", 2}};
  return j;
}

std::unique_ptr<zt::Engine> engine_for(Net& m, const nlohmann::json& j, zt::comm::GroupPtr group) {
  auto cfg = zt::Config::from_json(j, group->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = std::move(group);
  return zt::initialize(m.ptr(), cfg, o);
}

// A directory every rank of `g` sees (rank 0 creates it, the name is broadcast).
// One checkpoint directory for the group, removed at the end of the test.
struct TempDir : zt::test_support::SharedTempDir {
  explicit TempDir(zt::comm::GroupPtr g) : SharedTempDir(std::move(g), "ckpt_test") {}
};

// Trains optimizer steps [from, to): step s uses global batch s split over the ranks of
// the engine's group, plus input noise from the default CPU generator (so resuming also
// needs the RNG state). Returns the per-step mean losses.
std::vector<double> train(zt::Engine& e, Net& m, int from, int to, bool noise = true) {
  const int world = e.group()->size(), rank = e.group()->rank();
  const int gas = static_cast<int>(e.config().gradient_accumulation_steps);
  const int64_t global = kMicro * 4 * gas;  // divisible by 1, 2 and 4 ranks
  const int64_t per_rank = global / world / gas;
  std::vector<double> losses;
  for (int s = from; s < to; ++s) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + s);
    auto x = at::randn({global, 8}, gen);
    auto y = at::randn({global, 4}, gen);
    for (int k = 0; k < gas; ++k) {
      const int64_t start = (static_cast<int64_t>(rank) * gas + k) * per_rank;
      auto xb = x.narrow(0, start, per_rank);
      if (noise) xb = xb + 0.05 * torch::randn_like(xb);
      xb = xb.to(e.compute_dtype());
      auto yb = y.narrow(0, start, per_rank);
      auto loss = e.forward([&] { return torch::mse_loss(m->forward(xb).to(torch::kFloat), yb); });
      e.backward(loss);
      e.step();
    }
    losses.push_back(e.last_report().loss);
  }
  return losses;
}

std::vector<torch::Tensor> compute_params(Net& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->parameters()) out.push_back(p.detach().clone());
  return out;
}

void expect_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << what << " tensor " << i << " differs by up to "
                                          << (a[i].to(torch::kFloat) - b[i].to(torch::kFloat)).abs().max().item<double>();
  }
}

// ---------------------------------------------------------------------------------------
// Exact resume: k steps, save, a fresh engine (another init) loads, n-k more steps ==
// n steps straight, bit for bit (losses, master and compute parameters, scale, LR).

struct ResumeCase {
  int stage;
  const char* dtype;
  int gas;
  int offload = 0;  // 1: offload_optimizer cpu; 2: and offload_param cpu (stage 3); 3: offload_optimizer
                    // nvme; 4: nvme and offload_param cpu (stage 3)
};

class CheckpointResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(CheckpointResume, BitIdenticalToUninterrupted) {
  const ResumeCase c = GetParam();
  auto world = zt::comm::world_group();
  TempDir dir(world);
  auto j = config(c.stage, c.dtype, c.gas);
  if (c.offload >= 1) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  if (c.offload == 2 || c.offload == 4) j["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  // NVMe: this rank's swap files (three engines alive at once below: three names) in a
  // directory of its own; sub-groups of 100 elements, fewer staging buffers than sub-groups.
  std::optional<TempDir> nvme;
  if (c.offload >= 3) {
    nvme.emplace(world);
    j["zero_optimization"]["offload_optimizer"] = {
        {"device", "nvme"}, {"nvme_path", nvme->path}, {"buffer_count", 3}};
    j["zero_optimization"]["sub_group_size"] = 100;
  }
  constexpr int kN = 6, kK = 3;

  torch::manual_seed(7);
  Net straight_m;
  auto straight = engine_for(straight_m, j, world);
  auto straight_losses = train(*straight, straight_m, 0, kN);

  torch::manual_seed(7);
  Net first_m;
  auto first = engine_for(first_m, j, world);
  auto losses = train(*first, first_m, 0, kK);
  first->save_checkpoint(dir.path, "", {{"note", "k steps"}});
  first.reset();

  torch::manual_seed(99);  // another init and RNG state: everything must come from the checkpoint
  Net resumed_m;
  auto resumed = engine_for(resumed_m, j, world);
  auto client = resumed->load_checkpoint(dir.path);
  EXPECT_EQ(client.value("note", ""), "k steps");
  EXPECT_EQ(resumed->global_steps(), kK);
  auto more = train(*resumed, resumed_m, kK, kN);
  losses.insert(losses.end(), more.begin(), more.end());

  EXPECT_EQ(losses, straight_losses);
  EXPECT_EQ(resumed->global_steps(), straight->global_steps());
  EXPECT_EQ(resumed->loss_scale(), straight->loss_scale());
  EXPECT_EQ(resumed->get_lr(), straight->get_lr());
  if (std::string(c.dtype) == "fp16") EXPECT_GT(straight->loss_scale(), 16.0) << "the scale should have grown";
  expect_equal(resumed->gather_master_params(), straight->gather_master_params(), "master");
  expect_equal(compute_params(resumed_m), compute_params(straight_m), "compute params");
}

// Adding a stage is one line per dtype here.
INSTANTIATE_TEST_SUITE_P(Stages, CheckpointResume,
                         ::testing::Values(ResumeCase{0, "fp32", 1}, ResumeCase{0, "bf16", 2}, ResumeCase{0, "fp16", 1},
                                           ResumeCase{1, "fp32", 2}, ResumeCase{1, "bf16", 1}, ResumeCase{1, "fp16", 1},
                                           ResumeCase{2, "fp32", 1}, ResumeCase{2, "bf16", 2}, ResumeCase{2, "fp16", 1},
                                           ResumeCase{3, "fp32", 2}, ResumeCase{3, "bf16", 1}, ResumeCase{3, "fp16", 1},
                                           ResumeCase{1, "bf16", 1, 1}, ResumeCase{2, "fp16", 1, 1},
                                           ResumeCase{2, "fp32", 2, 1}, ResumeCase{3, "bf16", 2, 1},
                                           ResumeCase{3, "fp16", 1, 2}, ResumeCase{1, "fp32", 2, 3},
                                           ResumeCase{2, "bf16", 1, 3}, ResumeCase{2, "fp16", 1, 3},
                                           ResumeCase{3, "fp32", 1, 3}, ResumeCase{3, "bf16", 2, 4}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" + info.param.dtype + "_gas" +
                                  std::to_string(info.param.gas) +
                                  (info.param.offload == 4   ? "_nvme_offload_param"
                                   : info.param.offload == 3 ? "_nvme"
                                   : info.param.offload == 2 ? "_offload_param"
                                   : info.param.offload      ? "_offload"
                                                             : "");
                         });

// ---------------------------------------------------------------------------------------
// World size and stage agnostic: save on one set of ranks at one stage, load on a set of
// another size at another stage. The master weights must match exactly; one more step on
// the same global batch must match to fp32 summation-order tolerance (with the optimizer
// state lost, Adam's step would differ by ~lr).

// save_offload / load_offload: "" (none), "cpu" or "nvme" (offload_optimizer device).
void cross_load(int save_stage, int load_stage, bool save_on_all, const std::string& save_offload = "",
                const std::string& load_offload = "") {
  auto world = zt::comm::world_group();
  const int rank = world->rank(), n = world->size();
  const int half = std::max(1, n / 2);
  auto sub = world->split(rank < half ? 0 : -1, rank);
  auto save_group = save_on_all ? world : sub;
  auto load_group = save_on_all ? sub : world;
  TempDir dir(world);
  TempDir nvme_dir(world);
  auto config_with = [&](int stage, int ranks, const std::string& offload) {
    auto j = config(stage, "fp32", 1, 4 * kMicro / ranks);
    if (offload == "cpu") j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    if (offload == "nvme") {
      j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", nvme_dir.path}};
      j["zero_optimization"]["sub_group_size"] = 150;
    }
    return j;
  };

  std::vector<torch::Tensor> saved_master, saved_next;
  if (save_group) {
    torch::manual_seed(7);
    Net m;
    auto e = engine_for(m, config_with(save_stage, save_group->size(), save_offload), save_group);
    train(*e, m, 0, 2, /*noise=*/false);
    e->save_checkpoint(dir.path, "universal");
    saved_master = e->gather_master_params();
    train(*e, m, 2, 3, false);
    saved_next = e->gather_master_params();
  }
  world->barrier();
  if (load_group) {
    torch::manual_seed(99);
    Net m;
    auto e = engine_for(m, config_with(load_stage, load_group->size(), load_offload), load_group);
    e->load_checkpoint(dir.path);
    EXPECT_EQ(e->global_steps(), 2);
    auto master = e->gather_master_params();
    train(*e, m, 2, 3, false);
    auto next = e->gather_master_params();
    // Only ranks in both groups hold both results (rank 0 always does).
    if (save_group) {
      expect_equal(master, saved_master, "loaded master");
      for (size_t i = 0; i < next.size(); ++i) {
        EXPECT_LE((next[i] - saved_next[i]).abs().max().item<double>(), 1e-5)
            << "parameter " << i << " after one more step: optimizer state not restored?";
      }
    }
  }
  world->barrier();
}

// Parameter groups (matrices: weight_decay 0.1; vectors: weight_decay 0, lr_scale 0.5):
// the grouped flat layout resumes bit-exactly too (with the scheduler's changing lr).
TEST(CheckpointResumeGroups, BitIdenticalToUninterrupted) {
  auto world = zt::comm::world_group();
  for (const auto& [stage, dtype, offload] : std::vector<std::tuple<int, std::string, bool>>{
           {1, "fp32", false}, {2, "bf16", true}, {3, "bf16", false}}) {
    TempDir dir(world);
    auto j = config(stage, dtype, 1);
    if (offload) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    auto grouped = [&](Net& m) {
      zt::ParamGroup matrices, vectors;
      matrices.weight_decay = 0.1;
      vectors.weight_decay = 0.0;
      vectors.lr_scale = 0.5;
      for (auto& p : m->parameters()) (p.dim() >= 2 ? matrices : vectors).params.push_back(p);
      auto cfg = zt::Config::from_json(j, world->size());
      zt::EngineOptions o;
      o.device = torch::Device(torch::kCPU);
      o.print = false;
      o.param_groups = {matrices, vectors};
      return zt::initialize(m.ptr(), cfg, o);
    };
    constexpr int kN = 5, kK = 2;
    const std::string what = "stage " + std::to_string(stage) + " " + dtype + (offload ? " offload" : "");
    torch::manual_seed(7);
    Net straight_m;
    auto straight = grouped(straight_m);
    auto straight_losses = train(*straight, straight_m, 0, kN);
    torch::manual_seed(7);
    Net first_m;
    auto first = grouped(first_m);
    auto losses = train(*first, first_m, 0, kK);
    first->save_checkpoint(dir.path);
    first.reset();
    torch::manual_seed(99);
    Net resumed_m;
    auto resumed = grouped(resumed_m);
    resumed->load_checkpoint(dir.path);
    auto more = train(*resumed, resumed_m, kK, kN);
    losses.insert(losses.end(), more.begin(), more.end());
    EXPECT_EQ(losses, straight_losses) << what;
    expect_equal(resumed->gather_master_params(), straight->gather_master_params(), "master " + what);
    expect_equal(compute_params(resumed_m), compute_params(straight_m), "compute params " + what);
  }
}

TEST(CheckpointUniversal, AllRanksStage1LoadedOnHalfStage2) { cross_load(1, 2, true); }
TEST(CheckpointUniversal, HalfRanksStage2LoadedOnAllStage1) { cross_load(2, 1, false); }
TEST(CheckpointUniversal, AllRanksStage0LoadedOnHalfStage1) { cross_load(0, 1, true); }
TEST(CheckpointUniversal, AllRanksStage1LoadedOnHalfStage3) { cross_load(1, 3, true); }
TEST(CheckpointUniversal, HalfRanksStage3LoadedOnAllStage2) { cross_load(3, 2, false); }
// The NVMe swap file is not part of the checkpoint: its fragments are those of any other run.
TEST(CheckpointUniversal, AllRanksStage2NvmeLoadedOnHalfStage3Cpu) { cross_load(2, 3, true, "nvme", "cpu"); }
TEST(CheckpointUniversal, HalfRanksStage1CpuLoadedOnAllStage2Nvme) { cross_load(1, 2, false, "cpu", "nvme"); }
TEST(CheckpointUniversal, AllRanksStage3NvmeLoadedOnHalfStage1) { cross_load(3, 1, true, "nvme", ""); }

// ---------------------------------------------------------------------------------------
// Verification: damaged files fail the load on every rank, naming the file.

std::string saved_checkpoint(const std::string& dir, const zt::comm::GroupPtr& world) {
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, config(1, "fp32", 1), world);
  train(*e, m, 0, 1);
  e->save_checkpoint(dir, "t1");
  return dir + "/t1";
}

// Loads DIR's latest into a fresh engine; returns the error message ("" = loaded).
std::string load_error(const std::string& dir, const zt::comm::GroupPtr& world, int64_t hidden = 16) {
  torch::manual_seed(7);
  Net m(hidden);
  auto e = engine_for(m, config(1, "fp32", 1), world);
  try {
    e->load_checkpoint(dir);
  } catch (const zt::CheckpointError& ex) {
    return ex.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(CheckpointVerify, FlippedByteFailsNamingTheFile) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const std::string ck = saved_checkpoint(dir.path, world);
  char name[64];
  std::snprintf(name, sizeof name, "rank_%05d.safetensors", world->size() - 1);
  const std::string victim = ck + "/" + name;
  if (world->rank() == 0) {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = static_cast<std::streamoff>(f.tellg());
    f.seekg(size - 16);
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x01);
    f.seekp(size - 16);
    f.write(&b, 1);
  }
  world->barrier();
  const std::string err = load_error(dir.path, world);
  EXPECT_TRUE(has(err, victim)) << err;
  EXPECT_TRUE(has(err, "checksum")) << err;
}

TEST(CheckpointVerify, TruncatedFileFailsNamingTheFile) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const std::string ck = saved_checkpoint(dir.path, world);
  const std::string victim = ck + "/rank_00000.safetensors";
  if (world->rank() == 0) {
    std::ifstream in(victim, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    std::ofstream out(victim, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 100));
  }
  world->barrier();
  const std::string err = load_error(dir.path, world);
  EXPECT_TRUE(has(err, victim)) << err;
  EXPECT_TRUE(has(err, "truncated")) << err;
}

TEST(CheckpointVerify, ShapeMismatchNamesTheParameter) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  saved_checkpoint(dir.path, world);
  const std::string err = load_error(dir.path, world, /*hidden=*/24);
  EXPECT_TRUE(has(err, "fc1.weight")) << err;
  EXPECT_TRUE(has(err, "shape")) << err;
}

TEST(CheckpointVerify, MissingLatestSaysSo) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const std::string err = load_error(dir.path, world);
  EXPECT_TRUE(has(err, "latest")) << err;
}

// A leftover of an interrupted save (a .partial directory) is invisible to load and
// replaced by the next save of that tag.
TEST(CheckpointVerify, PartialDirectoryIsIgnoredAndReplaced) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  saved_checkpoint(dir.path, world);
  if (world->rank() == 0) {
    zt::ckpt::make_dirs(dir.path + "/.t2.partial");
    std::ofstream(dir.path + "/.t2.partial/rank_00000.safetensors") << "garbage";
  }
  world->barrier();
  EXPECT_EQ(load_error(dir.path, world), "");
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, config(2, "fp32", 1), world);
  train(*e, m, 0, 1);
  e->save_checkpoint(dir.path, "t2");
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/.t2.partial"));
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "t2");
  EXPECT_EQ(load_error(dir.path, world), "");
}

// The engine's own saves take the directory's lock ([Save Dir Lock]): another job holding
// it (here a forked process of rank 0, flock on DIR/.zerotrain.lock) is a CheckpointError
// on every rank naming that job, nothing is written; once it is gone the save goes through.
TEST(CheckpointVerify, DirectoryLockedByAnotherJobIsNamed) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  pid_t holder = -1;
  if (world->rank() == 0) {
    const std::string lock = dir.path + "/.zerotrain.lock";
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    holder = ::fork();
    if (holder == 0) {
      const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
      const char text[] = "host elsewhere pid 4242 since noon\n";
      if (fd < 0 || ::write(fd, text, sizeof text - 1) < 0 || ::flock(fd, LOCK_EX) != 0) ::_exit(1);
      const char c = 1;
      if (::write(ready[1], &c, 1) != 1) ::_exit(1);
      ::pause();
      ::_exit(0);
    }
    char c = 0;
    ASSERT_EQ(::read(ready[0], &c, 1), 1);
  }
  world->barrier();
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, config(2, "fp32", 1), world);
  train(*e, m, 0, 1);
  std::string err;
  try {
    e->save_checkpoint(dir.path, "t1");
  } catch (const zt::CheckpointError& ex) {
    err = ex.what();
  }
  EXPECT_TRUE(has(err, "is in use by another zerotrain job (host elsewhere pid 4242 since noon)")) << err;
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/latest"));
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/t1"));
  if (world->rank() == 0) {
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
  }
  world->barrier();
  e->save_checkpoint(dir.path, "t1");
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "t1");
}

// ---------------------------------------------------------------------------------------
// The manifest records the release that wrote it ("zerotrain_version", the CMake project
// version: ZT_PROJECT_VERSION comes from CMakeLists.txt); load ignores it, so a manifest
// without it (written before 0.8) still loads, and only a too-new format names it.

TEST(CheckpointManifest, RecordsTheZerotrainVersion) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const std::string ck = saved_checkpoint(dir.path, world);
  const auto m = nlohmann::json::parse(zt::ckpt::read_text_file(ck + "/manifest.json"));
  EXPECT_EQ(m.value("zerotrain_version", ""), ZT_PROJECT_VERSION);
  EXPECT_STREQ(zt::version(), ZT_PROJECT_VERSION);
  world->barrier();  // every rank has read the manifest before rank 0 rewrites it

  auto rewrite = [&](const nlohmann::json& j) {
    if (world->rank() == 0) std::ofstream(ck + "/manifest.json", std::ios::trunc) << j.dump(1);
    world->barrier();
  };
  auto old = m;
  old.erase("zerotrain_version");
  rewrite(old);
  EXPECT_EQ(load_error(dir.path, world), "");

  auto newer = m;
  newer["version"] = m.at("version").get<int>() + 1;
  newer["zerotrain_version"] = "99.1.0";
  rewrite(newer);
  const std::string err = load_error(dir.path, world);
  EXPECT_TRUE(has(err, "format version")) << err;
  EXPECT_TRUE(has(err, "99.1.0")) << err;
}

// ---------------------------------------------------------------------------------------
// A load at another gradient_accumulation_steps: the checkpoint was saved at a step
// boundary, so the first window after the load has exactly the new gas micro-batches
// (the saved micro-step count is global_steps x the old gas; windows are micro % gas).
// The global step (and with it the schedule position) stays as saved.

TEST(CheckpointResumeGas, FirstWindowAfterLoadHasTheNewAccumulation) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  {
    torch::manual_seed(7);
    Net m;
    auto e = engine_for(m, config(1, "fp32", 2), world);
    train(*e, m, 0, 3, /*noise=*/false);
    ASSERT_EQ(e->micro_steps(), 6);
    e->save_checkpoint(dir.path);
  }
  for (int gas : {4, 1, 3}) {
    torch::manual_seed(99);
    Net m;
    auto e = engine_for(m, config(1, "fp32", gas), world);
    e->load_checkpoint(dir.path);
    EXPECT_EQ(e->global_steps(), 3) << "gas " << gas;
    // Two steps: count the backward calls between the steps that step() takes.
    const int world_size = world->size(), rank = world->rank();
    const int64_t per_rank = kMicro * 4 / world_size;
    int since_step = 0;
    std::vector<int> consumed;
    std::vector<int64_t> reported;
    for (int k = 0; k < 2 * gas; ++k) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + k * world_size + rank);
      auto xb = at::randn({per_rank, 8}, gen), yb = at::randn({per_rank, 4}, gen);
      auto loss = e->forward([&] { return torch::mse_loss(m->forward(xb), yb); });
      e->backward(loss);
      ++since_step;
      if (e->step()) {
        consumed.push_back(since_step);
        reported.push_back(e->last_report().micro_steps);
        since_step = 0;
      }
    }
    EXPECT_EQ(consumed, std::vector<int>({gas, gas})) << "gas " << gas << ": micro-batches per step after the load";
    EXPECT_EQ(reported, std::vector<int64_t>({gas, gas})) << "gas " << gas;
    EXPECT_EQ(e->global_steps(), 5) << "gas " << gas;
    EXPECT_EQ(e->micro_steps(), 5 * gas) << "gas " << gas;
  }
}

// ---------------------------------------------------------------------------------------
// DeepSpeed's global_samples: every step adds the train_batch_size it ran with; saved in
// the manifest's counters and restored, so a resume at another batch size keeps counting
// exactly (not global_steps x the new batch). A checkpoint without it (written before)
// derives global_steps x the loading run's train_batch_size, as DeepSpeed does, and says so.

// The log lines a call writes (this rank's), through a temporary file.
std::string logged_by(const std::function<void()>& fn) {
  std::FILE* f = std::tmpfile();
  zt::log::set_stream(f);
  try {
    fn();
  } catch (...) {
    zt::log::set_stream(nullptr);
    std::fclose(f);
    throw;
  }
  zt::log::set_stream(nullptr);
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  std::fclose(f);
  return out;
}

TEST(CheckpointSamples, GlobalSamplesStayExactAcrossAResumeAtAnotherBatchSize) {
  auto world = zt::comm::world_group();
  const int64_t w = world->size();
  TempDir dir(world);
  {
    torch::manual_seed(7);
    Net m;
    auto e = engine_for(m, config(1, "fp32", 2), world);  // train_batch_size = 2 x 2 x w
    train(*e, m, 0, 3);
    EXPECT_EQ(e->global_samples(), 3 * 4 * w);
    EXPECT_EQ(e->last_report().samples, 3 * 4 * w);
    e->save_checkpoint(dir.path, "s3");
  }
  const auto m3 = nlohmann::json::parse(zt::ckpt::read_text_file(dir.path + "/s3/manifest.json"));
  EXPECT_EQ(m3.at("counters").value("global_samples", int64_t{-1}), 3 * 4 * w);
  // Resume at gas 4 and micro 3: train_batch_size 12w. Steps 4 and 5 add 12w each.
  int64_t saved_after_5 = 0;
  {
    torch::manual_seed(99);
    Net m;
    auto e = engine_for(m, config(1, "fp32", 4, /*micro=*/3), world);
    e->load_checkpoint(dir.path);
    EXPECT_EQ(e->global_samples(), 12 * w) << "as saved, not global_steps x the new batch (36w)";
    train(*e, m, 3, 5);
    EXPECT_EQ(e->global_steps(), 5);
    EXPECT_EQ(e->global_samples(), 12 * w + 2 * 12 * w);
    EXPECT_EQ(e->last_report().samples, 36 * w);
    EXPECT_EQ(e->last_report().to_json().value("samples", int64_t{-1}), 36 * w);  // the metrics line
    e->save_checkpoint(dir.path, "s5");
    saved_after_5 = e->global_samples();
  }
  // And back to gas 1, micro 2 (train_batch_size 2w): the count saved at step 5 goes on.
  {
    torch::manual_seed(99);
    Net m;
    auto e = engine_for(m, config(1, "fp32", 1), world);
    e->load_checkpoint(dir.path);
    EXPECT_EQ(e->global_samples(), saved_after_5);
    train(*e, m, 5, 6);
    EXPECT_EQ(e->global_samples(), 36 * w + 2 * w);
  }
  // A checkpoint written before global_samples was stored: derived, with a log line.
  world->barrier();  // every rank has read the manifests before rank 0 rewrites one
  if (world->rank() == 0) {
    auto old = m3;
    old["counters"].erase("global_samples");
    std::ofstream(dir.path + "/s3/manifest.json", std::ios::trunc) << old.dump(1);
  }
  world->barrier();
  {
    torch::manual_seed(99);
    Net m;
    auto e = engine_for(m, config(1, "fp32", 4, /*micro=*/3), world);
    const std::string log = logged_by([&] { e->load_checkpoint(dir.path, "s3"); });
    EXPECT_EQ(e->global_samples(), 3 * 12 * w) << "global_steps x the loading run's train_batch_size";
    if (world->rank() == 0) {
      EXPECT_TRUE(has(log, "has no global_samples")) << log;
      EXPECT_TRUE(has(log, "global_steps 3 x train_batch_size " + std::to_string(12 * w))) << log;
    }
    train(*e, m, 3, 4);
    EXPECT_EQ(e->global_samples(), 4 * 12 * w);
  }
}

// ---------------------------------------------------------------------------------------
// Asynchronous save: the snapshot is the state at the call, whatever training does while
// the writer runs; the files equal a synchronous save's; writer errors name the file.

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Releases a writer held by the test hook and removes the hook, even when a check fails.
struct HookGuard {
  std::atomic<bool> go{false};
  ~HookGuard() {
    go = true;
    zt::ckpt::testing::set_before_shard_write(nullptr);
  }
};

// Fresh engine (other init seed), load DIR, train [from, to): losses and fp32 master.
std::pair<std::vector<double>, std::vector<torch::Tensor>> resume_from(const std::string& dir, const nlohmann::json& cfg,
                                                                       const zt::comm::GroupPtr& world, int from,
                                                                       int to) {
  torch::manual_seed(99);
  Net m;
  auto e = engine_for(m, cfg, world);
  e->load_checkpoint(dir);
  EXPECT_EQ(e->global_steps(), from);
  auto losses = train(*e, m, from, to);
  return {losses, e->gather_master_params()};
}

TEST(CheckpointAsync, SameFilesAsSynchronousSave) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, config(2, "fp32", 1), world);
  train(*e, m, 0, 3);
  e->save_checkpoint(dir.path + "/sync", "k", {{"note", 1}});
  EXPECT_FALSE(e->last_checkpoint_save().async);
  e->save_checkpoint(dir.path + "/async", "k", {{"note", 1}}, /*async=*/true);
  EXPECT_TRUE(e->checkpoint_pending());
  e->wait_checkpoint();
  EXPECT_FALSE(e->checkpoint_pending());
  const auto& r = e->last_checkpoint_save();
  EXPECT_TRUE(r.async);
  EXPECT_EQ(r.index, 2);
  EXPECT_EQ(r.step, 3);
  world->barrier();
  char name[64];
  std::snprintf(name, sizeof name, "/k/rank_%05d.safetensors", world->rank());
  EXPECT_EQ(file_bytes(dir.path + "/sync" + name), file_bytes(dir.path + "/async" + name)) << name;
  EXPECT_EQ(file_bytes(dir.path + "/sync/k/manifest.json"), file_bytes(dir.path + "/async/k/manifest.json"));
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/async/latest"), "k");
  const auto cfg = config(2, "fp32", 1);
  auto a = resume_from(dir.path + "/async", cfg, world, 3, 5);
  auto b = resume_from(dir.path + "/sync", cfg, world, 3, 5);
  EXPECT_EQ(a.first, b.first);
  expect_equal(a.second, b.second, "master after resuming from the async save");
}

// Save asynchronously at step k while the writer is held back, train three more steps
// (fp16: the loss scale moves), then let it write: the checkpoint holds step k and
// resumes exactly like a synchronous save at step k of an identical run.
TEST(CheckpointAsync, TrainingContinuesDuringTheWrite) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const auto cfg = config(2, "fp16", 1);
  {
    HookGuard hold;
    zt::ckpt::testing::set_before_shard_write([&](const std::string&) {
      while (!hold.go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    torch::manual_seed(7);
    Net m;
    auto e = engine_for(m, cfg, world);
    train(*e, m, 0, 3);
    e->save_checkpoint(dir.path + "/async", "", {}, /*async=*/true);
    train(*e, m, 3, 6);  // each step polls: not done yet
    EXPECT_TRUE(e->checkpoint_pending());
    EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/async/latest"));
    hold.go = true;
    e->wait_checkpoint();
    EXPECT_EQ(e->last_checkpoint_save().step, 3);
    EXPECT_EQ(e->last_checkpoint_save().published_step, 6);
  }
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/async/latest"), "global_step3");
  {
    torch::manual_seed(7);
    Net m;
    auto e = engine_for(m, cfg, world);
    train(*e, m, 0, 3);
    e->save_checkpoint(dir.path + "/sync");
  }
  auto a = resume_from(dir.path + "/async", cfg, world, 3, 5);
  auto b = resume_from(dir.path + "/sync", cfg, world, 3, 5);
  EXPECT_EQ(a.first, b.first);
  expect_equal(a.second, b.second, "master after resuming from the async save");
}

// The last rank's file cannot be created (a directory is in the way of its .tmp name):
// the error is thrown on every rank by the call that publishes, naming the file, and
// `latest` is not written; the engine saves again afterwards.
TEST(CheckpointAsync, WriterErrorSurfacesNamingTheFile) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const int victim = world->size() - 1;
  HookGuard guard;
  zt::ckpt::testing::set_before_shard_write([&](const std::string& path) {
    if (world->rank() == victim) zt::ckpt::make_dirs(path + ".tmp");
  });
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, config(1, "fp32", 1), world);
  train(*e, m, 0, 1);
  e->save_checkpoint(dir.path, "t", {}, /*async=*/true);  // returns: the write fails later
  std::string err;
  try {
    train(*e, m, 1, 2);  // may publish (and throw) at its step boundary
    e->wait_checkpoint();
  } catch (const zt::CheckpointError& ex) {
    err = ex.what();
  }
  zt::ckpt::testing::set_before_shard_write(nullptr);
  char name[64];
  std::snprintf(name, sizeof name, "/.t.partial/rank_%05d.safetensors", victim);
  EXPECT_TRUE(has(err, dir.path + name)) << err;
  EXPECT_TRUE(has(err, "asynchronous save of checkpoint 't'")) << err;
  EXPECT_FALSE(e->checkpoint_pending());
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/latest"));
  e->save_checkpoint(dir.path, "t2", {}, /*async=*/true);
  e->wait_checkpoint();
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "t2");
}

// [Failed Previous Save] save_checkpoint after an asynchronous save whose write failed
// (ZT_CKPT_TEST_FAIL on the last rank): the new save is taken (sync: written, published,
// loadable; async: in flight, published by wait_checkpoint), then the previous failure is
// thrown on every rank, saying what became of the new save. An error of the new save itself
// carries the previous one along.
struct FailEnvGuard {
  explicit FailEnvGuard(const std::string& spec) { ::setenv("ZT_CKPT_TEST_FAIL", spec.c_str(), 1); }
  ~FailEnvGuard() { ::unsetenv("ZT_CKPT_TEST_FAIL"); }
};

std::string save_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const zt::CheckpointError& ex) {
    return ex.what();
  }
  return "";
}

TEST(CheckpointAsync, SaveAfterAFailedAsyncSaveIsTakenThenThrowsThePreviousFailure) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const int victim = world->size() - 1;
  const auto cfg = config(1, "fp32", 1);
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, cfg, world);
  train(*e, m, 0, 2);
  {
    // Synchronous save after the failed one.
    FailEnvGuard fail("a:" + std::to_string(victim));
    e->save_checkpoint(dir.path, "a", {}, /*async=*/true);
    const std::string err = save_error([&] { e->save_checkpoint(dir.path, "b", {{"k", 2}}); });
    EXPECT_TRUE(has(err, "asynchronous save of checkpoint 'a'")) << err;
    EXPECT_TRUE(has(err, "injected by ZT_CKPT_TEST_FAIL")) << err;
    EXPECT_TRUE(has(err, "this call's checkpoint 'b' in '" + dir.path + "' was saved and published")) << err;
  }
  EXPECT_FALSE(e->checkpoint_pending());
  EXPECT_EQ(e->last_checkpoint_save().tag, "b");
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "b");
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/a"));
  world->barrier();
  EXPECT_FALSE(zt::ckpt::path_exists(dir.path + "/.a.partial")) << "the failed save's files are removed";
  {
    // Asynchronous save after the failed one: started, in flight, published by the wait.
    FailEnvGuard fail("c:" + std::to_string(victim));
    train(*e, m, 2, 3);
    e->save_checkpoint(dir.path, "c", {}, /*async=*/true);
    const std::string err = save_error([&] { e->save_checkpoint(dir.path, "d", {}, /*async=*/true); });
    EXPECT_TRUE(has(err, "asynchronous save of checkpoint 'c'")) << err;
    EXPECT_TRUE(has(err, "this call's asynchronous save of checkpoint 'd' in '" + dir.path + "' was started and is in flight"))
        << err;
    EXPECT_TRUE(e->checkpoint_pending());
    e->wait_checkpoint();  // d's write succeeds
  }
  EXPECT_EQ(e->last_checkpoint_save().tag, "d");
  EXPECT_EQ(e->last_checkpoint_save().step, 3);
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "d");
  {
    // The new save fails too (its last rank's file is blocked): its error, then the previous.
    FailEnvGuard fail("e:" + std::to_string(victim));
    HookGuard guard;
    zt::ckpt::testing::set_before_shard_write([&](const std::string& path) {
      if (world->rank() == victim && has(path, "/.f.partial/")) zt::ckpt::make_dirs(path + ".tmp");
    });
    e->save_checkpoint(dir.path, "e", {}, /*async=*/true);
    const std::string err = save_error([&] { e->save_checkpoint(dir.path, "f"); });
    EXPECT_TRUE(has(err, "/.f.partial/")) << err;
    EXPECT_TRUE(has(err, "before it, the previous asynchronous save failed")) << err;
    EXPECT_TRUE(has(err, "asynchronous save of checkpoint 'e'")) << err;
  }
  EXPECT_FALSE(e->checkpoint_pending());
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "d");
  // b and d load and continue like the run that wrote them (b at step 2, d at step 3).
  const auto want = train(*e, m, 3, 4);
  auto from_d = resume_from(dir.path, cfg, world, 3, 4);
  EXPECT_EQ(from_d.first, want);
  torch::manual_seed(99);
  Net mb;
  auto eb = engine_for(mb, cfg, world);
  EXPECT_EQ(eb->load_checkpoint(dir.path, "b").value("k", 0), 2);
  EXPECT_EQ(eb->global_steps(), 2);
}

// [Failed Previous Save] on load: load_checkpoint while a failed asynchronous save is in
// flight loads the requested checkpoint (the engine continues exactly like the run that
// saved it) and then throws the failure on every rank, saying that the load succeeded. A
// load that fails as well carries the previous failure. Before: it threw without loading.
TEST(CheckpointAsync, LoadAfterAFailedAsyncSaveLoadsThenThrowsThePreviousFailure) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  const int victim = world->size() - 1;
  const auto cfg = config(1, "fp32", 1);
  torch::manual_seed(7);
  Net m;
  auto e = engine_for(m, cfg, world);
  train(*e, m, 0, 2);
  e->save_checkpoint(dir.path, "good", {{"k", 5}});
  const auto want = train(*e, m, 2, 4);
  {
    FailEnvGuard fail("bad:" + std::to_string(victim));
    e->save_checkpoint(dir.path, "bad", {}, /*async=*/true);
    const std::string err = save_error([&] { e->load_checkpoint(dir.path, "good"); });
    EXPECT_TRUE(has(err, "asynchronous save of checkpoint 'bad'")) << err;
    EXPECT_TRUE(has(err, "injected by ZT_CKPT_TEST_FAIL")) << err;
    EXPECT_TRUE(has(err, "this call's load of checkpoint 'good' from '" + dir.path + "' succeeded")) << err;
  }
  EXPECT_FALSE(e->checkpoint_pending());
  EXPECT_EQ(e->global_steps(), 2);
  EXPECT_EQ(zt::ckpt::read_text_file(dir.path + "/latest"), "good");
  EXPECT_EQ(train(*e, m, 2, 4), want) << "the load restored step 2's state (parameters, optimizer, RNG)";
  {
    // The load fails too (no such tag): its error, then the previous failure.
    FailEnvGuard fail("bad2:" + std::to_string(victim));
    e->save_checkpoint(dir.path, "bad2", {}, /*async=*/true);
    const std::string err = save_error([&] { e->load_checkpoint(dir.path, "missing"); });
    EXPECT_TRUE(has(err, "missing")) << err;
    EXPECT_TRUE(has(err, "before it, the previous asynchronous save failed")) << err;
    EXPECT_TRUE(has(err, "asynchronous save of checkpoint 'bad2'")) << err;
  }
  EXPECT_FALSE(e->checkpoint_pending());
  EXPECT_EQ(e->load_checkpoint(dir.path).value("k", 0), 5);  // nothing left to report: a plain load
  EXPECT_EQ(e->global_steps(), 2);
}

}  // namespace

}  // namespace zt_test_checkpoint

// Checkpoint keys with shard coordinates ([Shard Keys] in src/ckpt/shard_coords.h), with
// real ranks (CPU, MPI), at world 1, 2 and 4:
//  * a checkpoint of format version 1 (before coordinates: tests/fixtures/ckpt_v1, written
//    by 2 ranks at stage 1) still loads, to exactly its stored values;
//  * a checkpoint whose parameters carry coordinates (tensor-parallel shard, pipeline
//    stage, expert) round-trips: resume is bit-identical to an uninterrupted run;
//  * loading a parameter at coordinates the checkpoint does not hold is a CheckpointError
//    naming the tensor and both layouts, not a silent load of another shard.
// The engine does not pass coordinates yet (every parameter at tp 1, stage 0, dense), so
// the tests set them with ckpt::testing::set_shard_layout.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckpt/engine_checkpoint.h"
#include "ckpt/fs.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace zt_test_checkpoint_shards {

namespace {

using zt::ckpt::ShardCoord;
using zt::ckpt::ShardLayout;

// The model of tests/dist/test_checkpoint.cpp (the fixture was written with it).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
    offset = register_buffer("offset", torch::zeros({4}));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::tanh(fc1(x))))) + offset.to(x.dtype()); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::Tensor offset;
};
TORCH_MODULE(Net);

constexpr int64_t kMicro = 2;

nlohmann::json config(int stage) {
  return {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"scheduler",
       {{"type", "WarmupLR"}, {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 1e-2}, {"warmup_num_steps", 8}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 200}, {"allgather_bucket_size", 300}}},
  };
}

std::unique_ptr<zt::Engine> engine_for(Net& m, int stage, const zt::comm::GroupPtr& group) {
  auto cfg = zt::Config::from_json(config(stage), group->size());
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  o.group = group;
  return zt::initialize(m.ptr(), cfg, o);
}

// Optimizer steps [from, to) on global batches split over the ranks, with input noise
// from the default CPU generator (so a resume also needs the RNG state). Mean losses.
std::vector<double> train(zt::Engine& e, Net& m, int from, int to) {
  const int world = e.group()->size(), rank = e.group()->rank();
  const int64_t global = kMicro * 4, per_rank = global / world;
  std::vector<double> losses;
  for (int s = from; s < to; ++s) {
    auto [x, y] = zt::test_support::global_batch(s, global);
    auto xb = x.narrow(0, rank * per_rank, per_rank);
    xb = xb + 0.05 * torch::randn_like(xb);
    auto yb = y.narrow(0, rank * per_rank, per_rank);
    auto loss = e.forward([&] { return torch::mse_loss(m->forward(xb), yb); });
    e.backward(loss);
    e.step();
    losses.push_back(e.last_report().loss);
  }
  return losses;
}

void expect_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << what << " tensor " << i;
}

struct TempDir : zt::test_support::SharedTempDir {
  explicit TempDir(zt::comm::GroupPtr g) : SharedTempDir(std::move(g), "ckpt_shards") {}
};

// Sets the layout the checkpoint code uses for the test's lifetime.
struct WithLayout {
  explicit WithLayout(ShardLayout l) { zt::ckpt::testing::set_shard_layout(std::move(l)); }
  ~WithLayout() { zt::ckpt::testing::set_shard_layout(std::nullopt); }
};

// fc1.weight: tensor-parallel shard 1 of 2 (rows); fc2.bias: expert 3; fc3.weight:
// pipeline stage 1. (The shapes stay whole: the layer is not really split here; the test
// is about the keys.)
ShardLayout mixed_layout() {
  ShardLayout l;
  l.params["fc1.weight"] = ShardCoord{.tp_rank = 1, .tp_size = 2, .tp_dim = 0};
  l.params["fc2.bias"] = ShardCoord{.expert = 3};
  l.params["fc3.weight"] = ShardCoord{.pp_stage = 1};
  return l;
}

std::string load_error(const std::string& dir, const zt::comm::GroupPtr& world) {
  torch::manual_seed(5);
  Net m;
  auto e = engine_for(m, 1, world);
  try {
    e->load_checkpoint(dir);
  } catch (const zt::CheckpointError& ex) {
    return ex.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const std::string kFixture = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/ckpt_v1";

// Format version 1 (no coordinates) loads: every trained parameter's fp32 master equals
// the fixture's stored value (read straight from its files), the counters are restored,
// and training goes on.
TEST(CheckpointShards, VersionOneFixtureLoads) {
  auto world = zt::comm::world_group();
  const nlohmann::json m = zt::ckpt::read_manifest(kFixture, "");
  ASSERT_EQ(m.at("version"), 1) << "the fixture must stay in the old format";
  for (const auto& p : m.at("params")) ASSERT_FALSE(p.contains("shard")) << p.dump();
  for (int stage : {1, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    torch::manual_seed(11);
    Net net;
    auto e = engine_for(net, stage, world);
    e->load_checkpoint(kFixture);
    EXPECT_EQ(e->global_steps(), m.at("counters").at("global_steps").get<int64_t>());
    zt::ckpt::ConsolidatedReader reader(kFixture, "");
    std::vector<torch::Tensor> stored;
    for (const auto& name : reader.param_names()) stored.push_back(reader.param(name));
    expect_equal(e->gather_master_params(), stored, "master params from the v1 fixture");
    EXPECT_TRUE(torch::equal(net->offset, reader.extra("offset"))) << "the buffer from the v1 fixture";
    auto more = train(*e, net, 3, 4);
    EXPECT_TRUE(std::isfinite(more.at(0)));
  }
}

// The "kind/name" of every tensor key in a checkpoint's files (without the /BEGIN range).
std::set<std::string> key_prefixes(const nlohmann::json& manifest) {
  std::set<std::string> k;
  for (const auto& f : manifest.at("files")) {
    for (const auto& [key, meta] : f.at("tensors").items()) k.insert(key.substr(0, key.rfind('/')));
  }
  return k;
}

// The default layout adds nothing to the keys: a new save holds the same tensor keys as
// the version-1 fixture of the same model (and "shard" entries at the default).
TEST(CheckpointShards, DefaultLayoutKeepsVersionOneKeys) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  torch::manual_seed(7);
  Net net;
  auto e = engine_for(net, 1, world);
  train(*e, net, 0, 1);
  e->save_checkpoint(dir.path, "t");
  const nlohmann::json now = zt::ckpt::read_manifest(dir.path, "t");
  EXPECT_EQ(now.at("version"), zt::ckpt::kVersion);
  for (const auto& p : now.at("params")) EXPECT_EQ(p.at("shard"), zt::ckpt::to_json(ShardCoord{})) << p.dump();
  const auto now_keys = key_prefixes(now), old_keys = key_prefixes(zt::ckpt::read_manifest(kFixture, ""));
  EXPECT_EQ(now_keys, old_keys);
  EXPECT_TRUE(now_keys.count("master/fc1.weight")) << "default coordinates add nothing to the key";
}

// Coordinates round-trip: saved with the mixed layout, loaded with it, resume is
// bit-identical to an uninterrupted run; the keys and the manifest carry the coordinates.
TEST(CheckpointShards, CoordinatesRoundTrip) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  WithLayout layout(mixed_layout());
  constexpr int kN = 4, kK = 2;
  torch::manual_seed(7);
  Net straight_m;
  auto straight = engine_for(straight_m, 1, world);
  auto straight_losses = train(*straight, straight_m, 0, kN);
  torch::manual_seed(7);
  Net first_m;
  auto first = engine_for(first_m, 1, world);
  auto losses = train(*first, first_m, 0, kK);
  first->save_checkpoint(dir.path, "coords");
  first.reset();

  const nlohmann::json man = zt::ckpt::read_manifest(dir.path, "coords");
  std::map<std::string, nlohmann::json> shard;
  for (const auto& p : man.at("params")) shard[p.at("name").get<std::string>()] = p.at("shard");
  EXPECT_EQ(shard["fc1.weight"], zt::ckpt::to_json(mixed_layout().params["fc1.weight"]));
  EXPECT_EQ(shard["fc2.bias"].at("expert"), 3);
  EXPECT_EQ(shard["fc3.weight"].at("pp_stage"), 1);
  EXPECT_EQ(shard["fc1.bias"], zt::ckpt::to_json(ShardCoord{}));
  const std::set<std::string> keys = key_prefixes(man);
  for (const char* key : {"master/fc1.weight[tp1of2d0]", "exp_avg/fc2.bias[ex3]", "exp_avg_sq/fc3.weight[pp1]",
                          "master/fc1.bias"}) {
    EXPECT_TRUE(keys.count(key)) << key << " missing from the shard files";
  }
  EXPECT_FALSE(keys.count("master/fc1.weight")) << "a tp shard's key must not look like the whole parameter's";

  torch::manual_seed(99);
  Net resumed_m;
  auto resumed = engine_for(resumed_m, 1, world);
  resumed->load_checkpoint(dir.path, "coords");
  auto more = train(*resumed, resumed_m, kK, kN);
  losses.insert(losses.end(), more.begin(), more.end());
  EXPECT_EQ(losses, straight_losses);
  expect_equal(resumed->gather_master_params(), straight->gather_master_params(), "master params");
}

// A parameter held only at other coordinates than this rank's: a CheckpointError naming
// the tensor and both layouts, on every rank, before any state changes.
TEST(CheckpointShards, CoordinateMismatchNamesTheTensor) {
  auto world = zt::comm::world_group();
  TempDir dir(world);
  {
    WithLayout layout(mixed_layout());
    torch::manual_seed(7);
    Net net;
    auto e = engine_for(net, 1, world);
    train(*e, net, 0, 1);
    e->save_checkpoint(dir.path, "coords");
  }
  // Today's default layout cannot take a tp shard as the whole parameter.
  std::string err = load_error(dir.path, world);
  EXPECT_TRUE(has(err, "'fc1.weight'")) << err;
  EXPECT_TRUE(has(err, "tp rank 1 of 2 (dim 0)")) << err;
  EXPECT_TRUE(has(err, "not tensor-parallel, pipeline stage 0, dense")) << "the layout this rank needs: " << err;
  EXPECT_TRUE(has(err, "not supported yet")) << err;

  // Another tp rank of the same split: not this rank's shard.
  {
    ShardLayout other = mixed_layout();
    other.params["fc1.weight"].tp_rank = 0;
    WithLayout layout(other);
    err = load_error(dir.path, world);
    EXPECT_TRUE(has(err, "'fc1.weight'")) << err;
    EXPECT_TRUE(has(err, "tp rank 0 of 2")) << err;
  }
  // Another pipeline stage, another expert.
  {
    ShardLayout other = mixed_layout();
    other.params["fc3.weight"].pp_stage = 0;
    WithLayout layout(other);
    err = load_error(dir.path, world);
    EXPECT_TRUE(has(err, "'fc3.weight'") && has(err, "pipeline stage 1")) << err;
  }
  {
    ShardLayout other = mixed_layout();
    other.params["fc2.bias"].expert = 2;
    WithLayout layout(other);
    err = load_error(dir.path, world);
    EXPECT_TRUE(has(err, "'fc2.bias'") && has(err, "expert 3") && has(err, "expert 2")) << err;
  }
  // And the other way: a default-layout (version-1) checkpoint asked for a tp shard.
  {
    ShardLayout want;
    want.params["fc2.weight"] = ShardCoord{.tp_rank = 0, .tp_size = 4, .tp_dim = 1};
    WithLayout layout(want);
    err = load_error(kFixture, world);
    EXPECT_TRUE(has(err, "'fc2.weight'") && has(err, "tp rank 0 of 4 (dim 1)")) << err;
  }
  // Inconsistent coordinates are refused at save time, naming the parameter.
  {
    ShardLayout bad;
    bad.params["fc1.bias"] = ShardCoord{.tp_rank = 2, .tp_size = 2, .tp_dim = 0};
    WithLayout layout(bad);
    torch::manual_seed(7);
    Net net;
    auto e = engine_for(net, 1, world);
    try {
      e->save_checkpoint(dir.path, "bad");
      ADD_FAILURE() << "a tp rank out of range must be refused";
    } catch (const zt::CheckpointError& ex) {
      EXPECT_TRUE(has(ex.what(), "'fc1.bias'") && has(ex.what(), "rank 2 of 2")) << ex.what();
    }
  }
}

}  // namespace

}  // namespace zt_test_checkpoint_shards

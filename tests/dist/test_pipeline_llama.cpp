// Pipelined Llama on CPU ranks ([Llama Pipeline] in src/pipe/llama_pipe.h): a tiny Llama
// (4 decoder layers, d 64, 4 query heads over 2 key/value heads (GQA), SwiGLU 128, V 256,
// fp32; untied LM head, and tied in some cases) cut into 2 or 4 stages over 1 or 2
// data-parallel ranks, with every schedule, must train as the non-pipelined engine does on
// the same data: the loss of every step and every parameter after 5 AdamW steps, the tied
// copy identical to the first stage's embedding, eval_batch the model's loss. Targets hold
// some -100 (HF's ignore_index), which the head must ignore as Llama::loss does. A Llama
// pipeline checkpoint (pp 2) loads into the non-pipelined engine by the HF names.
//
// Tolerances are tests/dist/test_pipeline.cpp's, for the same reason (the same fp32 math
// summed in other groupings, amplified through 5 Adam steps at lr 1e-3): losses within 1e-5
// relative, parameters within 2e-5 absolute + 1e-4 relative. A stage that drops RoPE, a
// micro-batch, a stage's gradient or the tied gradient misses by orders of magnitude.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "models/llama.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "support/dist_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "support/pipeline_test_util.h"

namespace zt::pipe {
namespace test_pipeline_llama {
namespace {

constexpr int kLlamaPipeSteps = 5;
constexpr int64_t kLlamaPipeMicro = 2, kLlamaPipeSeq = 16;

models::LlamaConfig llama_pipe_tiny(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // GQA
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

struct LlamaPipeCase {
  const char* name;
  int pp, dp;
  const char* schedule;
  int virtual_stages;
  int zero_stage;
  int gas;
  double clip;
  bool tied = false;
  int ckpt_interval = 0;
  const char* partition = nullptr;  // pipeline.partition; default "parameters"
};

nlohmann::json llama_pipe_json(const LlamaPipeCase& c, bool pipeline) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kLlamaPipeMicro},
      {"gradient_accumulation_steps", c.gas},
      {"gradient_clipping", c.clip},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}},
      {"zero_optimization", {{"stage", c.zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000}}},
  };
  if (pipeline) {
    j["pipeline"] = {{"stages", c.pp}, {"schedule", c.schedule}};
    if (c.virtual_stages > 1) j["pipeline"]["virtual_stages"] = c.virtual_stages;
    if (c.ckpt_interval > 0) j["pipeline"]["activation_checkpoint_interval"] = c.ckpt_interval;
    if (c.partition) j["pipeline"]["partition"] = c.partition;
  }
  return j;
}

// Micro-batch `i` of step `step` on data-parallel rank `dp`: random tokens, next-token
// targets, the first target of each row -100 (ignored).
MicroBatch llama_pipe_micro(int step, int i, int dp) {
  auto [idx, targets] = test_support::seeded_tokens(static_cast<uint64_t>(1000 * step + 10 * i + dp + 7),
                                                    kLlamaPipeMicro, kLlamaPipeSeq, 256, -100);
  return {idx, targets};
}

comm::GroupPtr llama_pipe_world() { return test_support::pipe_test_world(); }

comm::GroupPtr llama_pipe_group(int n) { return test_support::consecutive_ranks(n); }

struct LlamaPipeReference {
  std::vector<double> losses;
  std::map<std::string, torch::Tensor> params;
  double eval = 0, moved = 0;
};

// The non-pipelined engine over the same data-parallel ranks and data.
LlamaPipeReference llama_pipe_reference(const LlamaPipeCase& c, const comm::GroupPtr& dp, int dp_rank) {
  torch::manual_seed(11);
  models::LlamaForCausalLM model(llama_pipe_tiny(c.tied));
  auto cfg = Config::from_json(llama_pipe_json(c, false), dp->size());
  EngineOptions o;
  o.group = dp;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  std::vector<torch::Tensor> init;
  for (const auto& p : model->parameters()) init.push_back(p.detach().clone());
  auto engine = initialize(model.ptr(), cfg, o);
  LlamaPipeReference r;
  for (int s = 0; s < kLlamaPipeSteps; ++s) {
    double sum = 0;
    for (int i = 0; i < c.gas; ++i) {
      auto mb = llama_pipe_micro(s, i, dp_rank);
      auto loss = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
      sum += loss.item<double>();
      engine->backward(loss);
    }
    EXPECT_TRUE(engine->step());
    r.losses.push_back(sum / c.gas);
  }
  for (const auto& kv : model->named_parameters()) r.params[kv.key()] = kv.value().detach().clone();
  const auto now = model->parameters();
  for (size_t i = 0; i < init.size(); ++i) r.moved = std::max(r.moved, (now[i].detach() - init[i]).abs().max().item<double>());
  torch::NoGradGuard ng;
  for (int i = 0; i < c.gas; ++i) {
    auto mb = llama_pipe_micro(kLlamaPipeSteps, i, dp_rank);
    r.eval += model->loss(mb.idx, mb.targets).item<double>() / c.gas;
  }
  return r;
}

class LlamaPipelineEquivalence : public ::testing::TestWithParam<LlamaPipeCase> {};

TEST_P(LlamaPipelineEquivalence, MatchesTheNonPipelinedEngine) {
  const LlamaPipeCase& c = GetParam();
  const int need = c.pp * c.dp, have = llama_pipe_world()->size();
  if (have < need || have % need != 0) {
    GTEST_SKIP() << c.name << " needs a multiple of " << need << " ranks (pp " << c.pp << " x dp " << c.dp
                 << "); this run has " << have;
  }
  auto group = llama_pipe_group(need);
  parallel::Topology topo(group, parallel::ParallelDims::make(need, c.dp, 1, c.pp));
  const int dp_rank = topo.coords().dp;

  auto pc = pipeline_config(llama_pipe_json(c, true), need, c.name);
  torch::manual_seed(11);
  models::LlamaForCausalLM full(llama_pipe_tiny(c.tied));
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  PipeEngine pipe(full, pc, topo, po);
  // The stage holds the head's weight as an ordinary parameter when untied, a tied copy
  // (not a parameter) when tied and the embedding is elsewhere.
  const bool last = pipe.stage() == c.pp - 1;
  bool has_lm_head = false;
  for (const auto& kv : pipe.module()->named_parameters()) has_lm_head |= kv.key() == "lm_head.weight";
  EXPECT_EQ(has_lm_head, last && !c.tied) << c.name;
  EXPECT_EQ(pipe.module()->holds_tied_copy(), last && c.tied && c.pp > 1) << c.name;
  EXPECT_EQ(pipe.module()->holds_embedding(), pipe.stage() == 0 && c.tied) << c.name;

  std::vector<double> losses;
  for (int s = 0; s < kLlamaPipeSteps; ++s) {
    int i = 0;
    losses.push_back(pipe.train_batch([&] { return llama_pipe_micro(s, i++, dp_rank); }));
  }
  const LlamaPipeReference ref = llama_pipe_reference(c, topo.dp(), dp_rank);
  const double loss_rtol = 1e-5, rtol = 1e-4, atol = 2e-5;
  double worst_loss = 0, worst_param = 0;
  for (int s = 0; s < kLlamaPipeSteps; ++s) {
    const double want = ref.losses[static_cast<size_t>(s)];
    EXPECT_NEAR(losses[static_cast<size_t>(s)], want, loss_rtol * std::abs(want)) << c.name << " step " << s;
    worst_loss = std::max(worst_loss, std::abs(losses[static_cast<size_t>(s)] - want) / std::abs(want));
  }
  EXPECT_GT(ref.moved, 1e-3) << c.name;
  int compared = 0;
  for (const auto& kv : pipe.module()->named_parameters()) {
    auto it = ref.params.find(kv.key());
    ASSERT_NE(it, ref.params.end()) << kv.key();
    const auto diff = (kv.value().detach() - it->second).abs().max().item<double>();
    worst_param = std::max(worst_param, diff);
    EXPECT_TRUE(torch::allclose(kv.value().detach(), it->second, rtol, atol))
        << c.name << " stage " << pipe.stage() << " " << kv.key() << " max diff " << diff;
    ++compared;
  }
  EXPECT_GT(compared, 0);
  // Every parameter of the model is on exactly one stage of a replica.
  auto n = torch::tensor({static_cast<int64_t>(compared)}, torch::kLong);
  topo.pp()->all_reduce(n, comm::ReduceOp::kSum);
  EXPECT_EQ(n.item<int64_t>(), static_cast<int64_t>(ref.params.size())) << c.name;
  if (c.tied && c.pp > 1) {
    auto w = pipe.stage() == 0 ? pipe.module()->embedding_weight().detach().clone() : torch::empty({256, 64});
    topo.pp()->broadcast(w, 0);
    if (pipe.module()->holds_tied_copy()) {
      EXPECT_TRUE(torch::equal(pipe.module()->tied_copy().detach(), w)) << c.name;
      EXPECT_TRUE(torch::allclose(w, ref.params.at("model.embed_tokens.weight"), rtol, atol)) << c.name;
    }
  }
  int i = 0;
  const double eval = pipe.eval_batch([&] { return llama_pipe_micro(kLlamaPipeSteps, i++, dp_rank); });
  EXPECT_NEAR(eval, ref.eval, loss_rtol * ref.eval) << c.name;
  EXPECT_EQ(pipe.engine().global_steps(), kLlamaPipeSteps);
  if (group->rank() == 0) {
    std::printf("[llama pipe] %s: max relative loss difference %.3g, max parameter difference %.3g\n", c.name,
                worst_loss, worst_param);
  }
}

std::string llama_pipe_case_name(const ::testing::TestParamInfo<LlamaPipeCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Schedules, LlamaPipelineEquivalence,
    ::testing::Values(
        // pp 2 x dp 1 (2 ranks): every schedule, untied and tied, checkpointed ranges.
        LlamaPipeCase{"pp2_1f1b_z0", 2, 1, "1f1b", 1, 0, 4, 1.0},
        LlamaPipeCase{"pp2_gpipe_z1_ckpt2_uniform", 2, 1, "gpipe", 1, 1, 4, 0.0, false, 2, "uniform"},
        LlamaPipeCase{"pp2_interleaved_z2", 2, 1, "interleaved", 2, 2, 4, 1.0},
        LlamaPipeCase{"pp2_zbh1_z0_clip", 2, 1, "zb-h1", 1, 0, 4, 0.05},
        LlamaPipeCase{"pp2_1f1b_tied_z1", 2, 1, "1f1b", 1, 1, 4, 1.0, true},
        LlamaPipeCase{"pp2_zbh1_tied_z2", 2, 1, "zb-h1", 1, 2, 4, 1.0, true},
        // pp 2 x dp 2 and pp 4 (4 ranks).
        LlamaPipeCase{"pp2_dp2_1f1b_z2", 2, 2, "1f1b", 1, 2, 4, 1.0},
        LlamaPipeCase{"pp2_dp2_interleaved_tied_z1", 2, 2, "interleaved", 2, 1, 4, 1.0, true},
        LlamaPipeCase{"pp4_1f1b_z1_type", 4, 1, "1f1b", 1, 1, 4, 1.0, false, 0, "type:decoder"},
        LlamaPipeCase{"pp4_gpipe_tied_z0", 4, 1, "gpipe", 1, 0, 4, 0.05, true},
        LlamaPipeCase{"pp4_zbh1_z2", 4, 1, "zb-h1", 1, 2, 4, 1.0}),
    llama_pipe_case_name);

// The partition counts Llama's layers: the embedding and the head each hold V x d (the tied
// head counts the tied weight, as DeepSpeed's TiedLayerSpec), a decoder layer its GQA
// projections, MLP and two norms.
TEST(LlamaPipelineLayers, CountsEveryParameterOnce) {
  for (bool tied : {false, true}) {
    const auto cfg = llama_pipe_tiny(tied);
    const auto layers = llama_layers(cfg);
    ASSERT_EQ(layers.size(), 6u);
    const int64_t d = 64, V = 256, layer = d * 64 + 2 * d * 32 + 64 * d + 3 * d * 128 + 2 * d;
    EXPECT_EQ(layers[0].type, "LlamaEmbedding");
    EXPECT_EQ(layers[0].params, V * d);
    for (int i = 1; i <= 4; ++i) {
      EXPECT_EQ(layers[static_cast<size_t>(i)].type, "LlamaDecoderLayer");
      EXPECT_EQ(layers[static_cast<size_t>(i)].params, layer);
    }
    EXPECT_EQ(layers[5].type, "LlamaHead");
    EXPECT_EQ(layers[5].params, V * d + d);
    int64_t sum = 0;
    for (const auto& l : layers) sum += l.params;
    EXPECT_EQ(sum, models::llama_num_params(cfg) + (tied ? V * d : 0));
  }
}

// [Pipeline Checkpoints] with Llama stages: a pp 2 save (3 steps) holds every parameter once
// under the HF names and loads into the non-pipelined engine, whose next 2 steps match the
// pipeline's within the equivalence tolerance.
TEST(LlamaPipelineCheckpoint, LoadsWithoutAPipeline) {
  auto world = llama_pipe_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto group = llama_pipe_group(2);
  parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 1, 2));
  zt::test_support::SharedTempDir root(world, "llama_pipe_ckpt");
  const std::string dir = root.path + "/copy" + std::to_string(world->rank() / 2);
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    LlamaPipeCase c{"ckpt", 2, 1, "1f1b", 1, 1, 2, 1.0, tied};
    const std::string cdir = dir + (tied ? "/tied" : "/untied");
    std::vector<double> pipe_losses;
    {
      torch::manual_seed(11);
      models::LlamaForCausalLM full(llama_pipe_tiny(tied));
      PipeOptions po;
      po.device = torch::Device(torch::kCPU);
      PipeEngine pipe(full, pipeline_config(llama_pipe_json(c, true), 2), topo, po);
      for (int s = 0; s < 5; ++s) {
        if (s == 3) pipe.save_checkpoint(cdir, "", {{"test", "llama"}});
        int i = 0;
        pipe_losses.push_back(pipe.train_batch([&] { return llama_pipe_micro(s, i++, 0); }));
      }
    }
    // Each rank of the pair loads the whole model without a pipeline (dp 1).
    auto solo = world->split(world->rank(), 0);
    torch::manual_seed(99);  // other initial values: the load must replace them all
    models::LlamaForCausalLM model(llama_pipe_tiny(tied));
    EngineOptions o;
    o.group = solo;
    o.device = torch::Device(torch::kCPU);
    o.print = false;
    auto engine = initialize(model.ptr(), Config::from_json(llama_pipe_json(c, false), 1), o);
    const auto client = engine->load_checkpoint(cdir);
    EXPECT_EQ(client.at("test").get<std::string>(), "llama");
    EXPECT_EQ(engine->global_steps(), 3);
    for (int s = 3; s < 5; ++s) {
      double sum = 0;
      for (int i = 0; i < c.gas; ++i) {
        auto mb = llama_pipe_micro(s, i, 0);
        auto loss = engine->forward([&] { return model->loss(mb.idx, mb.targets); });
        sum += loss.item<double>() / c.gas;
        engine->backward(loss);
      }
      EXPECT_TRUE(engine->step());
      const double want = pipe_losses[static_cast<size_t>(s)];
      EXPECT_NEAR(sum, want, 1e-5 * std::abs(want)) << "step " << s + 1;
    }
    world->barrier();
  }
}

// What a Llama pipeline does not take is named before the first step.
TEST(LlamaPipelineErrors, TensorParallelAndPartitionedModelsAreNamed) {
  auto world = llama_pipe_world();
  if (world->size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto group = llama_pipe_group(2);
  LlamaPipeCase c{"errors", 2, 1, "1f1b", 1, 0, 2, 0.0};
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  {
    // tp 2 x pp 1 topology with a (tp 1) Llama.
    parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 2, 1));
    LlamaPipeCase one{"errors", 1, 1, "1f1b", 1, 0, 2, 0.0};
    auto j = llama_pipe_json(one, true);
    j["tensor_parallel"] = {{"autotp_size", 2}};
    torch::manual_seed(1);
    models::LlamaForCausalLM full(llama_pipe_tiny(false));
    try {
      PipeEngine pipe(full, pipeline_config(j, 2), topo, po);
      ADD_FAILURE() << "tp 2 with a Llama pipeline was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("a pipelined Llama runs at tp 1 only"), std::string::npos) << e.what();
    }
  }
  {
    parallel::Topology topo(group, parallel::ParallelDims::make(2, 1, 1, 2));
    auto cfg = llama_pipe_tiny(false);
    cfg.deferred_init = true;
    torch::manual_seed(1);
    models::LlamaForCausalLM full(cfg);
    try {
      PipeEngine pipe(full, pipeline_config(llama_pipe_json(c, true), 2), topo, po);
      ADD_FAILURE() << "a deferred_init Llama was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("deferred_init false"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace test_pipeline_llama
}  // namespace zt::pipe

// Layers into pipeline stages (src/pipe/partition.h): DeepSpeed's partition_uniform and
// partition_balanced, with expectations computed by DeepSpeed's own Python functions
// (deepspeed/runtime/utils.py, run on these inputs), and the partition_method errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pipe/partition.h"
#include "zerotrain/error.h"

namespace zt::pipe {
namespace test_pipe_partition {
namespace {

using V = std::vector<int>;

TEST(PipePartition, UniformMatchesDeepSpeed) {
  EXPECT_EQ(partition_uniform(10, 4), (V{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(3, 4), (V{0, 1, 2, 3, 3}));
  EXPECT_EQ(partition_uniform(4, 2), (V{0, 2, 4}));
  EXPECT_EQ(partition_uniform(7, 3), (V{0, 3, 5, 7}));
}

TEST(PipePartition, BalancedMatchesDeepSpeed) {
  // GPT-2 tiny's layers: embedding (wte + wpe), 2 blocks, head (ln_f + tied wte).
  const int64_t emb = 65536, blk = 198272, head = 33024;
  EXPECT_EQ(partition_balanced({emb, blk, blk, head}, 2), (V{0, 2, 4}));
  EXPECT_EQ(partition_balanced({emb, blk, blk, head}, 3), (V{0, 1, 2, 4}));
  EXPECT_EQ(partition_balanced({emb, blk, blk, head}, 4), (V{0, 1, 2, 3, 4}));
  const std::vector<int64_t> six{emb, blk, blk, blk, blk, blk, blk, head};
  EXPECT_EQ(partition_balanced(six, 2), (V{0, 4, 8}));
  EXPECT_EQ(partition_balanced(six, 4), (V{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_balanced({0, 1, 1, 1, 1, 1, 1, 0}, 4), (V{0, 3, 5, 6, 8}));
  EXPECT_EQ(partition_balanced({5, 1, 1, 1, 1, 5}, 3), (V{0, 1, 5, 6}));
  EXPECT_EQ(partition_balanced({3, 3, 3, 1}, 2), (V{0, 2, 4}));
}

std::vector<LayerInfo> gpt2_like(int blocks) {
  std::vector<LayerInfo> l{{"GPT2Embedding", 100}};
  for (int i = 0; i < blocks; ++i) l.push_back({"GPT2Block", 300});
  l.push_back({"GPT2Head", 50});
  return l;
}

TEST(PipePartition, Methods) {
  EXPECT_EQ(partition_layers(gpt2_like(6), 4, "uniform"), (V{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_layers(gpt2_like(6), 4, "type:block"), (V{0, 3, 5, 6, 8}));
  EXPECT_EQ(partition_layers(gpt2_like(6), 4, "type:^gpt2b"), (V{0, 3, 5, 6, 8}));
  // "parameters" and DeepSpeed's config default "best" balance the parameter counts.
  EXPECT_EQ(partition_layers(gpt2_like(2), 2, "parameters"), partition_balanced({100, 300, 300, 50}, 2));
  EXPECT_EQ(partition_layers(gpt2_like(2), 2, "best"), partition_layers(gpt2_like(2), 2, "parameters"));
}

// [Compute Partition]: an embedding (lookup) weighs 0, everything else its parameters. The
// Llama-3.2-1B shape: embedding 262.7M (tied head on the last stage: 262.7M + norm), 16
// decoder layers of 60.8M. "parameters" cuts 8 | 8 + head; "compute" 10 | 6 + head.
TEST(PipePartition, ComputeWeighsAnEmbeddingZero) {
  const int64_t emb = 128256LL * 2048, layer = 60821504;
  std::vector<LayerInfo> l{{"LlamaEmbedding", emb, /*lookup=*/true}};
  for (int i = 0; i < 16; ++i) l.push_back({"LlamaDecoderLayer", layer});
  l.push_back({"LlamaHead", emb + 2048});
  EXPECT_EQ(partition_layers(l, 2, "parameters"), (V{0, 9, 18}));
  EXPECT_EQ(partition_layers(l, 2, "compute"), (V{0, 11, 18}));
  EXPECT_EQ(partition_layers(l, 2, "Compute"), partition_layers(l, 2, "compute"));
  // Without a lookup layer it is "parameters"; with one, that layer weighs nothing.
  EXPECT_EQ(partition_layers(gpt2_like(6), 3, "compute"), partition_layers(gpt2_like(6), 3, "parameters"));
  auto g = gpt2_like(6);
  g.front().lookup = true;
  EXPECT_EQ(partition_layers(g, 3, "compute"), partition_balanced({0, 300, 300, 300, 300, 300, 300, 50}, 3));
}

template <typename F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

TEST(PipePartition, BadInputIsANamedError) {
  EXPECT_NE(config_error([] { partition_layers(gpt2_like(1), 4, "parameters"); }).find("more than the model's 3"),
            std::string::npos);
  EXPECT_NE(config_error([] { partition_layers(gpt2_like(2), 2, "profile"); }).find("not a partition method"),
            std::string::npos);
  EXPECT_NE(config_error([] { partition_layers(gpt2_like(2), 2, "type:lstm"); }).find("matches no layer"),
            std::string::npos);
  EXPECT_NE(config_error([] { partition_layers(gpt2_like(2), 2, "type:(("); }).find("does not compile"),
            std::string::npos);
  // One matching layer over 3 stages: DeepSpeed still gives every stage a layer.
  EXPECT_EQ(partition_layers(gpt2_like(6), 3, "type:head"), (V{0, 6, 7, 8}));
}

}  // namespace
}  // namespace test_pipe_partition
}  // namespace zt::pipe

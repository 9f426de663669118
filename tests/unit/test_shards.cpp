// Token shards in llm.c's format (data/shards.h): write/read in both widths, header
// checks, globs, windows over several files, rank partitioning and the vocabulary check.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ckpt/fs.h"
#include "data/shards.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/error.h"

namespace zt_test_shards {

namespace fs = std::filesystem;
using namespace zt::data;

namespace {

fs::path temp_dir(const std::string& tag) {
  auto p = fs::temp_directory_path() / ("zt_shards_" + std::to_string(::getpid()) + "_" + tag);
  zt::ckpt::remove_tree(p);
  fs::create_directories(p);
  return p;
}

std::vector<uint32_t> iota(uint32_t first, size_t n) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i);
  return v;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zt::ConfigError& e) {
    return e.what();
  }
  return "(no ConfigError)";
}

}  // namespace

TEST(Shards, WriteReadBothWidths) {
  const auto d = temp_dir("rw");
  const auto u16 = iota(65000, 500);  // crosses nothing, fits uint16
  const auto u32 = iota(70000, 300);  // needs uint32
  write_shard((d / "a.bin").string(), u16, 2, 65536);
  write_shard((d / "b.bin").string(), u32, 4, 100000);
  const ShardInfo a = read_shard_info((d / "a.bin").string());
  EXPECT_EQ(a.token_bytes, 2);
  EXPECT_EQ(a.num_tokens, 500);
  EXPECT_EQ(a.vocab_size, 65536);
  EXPECT_EQ(fs::file_size(d / "a.bin"), 1024u + 500 * 2);
  // The header is llm.c's: magic, version, count.
  int32_t h[3];
  std::ifstream((d / "b.bin"), std::ios::binary).read(reinterpret_cast<char*>(h), sizeof(h));
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], 300);
  MappedShard ma((d / "a.bin").string()), mb((d / "b.bin").string());
  for (int64_t i = 0; i < 500; ++i) ASSERT_EQ(ma.token(i), u16[static_cast<size_t>(i)]);
  for (int64_t i = 0; i < 300; ++i) ASSERT_EQ(mb.token(i), u32[static_cast<size_t>(i)]);
  EXPECT_THROW(write_shard((d / "c.bin").string(), u32, 2, 0), zt::Error);  // 70000 does not fit uint16
  EXPECT_FALSE(fs::exists(d / "c.bin"));
  zt::ckpt::remove_tree(d);
}

TEST(Shards, BadFilesAreNamed) {
  const auto d = temp_dir("bad");
  const std::string good = (d / "good.bin").string();
  write_shard(good, iota(0, 100), 2, 0);
  // Truncated: one token short.
  fs::copy_file(good, d / "short.bin");
  fs::resize_file(d / "short.bin", 1024 + 99 * 2);
  EXPECT_NE(error_of([&] { read_shard_info((d / "short.bin").string()); }).find("truncated"), std::string::npos);
  std::ofstream((d / "text.bin").string()) << std::string(2000, 'x');
  EXPECT_NE(error_of([&] { read_shard_info((d / "text.bin").string()); }).find("is not a token shard"),
            std::string::npos);
  EXPECT_FALSE(looks_like_shard((d / "text.bin").string()));
  EXPECT_TRUE(looks_like_shard(good));
  EXPECT_FALSE(looks_like_shard((d / "missing.bin").string()));
  zt::ckpt::remove_tree(d);
}

TEST(Shards, GlobIsSortedAndAnEmptyMatchIsAnError) {
  const auto d = temp_dir("glob");
  for (const char* n : {"t_000002.bin", "t_000000.bin", "t_000001.bin", "v_000000.bin"}) {
    write_shard((d / n).string(), iota(0, 10), 2, 0);
  }
  const auto files = expand_glob((d / "t_*.bin").string());
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(fs::path(files[0]).filename(), "t_000000.bin");
  EXPECT_EQ(fs::path(files[2]).filename(), "t_000002.bin");
  EXPECT_NE(error_of([&] { expand_glob((d / "x_*.bin").string()); }).find("no file matches"), std::string::npos);
  zt::ckpt::remove_tree(d);
}

TEST(Shards, WindowsStayWithinTheirFile) {
  const auto d = temp_dir("win");
  write_shard((d / "s_0.bin").string(), iota(0, 10), 2, 0);    // windows of 3: [0..3], [3..6], [6..9]
  write_shard((d / "s_1.bin").string(), iota(100, 8), 2, 0);   // [100..103], [103..106]
  write_shard((d / "s_2.bin").string(), iota(200, 3), 2, 0);   // too short for a window
  ShardDataset ds(expand_glob((d / "s_*.bin").string()), 3);
  EXPECT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.num_tokens(), 21);
  auto vec = [](const torch::Tensor& t) {
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  auto e2 = ds.get(2);
  EXPECT_EQ(vec(e2.x.contiguous()), (std::vector<int64_t>{6, 7, 8}));
  EXPECT_EQ(vec(e2.y.contiguous()), (std::vector<int64_t>{7, 8, 9}));
  auto e3 = ds.get(3);
  EXPECT_EQ(vec(e3.x.contiguous()), (std::vector<int64_t>{100, 101, 102}));
  EXPECT_EQ(vec(ds.get(4).y.contiguous()), (std::vector<int64_t>{104, 105, 106}));
  EXPECT_THROW(ds.get(5), zt::Error);
  EXPECT_EQ(ds.max_token_id(), 202);
  zt::ckpt::remove_tree(d);
}

// Every rank reads only its sampler's windows: disjoint across ranks, together all of them.
TEST(Shards, RanksPartitionTheWindows) {
  const auto d = temp_dir("ranks");
  for (int k = 0; k < 3; ++k) write_shard((d / ("p_" + std::to_string(k) + ".bin")).string(), iota(0, 97), 2, 0);
  ShardDataset ds(expand_glob((d / "p_*.bin").string()), 8);
  ASSERT_EQ(ds.size(), 3 * 12);  // (97 - 1) / 8 = 12 per file
  for (int world : {1, 2, 3, 4}) {
    std::set<int64_t> seen;
    size_t total = 0;
    for (int r = 0; r < world; ++r) {
      DistributedSampler s(ds.size(), r, world, /*shuffle=*/true, /*seed=*/5);
      for (int64_t i : s.indices()) {
        seen.insert(i);
        ++total;
      }
    }
    EXPECT_EQ(total, static_cast<size_t>(ds.size())) << world;  // 36 divides by 1..4: no padding
    EXPECT_EQ(seen.size(), static_cast<size_t>(ds.size())) << world;
  }
  zt::ckpt::remove_tree(d);
}

TEST(Shards, TokensOutsideTheModelVocabularyAreAnError) {
  const auto d = temp_dir("vocab");
  write_shard((d / "v.bin").string(), iota(10, 20), 2, 30);
  ShardDataset ok({(d / "v.bin").string()}, 4, /*model_vocab=*/30);
  EXPECT_EQ(ok.declared_vocab(), 30);
  EXPECT_NO_THROW(ok.get(3));
  ShardDataset small({(d / "v.bin").string()}, 4, /*model_vocab=*/20);
  EXPECT_NO_THROW(small.get(1));  // tokens 14..18
  EXPECT_NE(error_of([&] { small.get(2); }).find("outside the model's vocabulary of 20"), std::string::npos);
  write_shard((d / "w.bin").string(), iota(0, 20), 2, 50);
  EXPECT_NE(error_of([&] { ShardDataset({(d / "v.bin").string(), (d / "w.bin").string()}, 4); })
                .find("different tokenizers"),
            std::string::npos);
  zt::ckpt::remove_tree(d);
}

}  // namespace zt_test_shards

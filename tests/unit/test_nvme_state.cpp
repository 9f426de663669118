// NVMe optimizer state (src/offload/nvme_state.h): the swap-file layout, the pipelined
// pass for every buffer count (values written, updated in place and read back must match
// exactly), the reuse fence before every refill of a staging buffer, errors inside a
// visit, and the claimed swap-file names. Files go to a temp directory under
// ZT_BINARY_DIR (or $ZT_AIO_TEST_DIR, as the aio tests).
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/fs.h"
#include "offload/nvme_state.h"
#include "zerotrain/error.h"

namespace zt_test_nvme_state {

namespace {

using zt::offload::NvmeOptimizerState;
using zt::offload::NvmeStateOptions;
using Mode = NvmeOptimizerState::Mode;
using Staged = NvmeOptimizerState::Staged;

struct Dir {
  Dir() {
    const char* e = std::getenv("ZT_AIO_TEST_DIR");
    std::string templ = std::string(e && *e ? e : ZT_BINARY_DIR) + "/zt_nvme_state_XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + templ);
    path = templ;
  }
  ~Dir() { zt::ckpt::remove_tree(path); }
  std::string path;
};

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

NvmeStateOptions options(const std::string& dir, int64_t buffers, int64_t scratch = 0) {
  NvmeStateOptions o;
  o.dir = dir;
  o.stem = "zerotrain_rank0_optimizer";
  o.buffer_count = buffers;
  o.scratch_bytes_per_element = scratch;
  o.log = [](const std::string&) {};
  return o;
}

// A value per (kind, element, generation) that no other combination produces.
float value(int kind, int64_t i, int gen) { return static_cast<float>(kind * 1000003 + i * 7 + gen * 0.5); }

TEST(NvmeState, SplitAndLayout) {
  EXPECT_EQ(NvmeOptimizerState::split(10, 4), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(NvmeOptimizerState::split(8, 4), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(NvmeOptimizerState::split(3, 100), (std::vector<int64_t>{3}));
  // Each array padded to 4096 bytes: 1024 floats fit exactly, 1025 need two pages.
  EXPECT_EQ(NvmeOptimizerState::file_bytes_for({1024}), 3 * 4096);
  EXPECT_EQ(NvmeOptimizerState::file_bytes_for({1025, 1}), 3 * 8192 + 3 * 4096);
}

// Write generation 0, then read-modify-write it to generations 1 and 2, then read back;
// for buffer counts from synchronous (1) to more buffers than sub-groups.
TEST(NvmeState, PassesRoundTripForEveryBufferCount) {
  Dir dir;
  const auto groups = NvmeOptimizerState::split(10000, 1500);  // 7 sub-groups, the last short
  for (int64_t buffers : {1, 2, 3, 4, 9}) {
    SCOPED_TRACE("buffer_count " + std::to_string(buffers));
    // The fence runs for a buffer before each refill after its first use (and in the
    // destructor): a visit never finds its buffer still "in use" by its previous visit.
    // Declared before the state, whose destructor fences.
    std::vector<bool> in_use(std::min<int64_t>(buffers, 7), false);
    int fences = 0;
    NvmeOptimizerState st(groups, options(dir.path, buffers, 2));
    ASSERT_EQ(st.num_groups(), 7);
    EXPECT_EQ(st.num_buffers(), std::min<int64_t>(buffers, 7));
    EXPECT_EQ(st.file_bytes(), NvmeOptimizerState::file_bytes_for(groups));
    // Three 6000-byte arrays padded to 8192, plus 2 bytes per element of scratch (3000 B
    // padded to 4096).
    EXPECT_EQ(st.staging_bytes(), st.num_buffers() * (3 * 8192 + 4096));
    st.set_reuse_fence([&](int k) {
      ASSERT_TRUE(in_use[k]) << "fence for a buffer that nothing used";
      in_use[k] = false;
      ++fences;
    });
    std::vector<int> order;
    auto check_buffer = [&](const Staged& s) {
      EXPECT_EQ(s.buffer, s.group % st.num_buffers());
      EXPECT_FALSE(in_use[s.buffer]) << "buffer " << s.buffer << " refilled without its fence";
      in_use[s.buffer] = true;
      order.push_back(s.group);
      EXPECT_EQ(s.begin, st.group_begin(s.group));
      EXPECT_EQ(s.numel, groups[s.group]);
      ASSERT_NE(s.scratch, nullptr);
    };

    st.pass(Mode::kWrite, [&](const Staged& s) {
      check_buffer(s);
      for (int64_t i = 0; i < s.numel; ++i) {
        s.master[i] = value(0, s.begin + i, 0);
        s.exp_avg[i] = value(1, s.begin + i, 0);
        s.exp_avg_sq[i] = value(2, s.begin + i, 0);
      }
    });
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(st.last_pass().bytes_written, st.file_bytes());
    EXPECT_EQ(st.last_pass().bytes_read, 0);
    for (int gen = 1; gen <= 2; ++gen) {
      st.pass(Mode::kReadWrite, [&](const Staged& s) {
        check_buffer(s);
        for (int64_t i = 0; i < s.numel; ++i) {
          ASSERT_EQ(s.master[i], value(0, s.begin + i, gen - 1)) << "group " << s.group << " element " << i;
          ASSERT_EQ(s.exp_avg[i], value(1, s.begin + i, gen - 1));
          ASSERT_EQ(s.exp_avg_sq[i], value(2, s.begin + i, gen - 1));
          s.master[i] = value(0, s.begin + i, gen);
          s.exp_avg[i] = value(1, s.begin + i, gen);
          s.exp_avg_sq[i] = value(2, s.begin + i, gen);
        }
      });
      EXPECT_EQ(st.last_pass().bytes_read, st.file_bytes());
      EXPECT_EQ(st.last_pass().bytes_written, st.file_bytes());
      // [NVMe Pipeline]: B - 1 reads ahead of the first visit (B - 2 afterwards), at most
      // all 6 later sub-groups.
      EXPECT_EQ(st.last_pass().max_reads_ahead, std::min<int>(static_cast<int>(buffers), 7) - 1);
    }
    // kRead: changes in the buffers are not written back.
    for (int round = 0; round < 2; ++round) {
      st.pass(Mode::kRead, [&](const Staged& s) {
        check_buffer(s);
        for (int64_t i = 0; i < s.numel; ++i) {
          ASSERT_EQ(s.master[i], value(0, s.begin + i, 2));
          ASSERT_EQ(s.exp_avg_sq[i], value(2, s.begin + i, 2));
          s.master[i] = -1;
        }
      });
      EXPECT_EQ(st.last_pass().bytes_written, 0);
    }
    EXPECT_GT(fences, 0);
  }
}

// A visit that throws: the error leaves pass() after every transfer finished; sub-groups
// written before it hold their new values, the others their old ones; the next pass works.
TEST(NvmeState, VisitErrorLeavesAConsistentFile) {
  Dir dir;
  NvmeOptimizerState st(NvmeOptimizerState::split(5000, 1000), options(dir.path, 3));
  st.pass(Mode::kWrite, [&](const Staged& s) {
    for (int64_t i = 0; i < s.numel; ++i) s.master[i] = s.exp_avg[i] = s.exp_avg_sq[i] = 1.0f;
  });
  EXPECT_THROW(st.pass(Mode::kReadWrite,
                       [&](const Staged& s) {
                         if (s.group == 3) throw zt::Error("visit failed");
                         for (int64_t i = 0; i < s.numel; ++i) s.master[i] = 2.0f;
                       }),
               zt::Error);
  std::vector<float> seen;
  st.pass(Mode::kRead, [&](const Staged& s) { seen.push_back(s.master[s.numel - 1]); });
  EXPECT_EQ(seen, (std::vector<float>{2.0f, 2.0f, 2.0f, 1.0f, 1.0f}));
}

// One swap file per engine: DIR/STEM.swp, the next free name while it is held, removed
// with its engine; a bad directory is a ConfigError naming the path.
TEST(NvmeState, ClaimsItsOwnFileAndRemovesIt) {
  Dir dir;
  const std::string first = dir.path + "/zerotrain_rank0_optimizer.swp";
  const std::string second = dir.path + "/zerotrain_rank0_optimizer.1.swp";
  {
    NvmeOptimizerState a(NvmeOptimizerState::split(100, 100), options(dir.path, 4));
    EXPECT_EQ(a.path(), first);
    EXPECT_EQ(a.num_buffers(), 1);  // never more buffers than sub-groups
    {
      NvmeOptimizerState b(NvmeOptimizerState::split(100, 100), options(dir.path, 4));
      EXPECT_EQ(b.path(), second);
      EXPECT_TRUE(exists(first));
      EXPECT_TRUE(exists(second));
    }
    EXPECT_FALSE(exists(second));
    EXPECT_TRUE(exists(first));
  }
  EXPECT_FALSE(exists(first));
  // A stale file of a killed job holds no lock: its name is reused (and truncated).
  { FILE* f = std::fopen(first.c_str(), "w"); ASSERT_NE(f, nullptr); std::fputs("stale", f); std::fclose(f); }
  {
    NvmeOptimizerState c(NvmeOptimizerState::split(100, 100), options(dir.path, 2));
    EXPECT_EQ(c.path(), first);
  }
  EXPECT_FALSE(exists(first));
  try {
    NvmeOptimizerState bad(NvmeOptimizerState::split(100, 100), options(dir.path + "/missing", 2));
    ADD_FAILURE() << "no error for a missing directory";
  } catch (const zt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path + "/missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(NvmeOptimizerState(NvmeOptimizerState::split(100, 100), options(dir.path, 0)), zt::ConfigError);
}

}  // namespace

namespace {

// [NVMe Params]: byte ranges that start and end mid-page are written without touching
// their neighbours (read-modify-write of the edge pages) and read back exactly; the reuse fence runs before a slot is
// refilled, never for a slot not read yet.
TEST(NvmeParamFile, UnalignedRangesRoundTripAndSlotsAreFenced) {
  Dir dir;
  auto o = options(dir.path, /*buffers=*/2);
  o.stem = "zerotrain_rank0_params";
  const int64_t bytes = 3 * 4096 + 1234;  // the shard
  std::vector<unsigned char> want(static_cast<size_t>(bytes));
  std::string path;
  std::vector<int> fenced;  // outlives f: its destructor fences the slots in use
  {
    zt::offload::NvmeParamFile f(bytes, /*max_read_bytes=*/5000, o);
    path = f.path();
    EXPECT_TRUE(exists(path));
    EXPECT_EQ(f.file_bytes(), 4 * 4096);
    f.set_reuse_fence([&](int slot) { fenced.push_back(slot); });
    // Whole shard, then overlapping unaligned pieces in an order that crosses pages.
    for (int64_t i = 0; i < bytes; ++i) want[static_cast<size_t>(i)] = static_cast<unsigned char>(i * 13 + 1);
    f.write(0, want.data(), bytes);
    const std::pair<int64_t, int64_t> pieces[] = {{100, 50}, {4000, 200}, {4095, 4098}, {8191, 1}, {12000, bytes - 12000}};
    int gen = 2;
    for (const auto& [off, n] : pieces) {
      std::vector<unsigned char> v(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<unsigned char>((off + i) * gen + gen);
      f.write(off, v.data(), n);
      std::copy(v.begin(), v.end(), want.begin() + off);
      ++gen;
    }
    // Reads of every piece (and a few more) see exactly what was written.
    const std::pair<int64_t, int64_t> reads[] = {{0, 5000}, {4090, 10}, {100, 50}, {8000, 4300}, {bytes - 7, 7}};
    int n_read = 0;
    for (const auto& [off, n] : reads) {
      const auto v = f.read(off, n);
      EXPECT_EQ(v.slot, n_read % 2);
      EXPECT_EQ(std::memcmp(v.data, want.data() + off, static_cast<size_t>(n)), 0) << "read [" << off << ", +" << n << ")";
      ++n_read;
    }
    // 5 reads over 2 slots: slot 0 refilled at reads 3 and 5, slot 1 at read 4.
    EXPECT_EQ(fenced, (std::vector<int>{0, 1, 0}));
    const auto st = f.take_stats();
    EXPECT_GT(st.bytes_written, bytes);  // the edge pages went out again
    EXPECT_GT(st.bytes_read, 0);
    EXPECT_THROW(f.read(bytes - 10, 11), zt::InternalError);
  }
  EXPECT_FALSE(exists(path)) << "the parameter file outlived its owner";
  EXPECT_EQ(fenced, (std::vector<int>{0, 1, 0, 0, 1})) << "the destructor fences both slots in use";
}

}  // namespace

}  // namespace zt_test_nvme_state

// Issue 25: interleaved 1F1B with ZeRO-2 over dp 2 hung on four H100s (NCCL) while it
// completes on CPU ranks. Under NCCL the ranks must issue the operations of different
// communicators in a consistent order; these tests check, on CPU ranks, the two orders the
// hang could come from, with the [Comm Trace] of every operation each rank issues
// (src/comm/trace.h):
//  * DataParallelPeersIssueTheSameSequence: the two data-parallel replicas of a stage run
//    the same program, so their traces (groups numbered by first appearance, op, bytes) must
//    be identical -- the bucket reduce-scatters fired from the backward hooks included,
//    interleaved with the schedule's messages at the same places. A difference (a bucket
//    launched in another order, one rank reducing a bucket the other skips) deadlocks NCCL.
//  * EagerGroupsLeaveNoFirstUseInsideABatch: with the default eager setup ([Pipeline Eager
//    Groups] in src/pipe/pipe_engine.cpp) no group is used for the first time inside a batch
//    (under NCCL a first use creates the communicator and connects the peer, blocking the host
//    collectively); without it some group's first use comes after the batch's first
//    reduce-scatter (ZT_PIPE_EAGER_COMMS=0), the situation that hung on 4 H100s and that the
//    eager setup removes (it completes there: bench/results/2026-11-27_pipe_hang_h100x4).
// Every case at pp 2 x dp 2 (4 ranks; skipped at other sizes), GPT-2 (4 blocks, C 64, fp32),
// reduce buckets of 5000 elements (buckets holding parameters of both chunks), 2 batches.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/trace.h"
#include "models/gpt2.h"
#include "parallel/topology.h"
#include "pipe/pipe_engine.h"
#include "support/pipeline_test_util.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::pipe {
namespace test_pipeline_comm_order {
namespace {

struct OrderCase {
  const char* name;
  const char* schedule;
  int virtual_stages;
  int zero_stage;
  bool overlap_comm;
};

nlohmann::json config(const OrderCase& c) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 4},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"zero_optimization",
       {{"stage", c.zero_stage}, {"reduce_bucket_size", 5000}, {"allgather_bucket_size", 7000},
        {"overlap_comm", c.overlap_comm}}},
      {"pipeline", {{"stages", 2}, {"schedule", c.schedule}}},
  };
  if (c.virtual_stages > 1) j["pipeline"]["virtual_stages"] = c.virtual_stages;
  return j;
}

struct Traced {
  std::vector<comm::TraceEntry> setup, batches;  // the constructor's operations, the batches'
};

// Builds the pipeline at pp 2 x dp 2 on CPU and runs 2 batches, tracing both parts.
Traced run(const OrderCase& c, parallel::Topology& topo) {
  auto pc = pipeline_config(config(c), 4);
  models::GPT2Config mc;
  mc.n_layer = 4;
  mc.n_head = 4;
  mc.n_embd = 64;
  mc.vocab_size = 256;
  mc.n_positions = 64;
  torch::manual_seed(11);
  models::GPT2 full(mc);
  PipeOptions po;
  po.device = torch::Device(torch::kCPU);
  Traced r;
  comm::trace_enable(true);
  PipeEngine pipe(full, pc, topo, po);
  r.setup = comm::trace_take();
  for (int b = 0; b < 2; ++b) {
    int i = 0;
    pipe.train_batch([&] {
      auto [idx, targets] = test_support::seeded_tokens(static_cast<uint64_t>(100 * b + i++ + 10 * topo.coords().dp), 2,
                                                        16, 256);
      return MicroBatch{idx, targets};
    });
  }
  r.batches = comm::trace_take();
  comm::trace_enable(false);
  return r;
}

// One line per entry, groups numbered by first appearance over setup + batches.
std::vector<std::string> canonical(const Traced& r) {
  std::map<int64_t, int> number;
  std::vector<std::string> out;
  for (const auto* part : {&r.setup, &r.batches}) {
    for (const auto& e : *part) {
      auto it = number.emplace(e.group_id, static_cast<int>(number.size())).first;
      out.push_back(detail::cat(part == &r.setup ? "setup " : "batch ", "g", it->second, " ", e.op, " ", e.bytes));
    }
  }
  return out;
}

// Every rank of `g` gets every rank's lines (collective over g).
std::vector<std::vector<std::string>> gather_lines(const comm::GroupPtr& g, const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  auto len = torch::tensor({static_cast<int64_t>(text.size())}, torch::kLong);
  auto lens = torch::empty({g->size()}, torch::kLong);
  g->all_gather(lens, len);
  const int64_t most = lens.max().item<int64_t>();
  auto mine = torch::zeros({most}, torch::kUInt8);
  std::copy(text.begin(), text.end(), mine.data_ptr<uint8_t>());
  auto all = torch::empty({most * g->size()}, torch::kUInt8);
  g->all_gather(all, mine);
  std::vector<std::vector<std::string>> out;
  for (int r = 0; r < g->size(); ++r) {
    const auto* p = all.data_ptr<uint8_t>() + r * most;
    std::istringstream in(std::string(p, p + lens[r].item<int64_t>()));
    std::vector<std::string> ls;
    for (std::string l; std::getline(in, l);) ls.push_back(l);
    out.push_back(std::move(ls));
  }
  return out;
}

class PipelineCommOrder : public ::testing::TestWithParam<OrderCase> {};

TEST_P(PipelineCommOrder, DataParallelPeersIssueTheSameSequence) {
  const OrderCase& c = GetParam();
  auto world = test_support::pipe_test_world();
  if (world->size() != 4) GTEST_SKIP() << "pp 2 x dp 2 needs 4 ranks, the run has " << world->size();
  unsetenv("ZT_PIPE_EAGER_COMMS");
  parallel::Topology topo(world, parallel::ParallelDims::make(4, /*dp=*/2, /*tp=*/1, /*pp=*/2));
  const Traced r = run(c, topo);
  const auto lines = canonical(r);
  // Not vacuous: the batches reduce-scatter over dp and send messages, and (ZeRO-2, or
  // ZeRO-1 with overlap_comm) a message follows a reduce-scatter inside the batch.
  int rs = 0, p2p_after_rs = 0;
  for (const auto& e : r.batches) {
    if (e.op == "reduce_scatter") ++rs;
    if (rs > 0 && e.op.rfind("p2p", 0) == 0) ++p2p_after_rs;
  }
  EXPECT_GT(rs, 0);
  if (c.zero_stage == 2 || c.overlap_comm) EXPECT_GT(p2p_after_rs, 0);
  const auto peers = gather_lines(topo.dp(), lines);
  ASSERT_EQ(peers.size(), 2u);
  const auto& a = peers[0];
  const auto& b = peers[1];
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  EXPECT_TRUE(i == a.size() && i == b.size())
      << c.name << ": stage " << topo.coords().pp << "'s data-parallel ranks issue different operations from entry "
      << i << " of " << a.size() << " / " << b.size() << ": dp rank 0 '" << (i < a.size() ? a[i] : "<end>")
      << "', dp rank 1 '" << (i < b.size() ? b[i] : "<end>") << "'";
}

TEST_P(PipelineCommOrder, EagerGroupsLeaveNoFirstUseInsideABatch) {
  const OrderCase& c = GetParam();
  auto world = test_support::pipe_test_world();
  if (world->size() != 4) GTEST_SKIP() << "pp 2 x dp 2 needs 4 ranks, the run has " << world->size();
  for (bool eager : {false, true}) {
    if (eager) {
      unsetenv("ZT_PIPE_EAGER_COMMS");  // the default: [Pipeline Eager Groups] on
    } else {
      setenv("ZT_PIPE_EAGER_COMMS", "0", 1);
    }
    parallel::Topology topo(world, parallel::ParallelDims::make(4, 2, 1, 2));
    const Traced r = run(c, topo);
    unsetenv("ZT_PIPE_EAGER_COMMS");
    std::map<int64_t, bool> seen;
    for (const auto& e : r.setup) seen[e.group_id] = true;
    std::string late;  // groups first used inside a batch after a reduce-scatter
    bool after_rs = false;
    int first_uses = 0;
    for (const auto& e : r.batches) {
      if (!seen.count(e.group_id)) {
        ++first_uses;
        if (after_rs) late += detail::cat(late.empty() ? "" : ", ", e.group, " (", e.op, ")");
        seen[e.group_id] = true;
      }
      if (e.op == "reduce_scatter") after_rs = true;
    }
    if (eager) {
      EXPECT_EQ(first_uses, 0) << c.name << ": with the eager groups (the default) a group is still first used inside a batch";
    } else if (c.zero_stage == 2) {
      // The lazy first use the eager setup removes: e.g. the tied weight's pp group and the
      // norm's model-parallel group, first used after the batch's reduce-scatters.
      EXPECT_FALSE(late.empty()) << c.name << ": no group is first used after a reduce-scatter";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineCommOrder,
                         ::testing::Values(OrderCase{"interleaved_z2", "interleaved", 2, 2, false},
                                           OrderCase{"interleaved_z1_overlap", "interleaved", 2, 1, true},
                                           OrderCase{"interleaved_z1", "interleaved", 2, 1, false},
                                           OrderCase{"1f1b_z2", "1f1b", 1, 2, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace test_pipeline_comm_order
}  // namespace zt::pipe

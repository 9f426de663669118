// `zerotrain launch` as a user runs it: a child process, its merged output, exit code
// and wall time. Failure scenarios use the small programs in tests/progs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/cuda.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace zt_test_launch {

namespace {

struct Launched {
  int code = -1;       // exit code of the launcher (128+N if it died of signal N)
  std::string output;  // stdout and stderr, merged
  double seconds = 0;  // from start to the launcher's exit
  // Each line with its arrival time (seconds from start).
  std::vector<std::pair<double, std::string>> lines;
  // Seconds from start to the first line containing `needle`; -1 if none.
  double time_of(const std::string& needle) const {
    for (const auto& [t, line] : lines) {
      if (line.find(needle) != std::string::npos) return t;
    }
    return -1;
  }
};

// Runs `env ENV... zerotrain launch ARGS 2>&1` under a 90 s hard limit (so a launcher
// that hangs fails the test instead of blocking it).
Launched launch(const std::string& args, const std::string& env = "") {
  const std::string cmd = "timeout -k 5 90 env " + env + " " ZT_BINARY_DIR "/zerotrain launch " + args + " 2>&1";
  Launched r;
  auto start = std::chrono::steady_clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return r;
  }
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::array<char, 65536> buf;
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) {
    r.output += buf.data();
    r.lines.emplace_back(since(), buf.data());
  }
  int status = pclose(p);
  r.seconds = since();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

const std::string kBinaryDir = ZT_BINARY_DIR;
std::string prog(const std::string& name) { return kBinaryDir + "/prog_" + name; }

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

TEST(Launch, PrefixesEveryLineWithItsRank) {
  // stdout, stderr and a last line without a newline, from each of 2 ranks.
  Launched r = launch(
      "-n 2 -- sh -c 'echo out $RANK of $WORLD_SIZE local $LOCAL_RANK/$LOCAL_WORLD_SIZE; "
      "echo err $RANK >&2; printf tail$RANK'");
  EXPECT_EQ(r.code, 0) << r.output;
  for (int k = 0; k < 2; ++k) {
    const std::string p = "[rank " + std::to_string(k) + "] ";
    const std::string ks = std::to_string(k);
    EXPECT_TRUE(contains(r.output, p + "out " + ks + " of 2 local " + ks + "/2\n")) << r.output;
    EXPECT_TRUE(contains(r.output, p + "err " + ks + "\n")) << r.output;
    EXPECT_TRUE(contains(r.output, p + "tail" + ks + "\n")) << r.output;
  }
  // Nothing unprefixed (mpirun banners, partial lines interleaved mid-line).
  size_t pos = 0;
  while (pos < r.output.size()) {
    size_t end = r.output.find('\n', pos);
    std::string line = r.output.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    EXPECT_EQ(line.rfind("[rank ", 0), 0u) << "unprefixed line: '" << line << "'\n" << r.output;
    pos = end == std::string::npos ? r.output.size() : end + 1;
  }
}

TEST(Launch, SuccessIsExitCodeZero) {
  Launched r = launch("-n 3 -- true");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Start-up (the launcher and each rank load LibTorch) takes seconds on a loaded 2-core
// machine, so the reaction is timed from the failing rank's report to the launcher's exit;
// the total only has to stay well below the 60 s sleep and the 600 s collective timeout.
constexpr double kReactSeconds = 10.0;
constexpr double kTotalSeconds = 30.0;

void expect_rank1_code3(const Launched& r) {
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "exit code 3")) << r.output;
  // Rank 0 sat in a collective with a 600 s timeout, rank 2 in a 60 s sleep: only the
  // launcher ending them makes this fast.
  const double failed_at = r.time_of("failed with exit code 3");
  ASSERT_GE(failed_at, 0) << r.output;
  EXPECT_LT(r.seconds - failed_at, kReactSeconds) << r.output;
  EXPECT_LT(r.seconds, kTotalSeconds) << r.output;
  EXPECT_FALSE(contains(r.output, "slept 60 s")) << r.output;
}

TEST(LaunchFailure, RankExitsEarlyAfterMpiStarts) {
  Launched r = launch("-n 3 -- " + prog("early_exit"));
  expect_rank1_code3(r);
  EXPECT_TRUE(contains(r.output, "[rank 1] exiting with code 3")) << r.output;
}

TEST(LaunchFailure, RankExitsBeforeMpiStarts) {
  Launched r = launch("-n 3 -- " + prog("early_exit") + " early");
  expect_rank1_code3(r);
}

// `names`: what the error must name (the collective, or the pending messages).
void expect_missing_peer_timeout(const std::string& mode, const std::vector<std::string>& names = {"all_reduce"}) {
  Launched r = launch("-n 2 -- " + prog("missing_peer") + " " + mode, "ZT_COMM_TIMEOUT=2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] timeout 2.0 s")) << "ZT_COMM_TIMEOUT must reach the ranks\n" << r.output;
  // The error is rank 0's, printed by rank 0.
  size_t at = r.output.find("[rank 0] prog_missing_peer: CommError");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string msg = r.output.substr(at, r.output.find('\n', at) - at);
  for (const std::string& name : names) EXPECT_TRUE(contains(msg, name)) << msg;
  EXPECT_TRUE(contains(msg, "rank 0")) << msg;
  EXPECT_TRUE(contains(msg, "timed out")) << msg;
  EXPECT_TRUE(contains(msg, "ZT_COMM_TIMEOUT")) << "the message says how to raise the limit: " << msg;
  // It waited the 2 s, not 0 and not the default 600.
  const double waited = std::atof(msg.c_str() + std::string("[rank 0] prog_missing_peer: CommError after ").size());
  EXPECT_GE(waited, 1.9) << msg;
  EXPECT_LT(waited, 6.0) << msg;
  // A broken group refuses further calls at once.
  at = r.output.find("[rank 0] prog_missing_peer: next call: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_TRUE(contains(r.output.substr(at, r.output.find('\n', at) - at), "unusable")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0") && contains(r.output, "exit code 1")) << r.output;
  EXPECT_FALSE(contains(r.output, "never joined")) << "rank 1 should have been ended first\n" << r.output;
  // From rank 0's "timeout" line (just before the all_reduce) to the launcher's exit:
  // the 2 s timeout plus the launcher ending rank 1.
  const double ready_at = r.time_of("[rank 0] timeout 2.0 s");
  EXPECT_LT(r.seconds - ready_at, 2.0 + kReactSeconds) << r.output;
  EXPECT_LT(r.seconds, kTotalSeconds) << r.output;
}

TEST(LaunchFailure, MissingPeerTimesOut) { expect_missing_peer_timeout("cpu"); }

// Point-to-point ([P2P Rules]): a recv whose sender never comes, and a batch whose peer
// posts nothing, are named (op, sequence number, peer, rank, group) at the timeout.
TEST(LaunchFailure, MissingPeerTimesOutInP2P) {
  expect_missing_peer_timeout("p2p-recv", {"recv #0 from peer 1 (1001 x Float) on rank 0 of group 'world'"});
  expect_missing_peer_timeout("p2p-batch", {"batch_isend_irecv of 2 ops", "on rank 0 of group 'world'",
                                            "pending: send #0 to peer 1 (1048576 x Float), recv #0 from peer 1"});
}

// A pipeline stage's rank that stops mid-batch (pp 2, 1F1B, CPU; tests/progs/dead_stage.cpp):
// stage 0's rank gets a CommError at the 2 s timeout, not a hang, naming the schedule
// instruction it waited in (rg1 of batch 2), the recv, the peer and the group.
TEST(LaunchFailure, DeadPipelineStageTimesOutNamingTheInstruction) {
  Launched r = launch("-n 2 -- " + prog("dead_stage"), "ZT_COMM_TIMEOUT=2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] batch 1 done")) << "batch 1 must run on both stages\n" << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 1] stage 1 stops in micro-batch 1's backward")) << r.output;
  const std::string head = "[rank 0] prog_dead_stage: batch 2: CommError after ";
  size_t at = r.output.find(head);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string msg = r.output.substr(at, r.output.find('\n', at) - at);
  for (const char* name : {"pipeline stage 0 of 2 (1f1b, 4 micro-batches), batch 2",
                           "instruction 8 of 20 'rg1' (micro-batch 1)", "recv #", "from peer 1",
                           "on rank 0 of group", "timed out", "ZT_COMM_TIMEOUT"}) {
    EXPECT_TRUE(contains(msg, name)) << name << " missing from: " << msg;
  }
  const double waited = std::atof(msg.c_str() + head.size());
  EXPECT_GE(waited, 1.9) << msg;
  EXPECT_LT(waited, 6.0) << msg;
  EXPECT_FALSE(contains(r.output, "slept 30 s")) << "the launcher should have ended rank 1\n" << r.output;
  EXPECT_FALSE(contains(r.output, "batch 2 finished")) << r.output;
  EXPECT_LT(r.seconds, kTotalSeconds) << r.output;
}

// The same on GPUs: a peer missing from the first CUDA collective (NCCL set-up), and
// from a later one (Work::synchronize aborts the communicator).
TEST(LaunchFailure, MissingPeerTimesOutOnCuda) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs";
  expect_missing_peer_timeout("cuda-setup");
  expect_missing_peer_timeout("cuda-sync");
  expect_missing_peer_timeout("cuda-p2p", {"recv #0 from peer 1"});
}

TEST(LaunchUsage, ProgramThatDoesNotExist) {
  Launched r = launch("-n 2 -- /no/such/program --flag");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "/no/such/program")) << r.output;
  EXPECT_TRUE(contains(r.output, "no such executable")) << r.output;
  EXPECT_FALSE(contains(r.output, "[rank ")) << "refused before starting any rank\n" << r.output;

  Launched onpath = launch("-n 1 -- zt-no-such-program-on-path");
  EXPECT_NE(onpath.code, 0) << onpath.output;
  EXPECT_TRUE(contains(onpath.output, "zt-no-such-program-on-path")) << onpath.output;
  EXPECT_TRUE(contains(onpath.output, "PATH")) << onpath.output;
}

TEST(LaunchUsage, RankCountIsRequiredAndChecked) {
  for (const char* args : {"-- true", "-n 0 -- true", "-n 2x -- true"}) {
    SCOPED_TRACE(args);
    Launched r = launch(args);
    EXPECT_NE(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "-n N")) << r.output;
    EXPECT_TRUE(contains(r.output, "usage: zerotrain launch")) << r.output;
  }
  Launched none = launch("-n 2");
  EXPECT_NE(none.code, 0) << none.output;
  EXPECT_TRUE(contains(none.output, "no program")) << none.output;

  Launched unknown = launch("--bogus -n 2 -- true");
  EXPECT_NE(unknown.code, 0) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "--bogus")) << unknown.output;

  Launched help = launch("--help");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_TRUE(contains(help.output, "usage: zerotrain launch")) << help.output;

  Launched attached = launch("-n2 -- true");  // -nN form
  EXPECT_EQ(attached.code, 0) << attached.output;
}

TEST(LaunchUsage, ExitCodeOfAFailingRankIsPropagated) {
  Launched r = launch("-n 2 -- sh -c 'exit $((RANK + 4))'");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "exit code")) << r.output;
}

}  // namespace

}  // namespace zt_test_launch

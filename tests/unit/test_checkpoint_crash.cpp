// A rank SIGKILLed in the middle of a checkpoint save (tests/progs/ckpt_crash.cpp under
// `zerotrain launch -n 2`): `latest` must still name the previous checkpoint, and that
// checkpoint must load.
#include <gtest/gtest.h>
#include "support/run_shell.h"
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ckpt/fs.h"

namespace zt_test_checkpoint_crash {

namespace {

using ProgRun = zt::test_support::ShellRun;

ProgRun run_prog(const std::string& args) {
  return zt::test_support::run_shell("timeout -k 5 120 " ZT_BINARY_DIR "/zerotrain launch -n 2 -- " ZT_BINARY_DIR
                                     "/prog_ckpt_crash " + args);
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The "LOADED ..." line of a load run.
std::string loaded_line(const ProgRun& r) {
  auto at = r.output.find("LOADED");
  return at == std::string::npos ? "" : r.output.substr(at, r.output.find('\n', at) - at);
}

class CheckpointCrash : public ::testing::TestWithParam<const char*> {};

TEST_P(CheckpointCrash, LatestStillNamesAPreviousLoadableCheckpoint) {
  const std::string point = GetParam();
  const std::string dir = ZT_BINARY_DIR "/ckpt_crash_" + point.substr(0, point.find(':'));
  zt::ckpt::remove_tree(dir);

  // Reference: the state of checkpoint "a" as a load reports it, from a run that saves
  // "a" and "b" without crashing (then "a" is loaded by tag through a fresh latest).
  ProgRun killed = run_prog("save " + dir + " " + point);
  EXPECT_NE(killed.code, 0) << "the save should have been killed\n" << killed.output;
  EXPECT_TRUE(has(killed.output, "killing itself at")) << killed.output;
  EXPECT_FALSE(has(killed.output, "SAVED b")) << killed.output;
  ASSERT_TRUE(zt::ckpt::path_exists(dir + "/latest")) << killed.output;
  EXPECT_EQ(zt::ckpt::read_text_file(dir + "/latest"), "a");

  ProgRun loaded = run_prog("load " + dir);
  EXPECT_EQ(loaded.code, 0) << loaded.output;
  EXPECT_TRUE(has(loaded_line(loaded), "step=2")) << loaded.output;

  // The same load after an uninterrupted save of "a" gives the same parameters.
  const std::string clean = dir + "_clean";
  zt::ckpt::remove_tree(clean);
  ProgRun saved = run_prog("save " + clean + " none:0");
  EXPECT_EQ(saved.code, 0) << saved.output;
  zt::ckpt::write_file_atomic(clean + "/latest", "a");
  ProgRun reference = run_prog("load " + clean);
  EXPECT_EQ(reference.code, 0) << reference.output;
  EXPECT_EQ(loaded_line(loaded), loaded_line(reference));
  EXPECT_FALSE(loaded_line(reference).empty()) << reference.output;
  zt::ckpt::remove_tree(dir);
  zt::ckpt::remove_tree(clean);
}

// Rank 1 dies after writing its shard (before any rename); rank 0 dies after publishing
// the tag directory but before updating `latest`.
INSTANTIATE_TEST_SUITE_P(Points, CheckpointCrash, ::testing::Values("after_shard:1", "before_latest:0"),
                         [](const auto& info) {
                           std::string s = info.param;
                           return s.substr(0, s.find(':'));
                         });

}  // namespace

}  // namespace zt_test_checkpoint_crash

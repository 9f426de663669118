// The logger ([Log Lines] in log/log.h): levels, the line format, the rank filter, the
// environment and the `--log-level` flag, whole lines from many threads, progress output,
// and the train progress line as a user sees it (a child process).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "log/log.h"
#include "support/run_shell.h"

namespace zt_test_log {

namespace {

using zt::log::Level;

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Captures the logger's lines in a temporary file (not a terminal) and restores the
// process's settings afterwards.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("ZT_LOG_LEVEL");
    ::unsetenv("ZT_LOG_RANKS");
    zt::log::reset_from_env();
    zt::log::set_rank(0);
    file_ = std::tmpfile();
    ASSERT_NE(file_, nullptr);
    zt::log::set_stream(file_);
  }
  void TearDown() override {
    zt::log::set_stream(nullptr);
    std::fclose(file_);
    ::unsetenv("ZT_LOG_LEVEL");
    ::unsetenv("ZT_LOG_RANKS");
    zt::log::reset_from_env();
  }
  // What was written since the last call.
  std::string taken() {
    std::fflush(file_);
    std::string s;
    std::fseek(file_, offset_, SEEK_SET);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) s.append(buf, n);
    offset_ = std::ftell(file_);
    return s;
  }
  std::FILE* file_ = nullptr;
  long offset_ = 0;
};

const std::regex kLine(R"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} (ERROR|WARN|INFO|DEBUG) \[rank \d+\] .*)");

TEST(Log, ParsesTheFourLevelsInAnyCaseAndNothingElse) {
  EXPECT_EQ(zt::log::parse_level("error"), Level::kError);
  EXPECT_EQ(zt::log::parse_level("WARN"), Level::kWarn);
  EXPECT_EQ(zt::log::parse_level("warning"), Level::kWarn);
  EXPECT_EQ(zt::log::parse_level("Info"), Level::kInfo);
  EXPECT_EQ(zt::log::parse_level("debug"), Level::kDebug);
  EXPECT_FALSE(zt::log::parse_level("loud"));
  EXPECT_FALSE(zt::log::parse_level(""));
  EXPECT_FALSE(zt::log::parse_level("2"));
}

TEST(Log, LineIsLocalTimeWithMillisecondsLevelRankMessage) {
  const char* old_tz = std::getenv("TZ");
  const std::string saved = old_tz ? old_tz : "";
  ::setenv("TZ", "UTC", 1);
  ::tzset();
  const auto t = std::chrono::system_clock::time_point(std::chrono::milliseconds(1795000923456LL));
  EXPECT_EQ(zt::log::format_line(Level::kInfo, 0, "hello", t), "2026-11-18 11:22:03.456 INFO [rank 0] hello");
  EXPECT_EQ(zt::log::format_line(Level::kWarn, 3, "x", t), "2026-11-18 11:22:03.456 WARN [rank 3] x");
  // Local time: the same instant two hours east.
  ::setenv("TZ", "EET-2", 1);
  ::tzset();
  EXPECT_EQ(zt::log::format_line(Level::kError, 12, "y", t), "2026-11-18 13:22:03.456 ERROR [rank 12] y");
  if (old_tz) ::setenv("TZ", saved.c_str(), 1);
  else ::unsetenv("TZ");
  ::tzset();
}

TEST_F(LogTest, LevelFilterKeepsTheLevelAndTheMoreSevere) {
  zt::log::set_level(Level::kWarn);
  zt::log::debug("d%d", 1);
  zt::log::info("i%d", 1);
  zt::log::warn("w%d", 1);
  zt::log::error("e%d", 1);
  auto l = lines_of(taken());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(std::regex_match(l[0], kLine)) << l[0];
  EXPECT_TRUE(l[0].ends_with(" WARN [rank 0] w1")) << l[0];
  EXPECT_TRUE(l[1].ends_with(" ERROR [rank 0] e1")) << l[1];

  zt::log::set_level(Level::kDebug);
  zt::log::debug("d%d", 2);
  zt::log::info("i%d", 2);
  l = lines_of(taken());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(l[0].ends_with(" DEBUG [rank 0] d2")) << l[0];
  EXPECT_TRUE(l[1].ends_with(" INFO [rank 0] i2")) << l[1];

  zt::log::set_level(Level::kError);
  zt::log::warn("w3");
  zt::log::error("e3");
  l = lines_of(taken());
  ASSERT_EQ(l.size(), 1u);
  EXPECT_TRUE(l[0].ends_with(" ERROR [rank 0] e3")) << l[0];
}

TEST_F(LogTest, OtherRanksPrintWarningsAndErrorsOnlyUnlessAllRanks) {
  zt::log::set_level(Level::kDebug);
  zt::log::set_rank(1);
  zt::log::debug("d");
  zt::log::info("i");
  zt::log::warn("w");
  zt::log::error("e");
  auto l = lines_of(taken());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(l[0].ends_with(" WARN [rank 1] w")) << l[0];
  EXPECT_TRUE(l[1].ends_with(" ERROR [rank 1] e")) << l[1];
  EXPECT_FALSE(zt::log::enabled(Level::kInfo));

  ::setenv("ZT_LOG_RANKS", "all", 1);
  zt::log::reset_from_env();
  zt::log::set_rank(1);
  zt::log::set_level(Level::kDebug);
  zt::log::info("i");
  zt::log::debug("d");
  l = lines_of(taken());
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(l[0].ends_with(" INFO [rank 1] i")) << l[0];
  EXPECT_TRUE(l[1].ends_with(" DEBUG [rank 1] d")) << l[1];
}

TEST_F(LogTest, EnvironmentSetsLevelAndRankAndAnInvalidLevelIsNamed) {
  ::setenv("ZT_LOG_LEVEL", "error", 1);
  zt::log::reset_from_env();
  EXPECT_EQ(zt::log::level(), Level::kError);
  zt::log::set_level(Level::kDebug);  // what `--log-level` does: it wins
  EXPECT_EQ(zt::log::level(), Level::kDebug);

  // The launcher's rank variable gives the rank before comm sets it.
  ::setenv("OMPI_COMM_WORLD_RANK", "5", 1);
  zt::log::reset_from_env();
  EXPECT_EQ(zt::log::rank(), 5);
  ::unsetenv("OMPI_COMM_WORLD_RANK");
  zt::log::set_rank(0);

  ::setenv("ZT_LOG_LEVEL", "chatty", 1);
  zt::log::reset_from_env();
  zt::log::set_rank(0);
  EXPECT_EQ(zt::log::level(), Level::kInfo);
  const auto l = lines_of(taken());
  ASSERT_EQ(l.size(), 1u);
  EXPECT_TRUE(contains(l[0], " WARN [rank 0] ZT_LOG_LEVEL='chatty' is not a log level (error, warn, info, debug)"))
      << l[0];
}

TEST_F(LogTest, EveryLineOfAMultiLineMessageGetsThePrefix) {
  zt::log::write(Level::kError, "3 saves failed:\n  step 2\n  step 4\n");
  const auto l = lines_of(taken());
  ASSERT_EQ(l.size(), 3u);
  EXPECT_TRUE(l[0].ends_with(" ERROR [rank 0] 3 saves failed:")) << l[0];
  EXPECT_TRUE(l[2].ends_with(" ERROR [rank 0]   step 4")) << l[2];
  for (const auto& x : l) EXPECT_TRUE(std::regex_match(x, kLine)) << x;
}

TEST_F(LogTest, LinesFromManyThreadsStayWhole) {
  constexpr int kThreads = 8, kLines = 300;
  const std::string payload(200, 'x');  // long enough that a torn write would show
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kLines; ++i) zt::log::info("thread %d line %d %s end", t, i, payload.c_str());
    });
  }
  for (auto& t : ts) t.join();
  const auto l = lines_of(taken());
  ASSERT_EQ(l.size(), static_cast<size_t>(kThreads * kLines));
  const std::regex whole(R"(.* INFO \[rank 0\] thread \d line \d+ x{200} end)");
  int bad = 0;
  for (const auto& x : l) bad += std::regex_match(x, whole) ? 0 : 1;
  EXPECT_EQ(bad, 0);
}

TEST(Log, DurationsAreMinutesSecondsOrHours) {
  EXPECT_EQ(zt::log::format_duration(0), "0:00");
  EXPECT_EQ(zt::log::format_duration(7.4), "0:07");
  EXPECT_EQ(zt::log::format_duration(754), "12:34");
  EXPECT_EQ(zt::log::format_duration(3723), "1:02:03");
  EXPECT_EQ(zt::log::format_duration(-1), "?");
}

TEST_F(LogTest, ProgressOffATerminalPrintsPlainLinesAndTheEnd) {
  zt::log::Progress p("convert", 10, "tensors");
  EXPECT_EQ(p.line(5, 10, "x"), "convert: 50% (5 / 10 tensors), 0:10 elapsed, 0:10 left, x");
  EXPECT_EQ(p.line(0, 1, ""), "convert: 0% (0 / 10 tensors), 0:01 elapsed, ? left");
  EXPECT_EQ(p.line(10, 3, ""), "convert: 100% (10 / 10 tensors), 0:03 elapsed");
  // Done within a second: no intermediate lines, only the last one (no '\r', no bar).
  for (int i = 1; i <= 10; ++i) p.update(i);
  p.finish("done");
  const std::string out = taken();
  const auto l = lines_of(out);
  ASSERT_EQ(l.size(), 1u) << out;
  EXPECT_TRUE(contains(l[0], " INFO [rank 0] convert: 100% (10 / 10 tensors), 0:00 elapsed, done")) << l[0];
  EXPECT_FALSE(contains(out, "\r"));

  // Other ranks show no progress.
  zt::log::set_rank(1);
  zt::log::Progress q("load", 4, "parameters");
  q.update(2);
  q.finish();
  EXPECT_EQ(taken(), "");
}

TEST_F(LogTest, ProgressOfSlowWorkPrintsAtMostEveryTenPercent) {
  zt::log::Progress p("tokenize", 100, "MB");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // past the quiet first second
  for (int i = 1; i <= 100; ++i) p.update(i);
  p.finish();
  const auto l = lines_of(taken());
  // 10%, 20%, ..., 90% as the updates pass them, then finish()'s 100% (the loop takes far
  // less than the 5 s that would add a line between them).
  ASSERT_EQ(l.size(), 10u);
  for (int k = 1; k <= 9; ++k) {
    const std::string want = "tokenize: " + std::to_string(10 * k) + "% (" + std::to_string(10 * k) + " / 100 MB)";
    EXPECT_TRUE(contains(l[k - 1], want)) << l[k - 1];
  }
  EXPECT_TRUE(contains(l.back(), "tokenize: 100% (100 / 100 MB)")) << l.back();
}

// A pseudo-terminal: the bar is rewritten in place ('\r', the rest of the old bar cleared
// with ESC[K) and a log line written meanwhile starts on a fresh line.
TEST_F(LogTest, ProgressOnATerminalIsOneBarRewrittenInPlace) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  termios raw{};
  ::tcgetattr(slave, &raw);
  ::cfmakeraw(&raw);  // no "\n" -> "\r\n": the bytes as written
  ::tcsetattr(slave, TCSANOW, &raw);
  std::FILE* tty = ::fdopen(slave, "w");
  ASSERT_NE(tty, nullptr);
  zt::log::set_stream(tty);
  {
    zt::log::Progress p("load", 4, "parameters");
    p.update(1);
    zt::log::info("between");
    std::this_thread::sleep_for(std::chrono::milliseconds(120));  // bars are at most 10 a second
    p.update(2);
    p.finish();
  }
  zt::log::set_stream(file_);
  std::fclose(tty);
  std::string got;
  char buf[4096];
  pollfd pfd{master, POLLIN, 0};
  while (::poll(&pfd, 1, 200) > 0) {
    const ssize_t n = ::read(master, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  const std::regex want(
      "\r\\[###### {18}\\] load: 25% \\(1 / 4 parameters\\), 0:00 elapsed, 0:00 left\x1b\\[K"
      "\n[-0-9]{10} [0-9:.]{12} INFO \\[rank 0\\] between\n"
      "\r\\[#{12} {12}\\] load: 50% \\(2 / 4 parameters\\), 0:00 elapsed, 0:00 left\x1b\\[K"
      "\r\\[#{24}\\] load: 100% \\(4 / 4 parameters\\), 0:00 elapsed\x1b\\[K\n");
  EXPECT_TRUE(std::regex_match(got, want)) << ::testing::PrintToString(got);
}

// --- through the `zerotrain` command ---------------------------------------------------

using zt::test_support::run_shell;
const std::string kZt = "timeout -k 5 120 " ZT_BINARY_DIR "/zerotrain ";

TEST(LogCli, AnInvalidLevelIsAUsageErrorNamingTheValueAndTheLevels) {
  auto r = run_shell(kZt + "--log-level loud check-config /nonexistent.json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--log-level 'loud' is not a log level; valid levels: error, warn, info, debug"))
      << r.output;
  r = run_shell("ZT_LOG_LEVEL=verbose " + kZt + "check-config /nonexistent.json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "ZT_LOG_LEVEL 'verbose' is not a log level; valid levels: error, warn, info, debug"))
      << r.output;
  r = run_shell(kZt + "check-config /nonexistent.json --log-level");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--log-level needs a value")) << r.output;
  // A valid flag wins over an invalid variable, after the command name too (the pre-pass
  // takes it out before check-config parses, which would refuse an unknown option).
  r = run_shell("ZT_LOG_LEVEL=verbose " + kZt + "check-config /nonexistent.json --log-level=warn");
  EXPECT_EQ(r.code, 1) << r.output;  // the missing file, not the level
  EXPECT_TRUE(contains(r.output, "/nonexistent.json")) << r.output;
  EXPECT_FALSE(contains(r.output, "log level")) << r.output;
}

std::string tiny_config() {
  const std::string p = ZT_BINARY_DIR "/log_cli_" + std::to_string(::getpid()) + ".json";
  std::FILE* f = std::fopen(p.c_str(), "w");
  std::fputs(R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 2,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})", f);
  std::fclose(f);
  return p;
}

const std::string kTrain = " --model gpt2-tiny --layers 1 --seq 16 --steps 6 --warmup 1 --device cpu --peak-tflops 1";

TEST(LogCli, TrainPrintsProgressLinesWithThroughputAndTimeLeft) {
  const std::string cfg = tiny_config();
  const auto r = run_shell("OMP_NUM_THREADS=1 " + kZt + "train --config " + cfg + kTrain);
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> progress;
  for (const auto& l : lines_of(r.output)) {
    if (contains(l, "Loss:")) progress.push_back(l);
  }
  // steps_per_print 2: steps 2, 4, 6, plus the first.
  ASSERT_EQ(progress.size(), 4u) << r.output;
  const std::regex line(
      R"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} INFO \[rank 0\] Epoch 1, Step (\d)/6, Loss: \d+\.\d{6} \| lr \S+ \| )"
      R"(grad norm \S+ \| \d+\.\d ms/step \| \d+ tokens/s \| MFU \d+\.\d% \| elapsed \d+:\d\d, left (\?|\d+:\d\d))");
  const char* steps[] = {"1", "2", "4", "6"};
  for (size_t i = 0; i < progress.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(progress[i], m, line)) << progress[i];
    EXPECT_EQ(m[1], steps[i]);
    // Step 1 is the warm-up: no mean step time yet; later lines know the time left.
    EXPECT_EQ(m[2] == "?", i == 0) << progress[i];
  }
  EXPECT_TRUE(progress.back().ends_with("left 0:00")) << progress.back();
  // The other library lines go through the logger too: the only "[zerotrain]" left is the
  // final report's title (the command's result, plain on stdout).
  EXPECT_TRUE(contains(r.output, "INFO [rank 0] topology: dp 1")) << r.output;
  for (const auto& l : lines_of(r.output)) {
    if (contains(l, "[zerotrain]")) EXPECT_TRUE(l.starts_with("[zerotrain] per-phase report")) << l;
  }
  std::remove(cfg.c_str());
}

TEST(LogCli, LogLevelErrorSilencesInfoButNotTheResult) {
  const std::string cfg = tiny_config();
  const auto quiet = run_shell("OMP_NUM_THREADS=1 " + kZt + "--log-level error train --config " + cfg + kTrain);
  ASSERT_EQ(quiet.code, 0) << quiet.output;
  EXPECT_FALSE(contains(quiet.output, " INFO ")) << quiet.output;
  EXPECT_FALSE(contains(quiet.output, "Loss:")) << quiet.output;
  EXPECT_TRUE(contains(quiet.output, "per-phase report")) << quiet.output;  // stdout: the command's result
  // ZT_LOG_LEVEL does the same; the flag wins over it.
  const auto env = run_shell("OMP_NUM_THREADS=1 ZT_LOG_LEVEL=error " + kZt + "train --config " + cfg + kTrain);
  ASSERT_EQ(env.code, 0) << env.output;
  EXPECT_FALSE(contains(env.output, "Loss:")) << env.output;
  const auto both =
      run_shell("OMP_NUM_THREADS=1 ZT_LOG_LEVEL=error " + kZt + "train --config " + cfg + kTrain + " --log-level info");
  ASSERT_EQ(both.code, 0) << both.output;
  EXPECT_TRUE(contains(both.output, "INFO [rank 0] Epoch 1, Step 6/6, Loss:")) << both.output;
  std::remove(cfg.c_str());
}

// Two ranks: info lines from rank 0 only; ZT_LOG_RANKS=all lets rank 1 speak too.
TEST(LogCli, InfoComesFromRankZeroUnlessAllRanks) {
  const std::string cfg = tiny_config();
  const std::string cmd = kZt + "launch -n 2 -- " ZT_BINARY_DIR "/zerotrain train --config " + cfg +
                          " --model gpt2-tiny --layers 1 --seq 16 --steps 2 --device cpu";
  const auto r = run_shell("OMP_NUM_THREADS=1 " + cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "INFO [rank 0] Epoch 1, Step 2/2")) << r.output;
  EXPECT_FALSE(contains(r.output, "INFO [rank 1]")) << r.output;
  const auto all = run_shell("OMP_NUM_THREADS=1 ZT_LOG_RANKS=all " + cmd);
  ASSERT_EQ(all.code, 0) << all.output;
  EXPECT_TRUE(contains(all.output, "INFO [rank 1] Epoch 1, Step 2/2")) << all.output;
  std::remove(cfg.c_str());
}

}  // namespace

}  // namespace zt_test_log

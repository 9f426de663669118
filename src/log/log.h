// zerotrain's one logger: every line the library and the CLI print for a person (not a
// command's result on stdout) goes through here.
//
// [Log Lines]
// A line is `2026-11-25 15:02:03.123 INFO [rank 0] message` (local time with ms, the
// level, the world rank), written whole to stderr under one mutex, so lines of several
// threads never interleave. Levels, most severe first: error, warn, info, debug; the
// level comes from `zerotrain --log-level LEVEL` (which sets ZT_LOG_LEVEL for the ranks
// it starts) or the environment variable ZT_LOG_LEVEL (default info). Ranks: info and
// debug lines come from rank 0 only, warn and error lines from every rank;
// ZT_LOG_RANKS=all lets every rank print every level. The rank is read from the
// launcher's environment (zerotrain launch, OpenMPI, Slurm, RANK) until
// comm::world_group() sets it. docs/logging.md is the user's side of this note.
//
// The settings are process-wide (the one deliberate global besides stderr itself): they
// describe the process, not an engine. This header includes no torch.
#pragma once
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace zt::log {

enum class Level : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// "error", "warn" (or "warning"), "info", "debug", any case; nullopt for anything else.
std::optional<Level> parse_level(std::string_view s);
// "ERROR", "WARN", "INFO", "DEBUG": the level as a line shows it.
const char* level_name(Level l);
// For messages about an invalid level.
inline constexpr const char* kValidLevels = "error, warn, info, debug";

// Settings. Until set, each is read once from the environment (ZT_LOG_LEVEL, ZT_LOG_RANKS,
// the launcher's rank variables). An invalid ZT_LOG_LEVEL leaves info and says so in one
// warning; `zerotrain` itself refuses it as a usage error before any command runs.
void set_level(Level l);
Level level();
void set_rank(int rank);  // comm::world_group() calls it with the world rank
int rank();
void set_all_ranks(bool all);  // ZT_LOG_RANKS=all
bool all_ranks();
// Forgets every setting: the next use reads the environment again (tests).
void reset_from_env();
// Where lines go (default stderr; tests pass a tmpfile). Not owned.
void set_stream(std::FILE* f);

// Whether a line of level `l` from this rank is printed (level and rank filters).
bool enabled(Level l);

// The line without its '\n' (pure; the tests' view of the format).
std::string format_line(Level l, int rank, std::string_view msg, std::chrono::system_clock::time_point t);

// Writes one line (when enabled). `msg` may hold several lines: each gets the prefix.
void write(Level l, std::string_view msg);

// printf-style shorthands for write().
void error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void debug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "0:07", "12:34", "1:02:03": seconds as [h:]mm:ss ("?" for a negative or non-finite value).
std::string format_duration(double seconds);

// Progress of one long piece of work outside training (convert, checkpoint load,
// tokenize), printed as info from rank 0 (see [Log Lines]):
//  - on a terminal, one bar rewritten in place with '\r' (at most 10 times a second);
//    a log line written meanwhile starts on a fresh line;
//  - otherwise (a log file, a pipe) a plain line when the work passes the next 10% or
//    5 s after the last line, whichever comes first (none in the first second), and one
//    at the end.
// Not thread-safe itself: one thread updates it.
class Progress {
 public:
  // `what` names the work ("convert"), `total` its size in `unit`s ("tensors", "MB").
  Progress(std::string what, double total, std::string unit);
  ~Progress();  // finish() if not called
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of `total` so far; `detail` is appended to the line ("12 documents").
  void update(double done, std::string_view detail = {});
  // The last line (100% and the time taken) and, on a terminal, the end of the bar.
  void finish(std::string_view detail = {});

  // The text of the line at `done` after `seconds` (pure; without timestamp and bar).
  std::string line(double done, double seconds, std::string_view detail) const;

 private:
  void print(double done, std::string_view detail, bool final);

  std::string what_, unit_;
  double total_;
  bool tty_ = false, finished_ = false, shown_ = false;
  double last_fraction_ = 0;
  std::chrono::steady_clock::time_point t0_, last_;
};

}  // namespace zt::log

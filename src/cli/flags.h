// The flags of one `zerotrain` subcommand: declared with their type and range, then
// parsed by CLI11 (third_party/CLI11, included by flags.cpp only, so the parser's
// templates compile once and not in every subcommand).
//
// [CLI Flags] Every subcommand reads its command line the same way:
// - `--name V` and `--name=V` both work (short options: `-n V`, `-nV`); a value flag given
//   twice keeps the last value, list() keeps every value in order;
// - `-h` / `--help` among the command's own arguments (before `--`; for launch, before
//   PROGRAM) makes parse() return false, even in place of a value or beside a bad one (the
//   caller prints its own help text, which lists every flag);
// - a value that is one of the command's flags (`--save --load DIR`) is a missing value;
// - a bad number, an out-of-range value, an unknown flag, a missing value or a stray
//   argument throws UsageError with ONE line naming the command, the flag and the value,
//   e.g. "train: --steps: 'abc' is not a non-negative integer"; main() prints it as
//   "zerotrain train: ..." and exits 2. Errors found later (a missing file, a key that
//   contradicts a flag) stay ConfigError and exit 1.
// Values are converted after the whole command line is read, so `--help` wins over a bad
// value, and the helpers in args.h (parse_count: "1e6" is fine) give the messages.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace zt::cli {

class Flags {
 public:
  // `command` names the subcommand in every message ("train", "bench adam").
  explicit Flags(std::string command);
  ~Flags();
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  // Each `names` is a comma-separated list, the first one named in messages: "--world,-n".
  // An option not given leaves `out` as it was (the default). `out` must outlive parse().

  // Any string.
  void text(const std::string& names, std::string& out);
  // One of `allowed`.
  void choice(const std::string& names, std::string& out, std::vector<std::string> allowed);
  // A non-negative integer as parse_count reads it ("1e6" is fine), in [min, max].
  void count(const std::string& names, int64_t& out, int64_t min = 0,
             int64_t max = std::numeric_limits<int64_t>::max());
  void count(const std::string& names, int& out, int min = 0, int max = std::numeric_limits<int>::max());
  // A finite number >= min and < below.
  void number(const std::string& names, double& out, double min = -std::numeric_limits<double>::infinity(),
              double below = std::numeric_limits<double>::infinity());
  // A switch without a value: true when given.
  void flag(const std::string& names, bool& out);
  // Repeatable: every value, in command-line order, appended to `out`.
  void list(const std::string& names, std::vector<std::string>& out);
  // Arguments that are not flags, in order; fewer than `min` or more than `max` is a
  // UsageError naming `what` ("CONFIG.json").
  void positionals(std::vector<std::string>& out, const std::string& what, size_t min = 0,
                   size_t max = std::numeric_limits<size_t>::max());
  // `launch`: everything from the first argument that is not a flag, or everything after
  // `--`, goes to `out` untouched (the program and its arguments).
  void passthrough(std::vector<std::string>& out);

  // Reads argv[1..argc) (argv[0] is the subcommand's name). Returns false when -h/--help
  // was given (nothing else is checked then); throws UsageError as [CLI Flags] says.
  bool parse(int argc, char** argv);
  // After parse(): whether the option was on the command line (any of its names).
  bool given(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zt::cli

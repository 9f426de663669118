// The logger: see [Log Lines] in log/log.h.
#include "log/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace zt::log {
namespace {

// The process's settings; -1 / unset: read from the environment at first use.
std::mutex g_mu;                    // guards the writes (and the bar state below)
std::atomic<int> g_level{-1};       // a Level, or -1
std::atomic<int> g_rank{-1};        // the world rank, or -1
std::atomic<int> g_all_ranks{-1};   // 0 / 1, or -1
std::atomic<std::FILE*> g_stream{nullptr};  // nullptr: stderr
bool g_bar_open = false;            // a terminal progress bar ends the current line (g_mu)

int env_rank() {
  auto read = [](const char* name) -> int {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return -1;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    return end != v && *end == '\0' && x >= 0 ? static_cast<int>(x) : -1;
  };
  // The order of comm::discover_rank (zerotrain launch, OpenMPI, Slurm, plain RANK).
  if (std::getenv("ZT_LAUNCHER") && read("RANK") >= 0) return read("RANK");
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "RANK"}) {
    if (const int r = read(name); r >= 0) return r;
  }
  return 0;
}

std::FILE* stream() {
  std::FILE* f = g_stream.load();
  return f != nullptr ? f : stderr;
}

void vwrite(Level l, const char* fmt, va_list ap) {
  if (!enabled(l)) return;
  char buf[1024];
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, ap);
  if (n >= 0 && static_cast<size_t>(n) < sizeof(buf)) {
    write(l, std::string_view(buf, static_cast<size_t>(n)));
  } else if (n >= 0) {
    std::string big(static_cast<size_t>(n) + 1, '\0');
    std::vsnprintf(big.data(), big.size(), fmt, ap2);
    big.resize(static_cast<size_t>(n));
    write(l, big);
  }
  va_end(ap2);
}

std::string amount(double x) {
  char b[64];
  std::snprintf(b, sizeof(b), x == std::floor(x) && std::abs(x) < 1e15 ? "%.0f" : "%.1f", x);
  return b;
}

}  // namespace

std::optional<Level> parse_level(std::string_view s) {
  std::string v(s);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "error") return Level::kError;
  if (v == "warn" || v == "warning") return Level::kWarn;
  if (v == "info") return Level::kInfo;
  if (v == "debug") return Level::kDebug;
  return std::nullopt;
}

const char* level_name(Level l) {
  switch (l) {
    case Level::kError: return "ERROR";
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kDebug: return "DEBUG";
  }
  return "?";
}

void set_level(Level l) { g_level = static_cast<int>(l); }

Level level() {
  int v = g_level.load();
  if (v >= 0) return static_cast<Level>(v);
  Level l = Level::kInfo;
  const char* env = std::getenv("ZT_LOG_LEVEL");
  const bool bad = env != nullptr && *env != '\0' && !parse_level(env);
  if (env != nullptr && *env != '\0' && !bad) l = *parse_level(env);
  int expected = -1;
  if (g_level.compare_exchange_strong(expected, static_cast<int>(l)) && bad) {
    warn("ZT_LOG_LEVEL='%s' is not a log level (%s): logging at info", env, kValidLevels);
  }
  return static_cast<Level>(g_level.load());
}

void set_rank(int rank) { g_rank = rank; }

int rank() {
  int r = g_rank.load();
  if (r >= 0) return r;
  int expected = -1;
  g_rank.compare_exchange_strong(expected, env_rank());
  return g_rank.load();
}

void set_all_ranks(bool all) { g_all_ranks = all ? 1 : 0; }

bool all_ranks() {
  int v = g_all_ranks.load();
  if (v >= 0) return v == 1;
  const char* env = std::getenv("ZT_LOG_RANKS");
  int expected = -1;
  g_all_ranks.compare_exchange_strong(expected, env != nullptr && std::string_view(env) == "all" ? 1 : 0);
  return g_all_ranks.load() == 1;
}

void reset_from_env() {
  g_level = -1;
  g_rank = -1;
  g_all_ranks = -1;
}

void set_stream(std::FILE* f) { g_stream = f; }

bool enabled(Level l) {
  if (static_cast<int>(l) > static_cast<int>(level())) return false;
  if (l == Level::kError || l == Level::kWarn) return true;
  return rank() == 0 || all_ranks();
}

std::string format_line(Level l, int rank, std::string_view msg, std::chrono::system_clock::time_point t) {
  const auto since = t.time_since_epoch();
  const std::time_t secs = std::chrono::duration_cast<std::chrono::seconds>(since).count();
  const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(since).count() % 1000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char stamp[64];
  const size_t n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(stamp + n, sizeof(stamp) - n, ".%03d", ms < 0 ? ms + 1000 : ms);
  std::string line;
  line.reserve(48 + msg.size());
  line += stamp;
  line += ' ';
  line += level_name(l);
  line += " [rank ";
  line += std::to_string(rank);
  line += "] ";
  line += msg;
  return line;
}

void write(Level l, std::string_view msg) {
  if (!enabled(l)) return;
  while (!msg.empty() && msg.back() == '\n') msg.remove_suffix(1);
  const auto now = std::chrono::system_clock::now();
  const int r = rank();
  std::string out;
  size_t start = 0;
  do {  // every line of a multi-line message gets the prefix
    const size_t nl = msg.find('\n', start);
    const std::string_view part = msg.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start);
    out += format_line(l, r, part, now);
    out += '\n';
    start = nl == std::string_view::npos ? msg.size() + 1 : nl + 1;
  } while (start <= msg.size());
  std::lock_guard<std::mutex> lock(g_mu);
  std::FILE* f = stream();
  if (g_bar_open) {
    std::fputc('\n', f);
    g_bar_open = false;
  }
  std::fwrite(out.data(), 1, out.size(), f);
  std::fflush(f);
}

#define ZT_LOG_VARIADIC(name, level) \
  void name(const char* fmt, ...) {  \
    va_list ap;                      \
    va_start(ap, fmt);               \
    vwrite(level, fmt, ap);          \
    va_end(ap);                      \
  }
ZT_LOG_VARIADIC(error, Level::kError)
ZT_LOG_VARIADIC(warn, Level::kWarn)
ZT_LOG_VARIADIC(info, Level::kInfo)
ZT_LOG_VARIADIC(debug, Level::kDebug)
#undef ZT_LOG_VARIADIC

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char b[48];
  if (s >= 3600) std::snprintf(b, sizeof(b), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(b, sizeof(b), "%lld:%02lld", s / 60, s % 60);
  return b;
}

// ---------------------------------------------------------------------------------------
// Progress.

Progress::Progress(std::string what, double total, std::string unit)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total) {
  tty_ = enabled(Level::kInfo) && ::isatty(::fileno(stream())) != 0;
  t0_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  if (!finished_ && shown_) {
    // Unwinding (or a caller that forgot): end the bar's line, claim no completion.
    std::lock_guard<std::mutex> lock(g_mu);
    if (tty_ && g_bar_open) {
      std::fputc('\n', stream());
      g_bar_open = false;
    }
  }
}

std::string Progress::line(double done, double seconds, std::string_view detail) const {
  const double frac = total_ > 0 ? std::clamp(done / total_, 0.0, 1.0) : 1.0;
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.0f%%", 100 * frac);
  std::string s = what_ + ": " + pct + " (" + amount(done) + " / " + amount(total_) +
                  (unit_.empty() ? "" : " " + unit_) + "), " + format_duration(seconds) + " elapsed";
  if (frac < 1) s += ", " + (frac > 0 ? format_duration(seconds * (1 - frac) / frac) : std::string("?")) + " left";
  if (!detail.empty()) s += ", " + std::string(detail);
  return s;
}

void Progress::print(double done, std::string_view detail, bool final) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - t0_).count();
  const double frac = total_ > 0 ? std::clamp(done / total_, 0.0, 1.0) : 1.0;
  if (tty_) {
    if (!final && now - last_ < std::chrono::milliseconds(100) && shown_) return;
    constexpr int kWidth = 24;
    const int fill = static_cast<int>(frac * kWidth);
    std::string bar = "\r[" + std::string(static_cast<size_t>(fill), '#') + std::string(static_cast<size_t>(kWidth - fill), ' ') +
                      "] " + line(done, seconds, detail) + "\033[K";  // \033[K: clear the rest of the old bar
    std::lock_guard<std::mutex> lock(g_mu);
    std::FILE* f = stream();
    std::fwrite(bar.data(), 1, bar.size(), f);
    if (final) std::fputc('\n', f);
    std::fflush(f);
    g_bar_open = !final;
  } else {
    // Work done within a second gets its final line only; 100% is finish()'s line.
    // Deciles as integers: 0.2 + 0.1 < 0.3 in floating point.
    const double decile = std::floor(frac * 10 + 1e-9);
    const bool step = now - t0_ >= std::chrono::seconds(1) && frac < 1 &&
                      (decile > std::round(last_fraction_ * 10) || now - last_ >= std::chrono::seconds(5));
    if (!final && !step) return;
    info("%s", line(done, seconds, detail).c_str());
    last_fraction_ = decile / 10;
  }
  shown_ = true;
  last_ = now;
}

void Progress::update(double done, std::string_view detail) {
  if (finished_ || !enabled(Level::kInfo)) return;
  print(done, detail, false);
}

void Progress::finish(std::string_view detail) {
  if (finished_) return;
  finished_ = true;
  if (!enabled(Level::kInfo)) return;
  print(total_, detail, true);
}

}  // namespace zt::log

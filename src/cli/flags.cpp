// Flags on CLI11 (see [CLI Flags] in flags.h). CLI11 splits the command line (`--x=v`,
// `--x v`, `-nV`, `--`, repeated options); the values are kept as the strings given and
// converted here, so every message is zerotrain's one line rather than CLI11's.
#include "cli/flags.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <utility>

#include "cli/args.h"

namespace zt::cli {
namespace {

enum class Kind { kText, kChoice, kCount, kCount32, kNumber, kFlag, kList };

// One declared option and where its value goes.
struct Entry {
  Kind kind;
  std::string name;  // the first of its names: what messages call it
  CLI::Option* opt = nullptr;
  void* out = nullptr;  // std::string*, int64_t*, int*, double*, bool* or std::vector<std::string>* by kind
  int64_t min = 0, max = 0;
  double dmin = 0, below = 0;
  std::vector<std::string> allowed;
};

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

// CLI11's messages can span lines; a usage error is one.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

}  // namespace

struct Flags::Impl {
  std::string command;
  CLI::App app;
  CLI::Option* help = nullptr;
  std::vector<Entry> entries;
  std::vector<std::string>* positionals = nullptr;
  std::string positionals_what;
  size_t positionals_min = 0, positionals_max = 0;
  std::vector<std::string>* passthrough = nullptr;

  explicit Impl(std::string cmd) : command(std::move(cmd)), app("", command) {
    app.set_help_flag();  // ours: the subcommands print their own help texts
    help = app.add_flag("-h,--help");
    app.allow_extras();  // unknown flags and positionals are sorted out in parse()
  }

  [[noreturn]] void fail(const std::string& message) const { throw UsageError(command + ": " + message); }

  Entry& add(Kind kind, const std::string& names, void* out) {
    Entry e;
    e.kind = kind;
    e.name = names.substr(0, names.find(','));
    e.out = out;
    e.opt = kind == Kind::kFlag ? app.add_flag(names) : app.add_option(names);
    if (kind == Kind::kList) e.opt->take_all();
    else e.opt->take_last();  // given twice, the last wins
    entries.push_back(std::move(e));
    return entries.back();
  }

  // A value that is itself one of this command's flags means the flag before it got none
  // (`--save --load DIR`): CLI11 takes the next argument whatever it is.
  void check_not_a_flag(const Entry& e, const std::string& value) const {
    if (value.size() < 2 || value[0] != '-') return;
    const std::string name = value.substr(0, value.find('='));
    for (const auto& other : entries) {
      if (other.opt->check_name(name)) fail(e.name + ": missing value (the next argument is the flag " + name + ")");
    }
  }

  void convert(Entry& e) {
    const std::vector<std::string>& results = e.opt->results();
    if (results.empty()) return;
    const std::string& v = results.back();
    switch (e.kind) {
      case Kind::kFlag:
        for (const auto& r : results)
          if (r != "true") fail(e.name + ": takes no value, got '" + r + "'");
        *static_cast<bool*>(e.out) = true;
        return;
      case Kind::kList:
        for (const auto& r : results) static_cast<std::vector<std::string>*>(e.out)->push_back(r);
        return;
      case Kind::kText:
        *static_cast<std::string*>(e.out) = v;
        return;
      case Kind::kChoice:
        for (const auto& a : e.allowed) {
          if (v == a) {
            *static_cast<std::string*>(e.out) = v;
            return;
          }
        }
        fail(e.name + ": '" + v + "' is not one of " + join(e.allowed, ", "));
      case Kind::kCount:
      case Kind::kCount32: {
        const int64_t n = parse_count(command, e.name, v);
        if (n < e.min || n > e.max) {
          const std::string range = e.max == (e.kind == Kind::kCount ? std::numeric_limits<int64_t>::max()
                                                                       : std::numeric_limits<int>::max())
                                        ? "at least " + std::to_string(e.min)
                                        : "between " + std::to_string(e.min) + " and " + std::to_string(e.max);
          fail(e.name + ": '" + v + "' is out of range (" + e.name + " must be " + range + ")");
        }
        if (e.kind == Kind::kCount) *static_cast<int64_t*>(e.out) = n;
        else *static_cast<int*>(e.out) = static_cast<int>(n);
        return;
      }
      case Kind::kNumber: {
        const double d = parse_number(command, e.name, v);
        if (d < e.dmin || d >= e.below) {
          char range[96];
          if (std::isfinite(e.below)) std::snprintf(range, sizeof(range), "in [%g, %g)", e.dmin, e.below);
          else std::snprintf(range, sizeof(range), "at least %g", e.dmin);
          fail(e.name + ": '" + v + "' is out of range (" + e.name + " must be " + range + ")");
        }
        *static_cast<double*>(e.out) = d;
        return;
      }
    }
  }

  // What CLI11 left over, in order: unknown flags, positionals, `--` and what follows it.
  void sort_remaining() {
    const std::vector<std::string> rest = app.remaining();
    bool after_mark = false;
    for (size_t i = 0; i < rest.size(); ++i) {
      const std::string& r = rest[i];
      if (!after_mark && r == "--") {
        after_mark = true;
        if (passthrough) {
          passthrough->assign(rest.begin() + static_cast<std::ptrdiff_t>(i) + 1, rest.end());
          return;
        }
        continue;
      }
      if (!after_mark && r.size() > 1 && r[0] == '-')
        fail("unknown option '" + r + "' (see zerotrain " + command + " --help)");
      if (passthrough) {
        passthrough->assign(rest.begin() + static_cast<std::ptrdiff_t>(i), rest.end());
        return;
      }
      if (!positionals) fail("unexpected argument '" + r + "' (see zerotrain " + command + " --help)");
      positionals->push_back(r);
    }
  }
};

Flags::Flags(std::string command) : impl_(std::make_unique<Impl>(std::move(command))) {}
Flags::~Flags() = default;

void Flags::text(const std::string& names, std::string& out) { impl_->add(Kind::kText, names, &out); }

void Flags::choice(const std::string& names, std::string& out, std::vector<std::string> allowed) {
  impl_->add(Kind::kChoice, names, &out).allowed = std::move(allowed);
}

void Flags::count(const std::string& names, int64_t& out, int64_t min, int64_t max) {
  Entry& e = impl_->add(Kind::kCount, names, &out);
  e.min = min;
  e.max = max;
}

void Flags::count(const std::string& names, int& out, int min, int max) {
  Entry& e = impl_->add(Kind::kCount32, names, &out);
  e.min = min;
  e.max = max;
}

void Flags::number(const std::string& names, double& out, double min, double below) {
  Entry& e = impl_->add(Kind::kNumber, names, &out);
  e.dmin = min;
  e.below = below;
}

void Flags::flag(const std::string& names, bool& out) { impl_->add(Kind::kFlag, names, &out); }

void Flags::list(const std::string& names, std::vector<std::string>& out) { impl_->add(Kind::kList, names, &out); }

void Flags::positionals(std::vector<std::string>& out, const std::string& what, size_t min, size_t max) {
  impl_->positionals = &out;
  impl_->positionals_what = what;
  impl_->positionals_min = min;
  impl_->positionals_max = max;
}

void Flags::passthrough(std::vector<std::string>& out) {
  impl_->passthrough = &out;
  impl_->app.prefix_command();  // the first positional and everything after it are left over untouched
}

bool Flags::parse(int argc, char** argv) {
  Impl& m = *impl_;
  try {
    m.app.parse(argc, argv);
  } catch (const CLI::ArgumentMismatch& e) {
    if (m.help->count() > 0) return false;
    // Thrown when the arguments ran out before an option's value: "NAME: 1 required TEXT missing".
    const std::string what = e.what();
    const auto colon = what.find(':');
    if (what.ends_with("missing") && colon != std::string::npos) {
      std::string name = what.substr(0, colon);
      for (const auto& entry : m.entries)
        if (entry.opt->check_name(name)) name = entry.name;  // CLI11 says --nproc for -n,--nproc
      m.fail(name + ": missing value (" + name + " V or " + name + "=V)");
    }
    m.fail(one_line(what));
  } catch (const CLI::ParseError& e) {
    if (m.help->count() > 0) return false;
    m.fail(one_line(e.what()));
  }
  if (m.help->count() > 0) return false;
  for (const auto& e : m.entries) {
    if (e.kind == Kind::kFlag) continue;
    for (const auto& r : e.opt->results()) {
      if (r == "-h" || r == "--help") return false;  // `--config --help`: help, not a config named --help
      m.check_not_a_flag(e, r);
    }
  }
  m.sort_remaining();
  for (auto& e : m.entries) m.convert(e);
  if (m.positionals) {
    const std::vector<std::string>& got = *m.positionals;
    if (got.size() < m.positionals_min || got.size() > m.positionals_max) {
      std::string listed;
      for (const auto& g : got) listed += (listed.empty() ? "'" : ", '") + g + "'";
      m.fail("needs " + m.positionals_what + ", got " + (got.empty() ? "none" : listed) + " (see zerotrain " +
             m.command + " --help)");
    }
  }
  return true;
}

bool Flags::given(const std::string& name) const {
  for (const auto& e : impl_->entries)
    if (e.opt->check_name(name)) return e.opt->count() > 0;
  return false;
}

}  // namespace zt::cli

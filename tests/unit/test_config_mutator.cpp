// The config mutator: thousands of seeded, deterministic mutations of every config in
// configs/ and of real-world DeepSpeed configs (tests/fixtures/ds_configs/, sources in
// its README), parsed in-process. Two promises are checked on every one:
//   - nothing crashes: only zt::ConfigError may leave the parser (a signal would kill
//     this test; any other exception, a raw JSON library one included, is a failure);
//   - every rejection names a key: each line of the ConfigError names a key of the
//     config (as a whole word), so the user knows where to look.
// A config that is accepted must have consistent, positive batch sizes
// (train = micro x accumulation x world) and must survive to_json() and a second parse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "zerotrain/config.h"
#include "zerotrain/error.h"

namespace zt_test_config_mutator {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// splitmix64: the same sequence on every platform (std distributions are not).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  bool coin() { return next() & 1; }
};

std::vector<fs::path> seed_configs() {
  std::vector<fs::path> out;
  for (const char* dir : {"configs", "tests/fixtures/ds_configs"}) {
    for (const auto& e : fs::directory_iterator(fs::path(ZT_SOURCE_DIR) / dir))
      if (e.path().extension() == ".json") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The launcher's part (what zerotrain train / the HF Trainer do): numbers for the
// "auto" values that have no default.
json fill_launcher_autos(json j) {
  for (const auto& a : zt::Config::auto_keys(j)) {
    if (!a.needs_value) continue;
    if (a.path == "train_batch_size") {
      j.erase("train_batch_size");
    } else if (a.path == "train_micro_batch_size_per_gpu" || a.path == "gradient_accumulation_steps") {
      j[a.path] = 2;
    } else if (a.path == "gradient_clipping") {
      j[a.path] = 1.0;
    } else {
      std::string p = "/" + a.path;
      for (auto& c : p) c = c == '.' ? '/' : c;
      j[json::json_pointer(p)] = 100;
    }
  }
  return j;
}

// Every location of a value (not the root) as a JSON pointer, and every key.
void locations(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out,
               std::set<std::string>& keys) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      keys.insert(it.key());
      out.push_back(at / it.key());
      locations(*it, at / it.key(), out, keys);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(at / i);
      locations(j[i], at / i, out, keys);
    }
  }
}

json nested(Rng& r, int depth) {
  json v = 1;
  for (int i = 0; i < depth; ++i) v = r.coin() ? json::array({v}) : json{{"k", v}};
  return v;
}

// A value of a wrong type, an absurd size or an odd spelling.
json odd_value(Rng& r) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  switch (r.below(30)) {
    case 0: return "abc";
    case 1: return "12";
    case 2: return "true";
    case 3: return true;
    case 4: return false;
    case 5: return nullptr;
    case 6: return json::array();
    case 7: return json::object();
    case 8: return json::array({1, 2, 3});
    case 9: return json{{"x", 1}};
    case 10: return int64_t{1} << 62;
    case 11: return int64_t{1} << 32;
    case 12: return std::numeric_limits<int64_t>::max();
    case 13: return std::numeric_limits<int64_t>::min();
    case 14: return std::numeric_limits<uint64_t>::max();
    case 15: return -1;
    case 16: return 0;
    case 17: return 1e308;
    case 18: return -1e308;
    case 19: return 5e-324;
    case 20: return nan;
    case 21: return inf;
    case 22: return -inf;
    case 23: return "NaN";
    case 24: return "-Infinity";
    case 25: return "auto";
    case 26: return 0.5;
    case 27: return std::string("\xff\xfe bad utf-8");
    case 28: return "";
    default: return nested(r, 1 + static_cast<int>(r.below(zt::Config::kMaxJsonDepth + 8)));
  }
}

std::string renamed(Rng& r, std::string key) {
  if (key.empty()) return "x";
  switch (r.below(6)) {
    case 0: key.erase(r.below(key.size()), 1); break;                      // a dropped letter
    case 1: key.insert(r.below(key.size() + 1), 1, 'x'); break;            // an extra letter
    case 2:
      for (auto& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      break;  // WRONG CASE
    case 3: key[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(key[0]))); break;
    case 4:
      for (auto& c : key) c = c == '_' ? '-' : c;
      key += key.find('-') == std::string::npos ? "_v2" : "";
      break;  // kebab-case
    default: key += "s"; break;
  }
  return key;
}

// One mutation of `j` in place; false when it could not apply (an empty object).
bool mutate(Rng& r, json& j) {
  std::vector<json::json_pointer> at;
  std::set<std::string> keys;
  locations(j, json::json_pointer(), at, keys);
  if (at.empty()) return false;
  const json::json_pointer p = at[r.below(at.size())];
  const json::json_pointer parent = p.parent_pointer();
  json& container = j[parent];
  const std::string last = p.back();
  switch (r.below(8)) {
    case 0:  // delete it
      if (container.is_object()) container.erase(last);
      else container.erase(static_cast<size_t>(std::stoul(last)));
      return true;
    case 1:
    case 2:
    case 3: j[p] = odd_value(r); return true;
    case 4:
    case 5: {  // renamed or wrong-case key
      if (!container.is_object()) return false;
      json v = container[last];
      container.erase(last);
      container[renamed(r, last)] = v;
      return true;
    }
    case 6: {  // an unknown key beside it
      json& target = container.is_object() ? container : j;
      target[renamed(r, last) + "_extra"] = odd_value(r);
      return true;
    }
    default: {  // a number nudged to a boundary
      if (!j[p].is_number()) {
        j[p] = odd_value(r);
        return true;
      }
      const double d = j[p].get<double>();
      const json choices[] = {-d, d * 1e300, d + 0.5, std::floor(d) - 1, std::ldexp(1.0, 63), std::ldexp(1.0, 64)};
      j[p] = choices[r.below(6)];
      return true;
    }
  }
}

// Whole words of a message (identifier characters and dots).
std::set<std::string> words(const std::string& s) {
  std::set<std::string> out;
  std::string w;
  for (char c : s + " ") {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.') {
      w += c;
    } else if (!w.empty()) {
      out.insert(w);
      // dotted paths also count by their segments
      std::stringstream ss(w);
      std::string seg;
      while (std::getline(ss, seg, '.')) out.insert(seg);
      w.clear();
    }
  }
  return out;
}

// The lines of a ConfigError: the bullets of a multi-error message, else the message.
std::vector<std::string> error_lines(const std::string& what) {
  std::vector<std::string> out;
  size_t pos = what.find("\n  - ");
  if (pos == std::string::npos) return {what};
  while (pos != std::string::npos) {
    size_t next = what.find("\n  - ", pos + 5);
    out.push_back(what.substr(pos + 5, next == std::string::npos ? std::string::npos : next - pos - 5));
    pos = next;
  }
  return out;
}

struct Tally {
  int cases = 0, accepted = 0, rejected = 0;
};

// Parses `j` for `world` ranks; records a failure for any crash-like outcome or an
// unnamed rejection. `keys`: the words that count as naming a key.
void check_one(const json& j, int world, const std::set<std::string>& keys, const std::string& trace, Tally& t) {
  ++t.cases;
  try {
    zt::Config c = zt::Config::from_json(j, world, "mutant.json");
    (void)zt::Config::auto_keys(j);
    ++t.accepted;
    ASSERT_GT(c.train_micro_batch_size_per_gpu, 0) << trace;
    ASSERT_GT(c.gradient_accumulation_steps, 0) << trace;
    __int128 product = __int128(c.train_micro_batch_size_per_gpu) * c.gradient_accumulation_steps * world;
    ASSERT_TRUE(product == c.train_batch_size) << "train_batch_size " << c.train_batch_size << " != micro "
                                               << c.train_micro_batch_size_per_gpu << " x accumulation "
                                               << c.gradient_accumulation_steps << " x world " << world << "\n"
                                               << trace;
    try {
      zt::Config again = zt::Config::parse(c.to_json(), world, "round-trip");
      ASSERT_EQ(again.train_batch_size, c.train_batch_size) << trace;
    } catch (const std::exception& e) {
      FAIL() << "an accepted config does not parse back from to_json(): " << e.what() << "\n" << trace;
    }
  } catch (const zt::ConfigError& e) {
    ++t.rejected;
    const std::string what = e.what();
    for (const auto& line : error_lines(what)) {
      const auto w = words(line);
      bool named = false;
      for (const auto& k : w) named = named || keys.count(k);
      // A mangled key (brackets or quotes inside it) is named whole, not as one word.
      for (const auto& k : keys) named = named || (k.size() >= 3 && line.find(k) != std::string::npos);
      ASSERT_TRUE(named) << "a rejection that names no key: \"" << line << "\"\nwhole message: " << what << "\n"
                         << trace;
    }
  } catch (const std::exception& e) {
    FAIL() << "not a ConfigError: " << typeid(e).name() << ": " << e.what() << "\n" << trace;
  }
}

// Keys that count as named in a message: the original's and the mutant's, and the
// top-level DeepSpeed keys a message may point to when the config lacks them.
std::set<std::string> known_keys(const json& a, const json& b) {
  std::set<std::string> keys = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                "gradient_clipping", "zero_optimization", "optimizer", "scheduler", "fp16", "bf16",
                                "stage", "type", "params", "offload_optimizer", "offload_param", "aio"};
  std::vector<json::json_pointer> unused;
  locations(a, json::json_pointer(), unused, keys);
  locations(b, json::json_pointer(), unused, keys);
  return keys;
}

constexpr int kWorlds[] = {1, 2, 3, 4, 8, 1 << 20};

TEST(ConfigMutator, TreeMutationsNeverCrashAndNameTheKey) {
  constexpr int kPerConfig = 300;
  Tally t;
  const auto seeds = seed_configs();
  ASSERT_GE(seeds.size(), 20u) << "configs/ and tests/fixtures/ds_configs/ hold the seeds";
  for (size_t f = 0; f < seeds.size(); ++f) {
    const json original = zt::Config::read_json_file(seeds[f].string());
    const json base = fill_launcher_autos(original);
    Rng r{0x5eed0000 + f};
    for (int i = 0; i < kPerConfig; ++i) {
      json j = base;
      const int n = 1 + static_cast<int>(r.below(3));
      for (int k = 0; k < n; ++k) mutate(r, j);
      const int world = kWorlds[r.below(std::size(kWorlds))];
      const std::string trace = seeds[f].filename().string() + " mutation " + std::to_string(i) + " world " +
                                std::to_string(world) + ": " +
                                j.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 600);
      check_one(j, world, known_keys(original, j), trace, t);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("[mutator] %d tree mutations of %zu configs: %d accepted, %d rejected (each naming a key)\n", t.cases,
              seeds.size(), t.accepted, t.rejected);
  EXPECT_GE(t.cases, 5000);
  EXPECT_GT(t.accepted, t.cases / 20) << "the mutations should not all be rejected";
}

// Text-level damage: truncation, stray bytes, duplicate keys, numbers beyond a double,
// very deep nesting. The reader must answer with a ConfigError naming the file.
TEST(ConfigMutator, TextMutationsNeverCrashAndNameTheFile) {
  constexpr int kPerConfig = 60;
  Tally t;
  int parsed = 0;
  const auto seeds = seed_configs();
  for (size_t f = 0; f < seeds.size(); ++f) {
    std::ifstream in(seeds[f]);
    const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Rng r{0x7e470000 + f};
    for (int i = 0; i < kPerConfig; ++i) {
      std::string text = original;
      const size_t at = r.below(text.size());
      switch (r.below(7)) {
        case 0: text.resize(at); break;
        case 1: text[at] = static_cast<char>(r.below(256)); break;
        case 2: text.insert(at, std::string(60000, '[')); break;
        case 3: {  // a number beyond a double where a value starts
          size_t colon = text.find(':', at);
          if (colon != std::string::npos) text.insert(colon + 1, r.coin() ? " 1e400," : " -1e400,");
          break;
        }
        case 4: {  // a key written twice
          size_t open = text.find('{', at);
          size_t key_end = open == std::string::npos ? open : text.find(',', open);
          if (key_end != std::string::npos) text.insert(key_end + 1, text.substr(open + 1, key_end - open));
          break;
        }
        case 5: text.insert(at, "/* a comment */"); break;
        default: text.insert(at, std::string(1, '\0')); break;
      }
      ++t.cases;
      try {
        json j = zt::Config::parse_json_text(text, "mutant.json");
        ++parsed;
        Tally inner;
        if (j.is_object()) check_one(j, 2, known_keys(j, j), "text mutation " + std::to_string(i), inner);
      } catch (const zt::ConfigError& e) {
        ++t.rejected;
        ASSERT_EQ(std::string(e.what()).rfind("mutant.json: ", 0), 0u) << e.what();
        ASSERT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
      } catch (const std::exception& e) {
        FAIL() << "not a ConfigError: " << e.what() << " (" << seeds[f].filename() << " text mutation " << i << ")";
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("[mutator] %d text mutations: %d parsed as JSON, %d rejected naming the file\n", t.cases, parsed,
              t.rejected);
  EXPECT_GE(t.cases, 1000);
}

}  // namespace

}  // namespace zt_test_config_mutator

#include "lora/lora_spec.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "zerotrain/error.h"

namespace zt::lora {
namespace {

constexpr const char* kKeys = "r=N, alpha=X, dropout=X, targets=A|B|..., regex=RE (last), rslora";

double number(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  ZT_CHECK_T(!v.empty() && end == v.c_str() + v.size() && std::isfinite(d), ConfigError, "--lora: ", key, "=", v,
             " is not a number");
  return d;
}

}  // namespace

LoraOptions parse_lora_spec(const std::string& spec) {
  LoraOptions o;
  bool alpha_set = false;
  size_t pos = 0;
  while (pos < spec.size()) {
    if (spec.compare(pos, 6, "regex=") == 0) {  // takes the rest: a regex may hold ',' and '|'
      o.target_regex = spec.substr(pos + 6);
      ZT_CHECK_T(!o.target_regex.empty(), ConfigError, "--lora: regex= is empty");
      break;
    }
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "rslora" && eq == std::string::npos) {
      o.use_rslora = true;
    } else if (eq == std::string::npos) {
      throw ConfigError(detail::cat("--lora: '", item, "' is not KEY=VALUE or rslora (keys: ", kKeys, ")"));
    } else if (key == "r") {
      const double r = number(key, value);
      ZT_CHECK_T(r == std::floor(r) && r > 0, ConfigError, "--lora: r=", value, " must be a positive integer");
      o.r = static_cast<int64_t>(r);
    } else if (key == "alpha") {
      o.alpha = number(key, value);
      alpha_set = true;
    } else if (key == "dropout") {
      o.dropout = number(key, value);
    } else if (key == "targets") {
      std::stringstream ss(value);
      std::string t;
      while (std::getline(ss, t, '|')) {
        ZT_CHECK_T(!t.empty(), ConfigError, "--lora: targets=", value, " has an empty name");
        o.target_modules.push_back(t);
      }
    } else {
      throw ConfigError(detail::cat("--lora: unknown key '", key, "' (keys: ", kKeys, ")"));
    }
  }
  if (!alpha_set) o.alpha = static_cast<double>(o.r);
  o.validate();
  return o;
}

std::string lora_spec_string(const LoraOptions& o) {
  std::ostringstream os;
  os << "r=" << o.r << ",alpha=" << o.alpha << ",dropout=" << o.dropout;
  if (o.use_rslora) os << ",rslora";
  if (!o.target_modules.empty()) {
    os << ",targets=";
    for (size_t i = 0; i < o.target_modules.size(); ++i) os << (i ? "|" : "") << o.target_modules[i];
  }
  if (!o.target_regex.empty()) os << ",regex=" << o.target_regex;
  return os.str();
}

}  // namespace zt::lora

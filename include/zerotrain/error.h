// zerotrain errors: every user-facing failure is a typed exception whose message names
// what went wrong and how to fix it. Library code never exits; only main() turns an
// Error into an exit code.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace zt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class ConfigError : public Error { using Error::Error; };
class CommError : public Error { using Error::Error; };
class CheckpointError : public Error { using Error::Error; };
class TrainingError : public Error { using Error::Error; };
class InternalError : public Error { using Error::Error; };

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace zt

// ZT_CHECK(cond, ErrorType, msg...) throws ErrorType(msg) when cond is false.
#define ZT_CHECK_T(cond, Type, ...)                              \
  do {                                                           \
    if (!(cond)) throw Type(::zt::detail::cat(__VA_ARGS__));     \
  } while (0)
#define ZT_CHECK(cond, ...) ZT_CHECK_T(cond, ::zt::Error, __VA_ARGS__)
// Internal invariant: a failure is a zerotrain bug, reported with file:line.
#define ZT_ASSERT(cond, ...)                                                         \
  do {                                                                               \
    if (!(cond))                                                                     \
      throw ::zt::InternalError(::zt::detail::cat("internal error at ", __FILE__, ":", \
                                                  __LINE__, ": ", #cond, " ", ##__VA_ARGS__)); \
  } while (0)

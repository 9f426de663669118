// Helpers shared by the communication tests on CPU ranks (tests/dist) and GPUs
// (tests/gpu): an exact tensor comparison that names the first wrong element, the
// CommError a call throws, and the point-to-point test messages. Header-only.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "zerotrain/error.h"

namespace zt::test_support {

// Exact comparison (actual may be on any device); on mismatch names the first wrong
// element.
inline ::testing::AssertionResult same(const at::Tensor& actual_any, const at::Tensor& expected) {
  const at::Tensor actual = actual_any.cpu();
  if (actual.scalar_type() != expected.scalar_type() || actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "got " << actual.sizes() << " " << actual.scalar_type() << ", expected "
                                         << expected.sizes() << " " << expected.scalar_type();
  }
  if (at::equal(actual, expected)) return ::testing::AssertionSuccess();
  at::Tensor a = actual.to(at::kDouble).flatten(), e = expected.to(at::kDouble).flatten();
  at::Tensor bad = (a != e).nonzero();
  const int64_t k = bad[0].item<int64_t>();
  return ::testing::AssertionFailure() << bad.size(0) << " of " << a.numel() << " elements differ; first at [" << k
                                       << "]: got " << a[k].item<double>() << ", expected " << e[k].item<double>();
}

// Runs `fn` and returns the CommError message it throws ("" and a failure if none).
template <typename Fn>
std::string comm_error(Fn fn) {
  try {
    fn();
  } catch (const CommError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CommError";
  return "";
}

// Point-to-point message m from rank `from` to rank `to`: n elements of dtype dt (made on
// the CPU), distinct per (from, to, m) and exact in dt (values below 256 for the 16-bit
// floats and int8; bool alternates with a phase set by the triple).
inline at::Tensor payload(int from, int to, int m, int64_t n, at::ScalarType dt) {
  at::Tensor i = at::arange(n, at::kLong);
  if (dt == at::kBool) return (i + from + 2 * to + m).remainder(2).to(at::kBool);
  const int64_t key = 16 * from + 4 * to + m % 4;  // < 64 for 4 ranks
  at::Tensor v = (i.remainder(3) * 64 + key);      // < 256
  if (dt == at::kFloat || dt == at::kDouble || dt == at::kLong || dt == at::kInt) v = v + 1000 * m + i;
  if (dt == at::kChar) v = v.remainder(128);
  return v.to(dt);
}

}  // namespace zt::test_support

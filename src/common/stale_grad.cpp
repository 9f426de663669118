// [Stale Gradients] (stale_grad.h).
#include "common/stale_grad.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

namespace zt {
namespace {

// Process-wide: a backward runs on autograd's device thread while its owner's zero_grad ran
// on the caller's; every access takes the lock (a few hundred per step).
std::mutex g_stale_mutex;
std::unordered_set<const void*>& stale_set() {
  static std::unordered_set<const void*> s;
  return s;
}

const void* stale_key(const torch::Tensor& g) {
  return g.defined() && g.numel() > 0 ? g.data_ptr() : nullptr;
}

// -1: not read yet; 0 off; 1 on.
std::atomic<int> g_stale_enabled{-1};

}  // namespace

bool stale_grads_enabled() {
  int v = g_stale_enabled.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("ZT_STALE_GRADS");
    v = e == nullptr || std::strcmp(e, "0") != 0 ? 1 : 0;
    int expected = -1;
    if (!g_stale_enabled.compare_exchange_strong(expected, v)) v = expected;
  }
  return v == 1;
}

void set_stale_grads_enabled(bool on) { g_stale_enabled.store(on ? 1 : 0); }

void mark_grad_stale(const torch::Tensor& g) {
  const void* k = stale_key(g);
  if (k == nullptr) return;
  std::lock_guard<std::mutex> lock(g_stale_mutex);
  stale_set().insert(k);
}

bool take_grad_stale(const torch::Tensor& g) {
  const void* k = stale_key(g);
  if (k == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_stale_mutex);
  return stale_set().erase(k) > 0;
}

bool grad_is_stale(const torch::Tensor& g) {
  const void* k = stale_key(g);
  if (k == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_stale_mutex);
  return stale_set().count(k) > 0;
}

bool settle_grad(torch::Tensor g) {
  if (!take_grad_stale(g)) return false;
  g.zero_();
  return true;
}

void forget_grad(const torch::Tensor& g) { (void)take_grad_stale(g); }

size_t stale_grad_count() {
  std::lock_guard<std::mutex> lock(g_stale_mutex);
  return stale_set().size();
}

}  // namespace zt

// Counts the bytes of live CPU tensors: a c10::Allocator that wraps LibTorch's CPU
// allocator for one measurement, so "bytes held after forward minus before" is what the
// autograd graph keeps for backward (activations, plus the scalar loss). Header-only.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace zt::test_support {

class CpuByteCounter final : public c10::Allocator {
 public:
  // data == context (as LibTorch's own CPU allocator), so ops that use raw_allocate (oneDNN's
  // bf16 matmul on the CPU) work with the counter installed; the size is kept in a table.
  c10::DataPtr allocate(size_t n) override {
    void* data = base_->raw_allocate(n);
    {
      std::lock_guard<std::mutex> lock(table_mutex());
      table()[data] = Entry{n, this, base_->raw_deleter()};
    }
    const int64_t now = live_ += static_cast<int64_t>(n);
    for (int64_t p = peak_.load(); now > p && !peak_.compare_exchange_weak(p, now);) {
    }
    return {data, data, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  // Bytes of the tensors allocated while installed and not yet freed.
  int64_t live() const { return live_.load(); }
  // The most bytes live at once since the last reset_peak() (or since construction).
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }
  // Installs the counter as the CPU allocator until the guard goes away. The counter must
  // outlive every tensor allocated through it (make it static).
  struct Scope {
    explicit Scope(CpuByteCounter& a) : previous(c10::GetCPUAllocator()) {
      a.base_ = previous;
      c10::SetCPUAllocator(&a, kPriority);
    }
    ~Scope() { c10::SetCPUAllocator(previous, kPriority); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    c10::Allocator* previous;
  };

 private:
  static constexpr uint8_t kPriority = 200;
  struct Entry {
    size_t n;
    CpuByteCounter* self;
    c10::DeleterFnPtr free;  // the wrapped allocator's
  };
  // Live blocks of every counter (a block may be freed after its Scope ended).
  static std::unordered_map<void*, Entry>& table() {
    static std::unordered_map<void*, Entry> t;
    return t;
  }
  static std::mutex& table_mutex() {
    static std::mutex m;
    return m;
  }
  static void release(void* p) {
    if (p == nullptr) return;
    Entry e;
    {
      std::lock_guard<std::mutex> lock(table_mutex());
      auto it = table().find(p);
      if (it == table().end()) return;  // not ours: cannot happen for a DataPtr we made
      e = it->second;
      table().erase(it);
    }
    e.self->live_ -= static_cast<int64_t>(e.n);
    e.free(p);
  }
  c10::Allocator* base_ = nullptr;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace zt::test_support

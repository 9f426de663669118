// Counts the bytes of live CPU tensors: a c10::Allocator that wraps LibTorch's CPU
// allocator for one measurement, so "bytes held after forward minus before" is what the
// autograd graph keeps for backward (activations, plus the scalar loss). Header-only.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace zt::test_support {

class CpuByteCounter final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    auto* ctx = new Block{base_->allocate(n), n, this};
    live_ += static_cast<int64_t>(n);
    void* data = ctx->inner.get();
    return {data, ctx, &release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
  // Bytes of the tensors allocated while installed and not yet freed.
  int64_t live() const { return live_.load(); }
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
  struct Block {
    c10::DataPtr inner;
    size_t n;
    CpuByteCounter* self;
  };
  static void release(void* p) {
    auto* b = static_cast<Block*>(p);
    b->self->live_ -= static_cast<int64_t>(b->n);
    delete b;
  }
  c10::Allocator* base_ = nullptr;
  std::atomic<int64_t> live_{0};
};

}  // namespace zt::test_support

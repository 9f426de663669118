// bench_nf4: QLoRA's NF4 costs on one matrix (quant/nf4.h, [NF4 On Device]).
//
//   build/bench_nf4 [--rows 4096] [--cols 14336] [--iters 5] [--device cpu|cuda]
//
// One JSON line per result:
//   quantize_cpu   quantize_nf4 of a (rows, cols) fp32 CPU matrix (blocks over the intra-op
//                  threads; `threads` says how many). Validated: the 4-bit codes of the first
//                  min(rows*cols, 4 Mi) elements quantized alone, on one thread, are the same
//                  bytes (a block's codes depend only on its block).
//   dequant_<dt>   dequantize_nf4_as(q, dt) on the device (the CUDA kernel on cuda, torch ops
//                  on cpu); GB/s counts the bytes read (0.52 a weight) and written (dtype).
//                  Validated: bit-equal to dequantize_nf4(q).to(dt) (the reference).
// On cuda the timing is `iters` calls between two CUDA events after one warm-up call.
// Exits 1 if a check failed.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

#include "quant/nf4.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

torch::Tensor bits(const torch::Tensor& t) {
  return t.element_size() == 4 ? t.contiguous().view(torch::kInt32) : t.contiguous().view(torch::kInt16);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 4096, cols = 14336, iters = 5;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--rows") rows = std::atoll(argv[i + 1]);
    else if (k == "--cols") cols = std::atoll(argv[i + 1]);
    else if (k == "--iters") iters = std::atoll(argv[i + 1]);
    else if (k == "--device") device = argv[i + 1];
    else {
      std::fprintf(stderr, "bench_nf4: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  bool ok = true;
  torch::manual_seed(1);
  const torch::Tensor w = torch::randn({rows, cols}) * 0.02;

  const auto t0 = std::chrono::steady_clock::now();
  zt::quant::Nf4Tensor q = zt::quant::quantize_nf4(w);
  const double tq = seconds_since(t0);
  {
    const int64_t n = std::min<int64_t>(w.numel(), 4 << 20);
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    const auto head = zt::quant::quantize_nf4(w.view(-1).narrow(0, 0, n));
    at::set_num_threads(threads);
    const bool same = torch::equal(head.packed, q.packed.narrow(0, 0, head.packed.numel()));
    ok &= same;
    std::printf("{\"bench\":\"nf4\",\"op\":\"quantize_cpu\",\"rows\":%lld,\"cols\":%lld,\"threads\":%d,\"seconds\":%.4f,"
                "\"mweights_per_s\":%.1f,\"valid\":%s}\n",
                static_cast<long long>(rows), static_cast<long long>(cols), threads, tq, w.numel() / tq / 1e6,
                same ? "true" : "false");
  }

  const torch::Device dev(device);
  q = zt::quant::nf4_to(q, dev);
  const torch::Tensor ref = zt::quant::dequantize_nf4(q);
  for (auto dt : {torch::kFloat32, torch::kBFloat16}) {
    torch::Tensor out = zt::quant::dequantize_nf4_as(q, dt);  // warm-up
    double sec = 0;
    if (dev.is_cuda()) {
#ifdef ZT_WITH_CUDA
      at::cuda::CUDAEvent a(cudaEventDefault), b(cudaEventDefault);
      a.record();
      for (int64_t i = 0; i < iters; ++i) out = zt::quant::dequantize_nf4_as(q, dt);
      b.record();
      b.synchronize();
      sec = a.elapsed_time(b) / 1e3 / iters;
#endif
    } else {
      const auto t1 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < iters; ++i) out = zt::quant::dequantize_nf4_as(q, dt);
      sec = seconds_since(t1) / iters;
    }
    const bool same = torch::equal(bits(out.cpu()), bits(ref.to(dt)));
    ok &= same;
    const double bytes = static_cast<double>(q.packed.numel() + q.qabsmax.numel() + 4 * q.absmax2.numel()) +
                         static_cast<double>(w.numel()) * out.element_size();
    std::printf("{\"bench\":\"nf4\",\"op\":\"dequant_%s\",\"device\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"us\":%.1f,"
                "\"gb_per_s\":%.1f,\"valid\":%s}\n",
                dt == torch::kFloat32 ? "f32" : "bf16", device.c_str(), static_cast<long long>(rows),
                static_cast<long long>(cols), sec * 1e6, bytes / sec / 1e9, same ? "true" : "false");
  }
  return ok ? 0 : 1;
}

// zerotrain bench adam: CPU Adam throughput per kernel and thread count, next to a
// STREAM-like triad of the same machine and threads, so each result reads as a fraction of
// the memory-bandwidth floor. Every timed configuration is validated against the scalar
// kernel on three slices of its first (warm-up) step.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "optim/cpu_adam.h"
#include "optim/cpu_adam_impl.h"
#include "zerotrain/error.h"

namespace zt::cli {
namespace {

using optim::CpuKernel;
using optim::detail::Dt;

constexpr const char* kBenchAdamUsage =
    "usage: zerotrain bench adam [--params N] [--threads a,b,c] [--kernel all|scalar|avx2|avx512]\n"
    "                            [--grad-dtype bf16|fp16|fp32] [--out-dtype bf16|fp16|none]\n"
    "                            [--iters K] [--triad-elems N] [--json PATH]\n"
    "  --params N       parameters in the shard (default 774e6, GPT-2 large)\n"
    "  --threads LIST   OpenMP thread counts (default 1,2,4,... up to the cores, and all cores)\n"
    "  --kernel K       kernels to time (default all that this CPU supports)\n"
    "  --grad-dtype D   gradient storage (default bf16)\n"
    "  --out-dtype D    updated-param copy for the upload (default: grad dtype, none for fp32)\n"
    "  --iters K        timed steps per configuration, median reported (default 5, after 1 warm-up)\n"
    "  --triad-elems N  floats per triad array (default clamp(params, 2^24, 2^27))\n"
    "  --json PATH      also append the JSON lines to PATH\n"
    "Bytes per parameter: grad (2 or 4) + param r/w 8 + exp_avg r/w 8 + exp_avg_sq r/w 8 + out (0 or 2);\n"
    "28 B for bf16 grads with a bf16 copy. Triad a = b + s*c moves 12 B per element (non-temporal stores).\n";

struct Options {
  int64_t params = 774'000'000;
  std::vector<int> threads;
  std::vector<CpuKernel> kernels;
  Dt grad_dt = Dt::kBf16;
  Dt out_dt = Dt::kBf16;
  bool out_given = false;
  int iters = 5;
  int64_t triad_elems = 0;
  std::string json_path;
};

Dt parse_dt(const std::string& flag, const std::string& s, bool allow_none) {
  if (s == "bf16") return Dt::kBf16;
  if (s == "fp16") return Dt::kF16;
  if (s == "fp32" && !allow_none) return Dt::kF32;
  if (s == "none" && allow_none) return Dt::kNone;
  throw UsageError(zt::detail::cat("bench adam: ", flag, ": '", s, "' is not one of ",
                                   allow_none ? "bf16, fp16, none" : "bf16, fp16, fp32"));
}

const char* dt_name(Dt d) {
  switch (d) {
    case Dt::kF32: return "fp32";
    case Dt::kBf16: return "bf16";
    case Dt::kF16: return "fp16";
    default: return "none";
  }
}

at::ScalarType scalar_type(Dt d) {
  switch (d) {
    case Dt::kF32: return at::kFloat;
    case Dt::kBf16: return at::kBFloat16;
    case Dt::kF16: return at::kHalf;
    default: return at::ScalarType::Undefined;
  }
}

std::vector<int> default_threads() {
  int cores = omp_get_num_procs();
  std::vector<int> t;
  for (int x = 1; x < cores; x *= 2) t.push_back(x);
  t.push_back(cores);
  return t;
}

// Returns false for --help.
bool parse_bench_adam(int argc, char** argv, Options& o) {
  std::string kernel = "all", threads, grad_dtype = "bf16", out_dtype;
  Flags f("bench adam");
  f.count("--params", o.params, 1);
  f.text("--threads", threads);
  f.choice("--kernel", kernel, {"all", "scalar", "avx2", "avx512"});
  f.choice("--grad-dtype", grad_dtype, {"bf16", "fp16", "fp32"});
  f.choice("--out-dtype", out_dtype, {"bf16", "fp16", "none"});
  f.count("--iters", o.iters, 1);
  f.count("--triad-elems", o.triad_elems, 1);
  f.text("--json", o.json_path);
  if (!f.parse(argc, argv)) return false;
  o.grad_dt = parse_dt("--grad-dtype", grad_dtype, false);
  o.out_given = f.given("--out-dtype");
  if (o.out_given) o.out_dt = parse_dt("--out-dtype", out_dtype, true);
  size_t pos = 0;
  while (!threads.empty() && pos <= threads.size()) {  // "1,2,4"
    const size_t comma = threads.find(',', pos);
    const std::string item = threads.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    const int64_t t = parse_count("bench adam", "--threads", item);
    ZT_CHECK_T(t >= 1 && t <= 1 << 16, UsageError, "bench adam: --threads: '", item,
               "' is out of range (--threads must be at least 1)");
    o.threads.push_back(static_cast<int>(t));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!o.out_given) o.out_dt = o.grad_dt == Dt::kF32 ? Dt::kNone : o.grad_dt;
  if (o.threads.empty()) o.threads = default_threads();
  if (kernel == "all") {
    for (CpuKernel k : {CpuKernel::kScalar, CpuKernel::kAvx2, CpuKernel::kAvx512})
      if (optim::cpu_kernel_supported(k)) o.kernels.push_back(k);
      else std::fprintf(stderr, "bench adam: skipping %s: not supported by this CPU\n", optim::kernel_name(k));
  } else {
    CpuKernel k = optim::parse_cpu_kernel(kernel.c_str());
    ZT_CHECK(k != CpuKernel::kAuto, "--kernel takes all, scalar, avx2 or avx512");
    ZT_CHECK(optim::cpu_kernel_supported(k), "--kernel ", kernel, ": this CPU lacks the instructions");
    o.kernels.push_back(k);
  }
  if (o.triad_elems == 0) o.triad_elems = std::clamp<int64_t>(o.params, int64_t{1} << 24, int64_t{1} << 27);
  return true;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// splitmix64: a cheap, parallel-friendly deterministic fill.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline float unit(uint64_t seed, int64_t i) {  // uniform in [-1, 1)
  return static_cast<float>(static_cast<double>(mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i)) >> 11) *
                                0x1p-52 -
                            1.0);
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// The Adam shard under test. First touch happens in the same static schedule as the step.
struct Shard {
  int64_t n;
  Dt grad_dt, out_dt;
  at::Tensor p, m, v, g, out;

  Shard(int64_t n_, Dt gd, Dt od) : n(n_), grad_dt(gd), out_dt(od) {
    p = at::empty({n}, at::kFloat);
    m = at::empty({n}, at::kFloat);
    v = at::empty({n}, at::kFloat);
    g = at::empty({n}, scalar_type(gd));
    if (od != Dt::kNone) out = at::empty({n}, scalar_type(od));
    float *pp = p.data_ptr<float>(), *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>();
    void* gp = g.data_ptr();
    uint16_t* op = od == Dt::kNone ? nullptr : static_cast<uint16_t*>(out.data_ptr());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      pp[i] = unit(1, i);
      mp[i] = 0.01f * unit(2, i);
      vp[i] = 1e-4f * (1.f + unit(3, i));
      float gi = unit(4, i) * 4.f;
      if (gd == Dt::kF32) static_cast<float*>(gp)[i] = gi;
      else if (gd == Dt::kBf16) static_cast<uint16_t*>(gp)[i] = optim::detail::f32_to_bf16(gi);
      else static_cast<uint16_t*>(gp)[i] = optim::detail::f32_to_f16(gi);
      if (op) op[i] = 0;
    }
  }
  void step(const optim::AdamHyper& h, CpuKernel k) {
    optim::cpu_adam_step(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr(),
                         scalar_type(grad_dt), n, h, out.defined() ? out.data_ptr() : nullptr, scalar_type(out_dt), k);
  }
};

// A copy of a few elements and what the scalar kernel makes of them.
struct Slice {
  int64_t offset, len;
  std::vector<float> p, m, v;
  std::vector<uint8_t> g;
  std::vector<uint16_t> out;
};

std::vector<Slice> expected_slices(const Shard& s, const optim::AdamHyper& h) {
  const int64_t len = std::min<int64_t>(4099, s.n);
  const int gsz = optim::detail::dt_size(s.grad_dt);
  std::vector<Slice> slices;
  for (int64_t off : {int64_t{0}, s.n / 2 + 3, s.n - len}) {
    off = std::clamp<int64_t>(off, 0, s.n - len);
    Slice c{off, len, {}, {}, {}, {}, {}};
    c.p.assign(s.p.data_ptr<float>() + off, s.p.data_ptr<float>() + off + len);
    c.m.assign(s.m.data_ptr<float>() + off, s.m.data_ptr<float>() + off + len);
    c.v.assign(s.v.data_ptr<float>() + off, s.v.data_ptr<float>() + off + len);
    const auto* gb = static_cast<const uint8_t*>(s.g.data_ptr()) + off * gsz;
    c.g.assign(gb, gb + len * gsz);
    c.out.assign(s.out_dt == Dt::kNone ? 0 : len, 0);
    optim::detail::adam_range_scalar(optim::detail::make_adam_consts(h), s.grad_dt, s.out_dt, c.p.data(), c.m.data(),
                                     c.v.data(), c.g.data(), c.out.empty() ? nullptr : c.out.data(), len);
    slices.push_back(std::move(c));
  }
  return slices;
}

bool same_float(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, sizeof a) == 0;
}

bool check_slices(const Shard& s, const std::vector<Slice>& slices) {
  for (const auto& c : slices)
    for (int64_t i = 0; i < c.len; ++i) {
      int64_t j = c.offset + i;
      bool ok = same_float(c.p[i], s.p.data_ptr<float>()[j]) && same_float(c.m[i], s.m.data_ptr<float>()[j]) &&
                same_float(c.v[i], s.v.data_ptr<float>()[j]) &&
                (c.out.empty() || c.out[i] == static_cast<const uint16_t*>(s.out.data_ptr())[j]);
      if (!ok) {
        std::fprintf(stderr, "bench adam: VALIDATION FAILED at element %lld (param %.9g vs scalar %.9g)\n",
                     static_cast<long long>(j), s.p.data_ptr<float>()[j], c.p[i]);
        return false;
      }
    }
  return true;
}

struct TriadResult {
  double best_gbs;
  bool valid;
};

void triad_scalar(float* a, const float* b, const float* c, float s, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) a[i] = b[i] + s * c[i];
}

// Non-temporal stores: `a` is write-only, so without them every store would first read its
// line (write-allocate) and the triad would move 16 B per element while counting 12. With
// them the 12 B counted are the bytes that move, the floor the Adam kernel is held to.
// Target avx2 without fma, so the multiply and add are not contracted and the result equals
// triad_scalar's exactly (checked).
__attribute__((target("avx2"))) void triad_avx2(float* a, const float* b, const float* c, float s, int64_t begin,
                                                int64_t end) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = begin;
  for (; i < end && reinterpret_cast<uintptr_t>(a + i) % 32 != 0; ++i) a[i] = b[i] + s * c[i];
  for (; i + 8 <= end; i += 8)
    _mm256_stream_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(vs, _mm256_loadu_ps(c + i))));
  for (; i < end; ++i) a[i] = b[i] + s * c[i];
  _mm_sfence();
}

// STREAM triad a = b + s * c with `threads` OpenMP threads, each on one contiguous block;
// best of iters (STREAM's rule), after one warm-up pass.
TriadResult triad(std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c, int threads,
                  int iters) {
  const int64_t n = static_cast<int64_t>(a.size());
  const float s = 3.0f;
  float* ap = a.data();
  const float *bp = b.data(), *cp = c.data();
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2");
  double best = 1e30;
  for (int it = 0; it < iters + 1; ++it) {
    double t0 = now_s();
#pragma omp parallel num_threads(threads)
    {
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t chunk = (n + nt - 1) / nt;
      const int64_t begin = std::min(n, id * chunk), end = std::min(n, begin + chunk);
      if (avx2)
        triad_avx2(ap, bp, cp, s, begin, end);
      else
        triad_scalar(ap, bp, cp, s, begin, end);
    }
    double dt = now_s() - t0;
    if (it > 0) best = std::min(best, dt);
  }
  bool valid = true;
  for (int64_t i = 0; i < n; i += 997) valid = valid && ap[i] == bp[i] + s * cp[i];
  return {12.0 * static_cast<double>(n) / best / 1e9, valid};
}

}  // namespace

int cmd_bench_adam(int argc, char** argv) {
  Options o;
  if (!parse_bench_adam(argc, argv, o)) {
    std::fputs(kBenchAdamUsage, stdout);
    return 0;
  }
  const int bytes_per_param =
      optim::detail::dt_size(o.grad_dt) + 24 + optim::detail::dt_size(o.out_dt);
  const double shard_gib = static_cast<double>(o.params) * (12 + optim::detail::dt_size(o.grad_dt) +
                                                            optim::detail::dt_size(o.out_dt)) / (1u << 30);
  const std::string cpu = cpu_model();
  std::printf("bench adam: %lld params (%.2f GiB), grad %s, out %s, %d B/param moved, %d iters; CPU: %s, %d cores\n",
              static_cast<long long>(o.params), shard_gib, dt_name(o.grad_dt), dt_name(o.out_dt), bytes_per_param,
              o.iters, cpu.c_str(), omp_get_num_procs());
  std::fflush(stdout);

  std::vector<float> ta(o.triad_elems), tb(o.triad_elems), tc(o.triad_elems);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < o.triad_elems; ++i) ta[i] = 0, tb[i] = unit(5, i), tc[i] = unit(6, i);
  std::vector<TriadResult> triads;
  for (int t : o.threads) triads.push_back(triad(ta, tb, tc, t, std::max(o.iters, 3)));
  ta = {};  // free the triad arrays before the shard is allocated
  tb = {};
  tc = {};

  Shard shard(o.params, o.grad_dt, o.out_dt);
  std::FILE* jf = o.json_path.empty() ? nullptr : std::fopen(o.json_path.c_str(), "a");
  ZT_CHECK(o.json_path.empty() || jf, "--json: cannot open ", o.json_path, " for appending");

  std::printf("%-7s %7s %12s %9s %11s %8s %10s %6s\n", "kernel", "threads", "Gparams/s", "GB/s", "triad GB/s",
              "%triad", "ms/step", "valid");
  bool all_valid = true;
  int64_t step = 0;
  for (CpuKernel k : o.kernels)
    for (size_t ti = 0; ti < o.threads.size(); ++ti) {
      const int t = o.threads[ti];
      omp_set_num_threads(t);
      optim::AdamHyper h;
      h.weight_decay = 0.01f;
      h.grad_scale = 1.0f / 1024;
      // Warm-up step, validated on slices against the scalar kernel.
      h.step = ++step;
      auto slices = expected_slices(shard, h);
      shard.step(h, k);
      bool valid = check_slices(shard, slices) && triads[ti].valid;
      all_valid = all_valid && valid;
      std::vector<double> times;
      for (int it = 0; it < o.iters; ++it) {
        h.step = ++step;
        double t0 = now_s();
        shard.step(h, k);
        times.push_back(now_s() - t0);
      }
      const double med = median(times);
      const double pps = static_cast<double>(o.params) / med;
      const double gbs = pps * bytes_per_param / 1e9;
      const double frac = gbs / triads[ti].best_gbs;
      std::printf("%-7s %7d %12.3f %9.2f %11.2f %7.1f%% %10.2f %6s\n", optim::kernel_name(k), t, pps / 1e9, gbs,
                  triads[ti].best_gbs, 100 * frac, med * 1e3, valid ? "yes" : "NO");
      nlohmann::json j = {{"bench", "cpu_adam"},
                          {"kernel", optim::kernel_name(k)},
                          {"threads", t},
                          {"params", o.params},
                          {"grad_dtype", dt_name(o.grad_dt)},
                          {"out_dtype", dt_name(o.out_dt)},
                          {"bytes_per_param", bytes_per_param},
                          {"iters", o.iters},
                          {"median_s", med},
                          {"min_s", *std::min_element(times.begin(), times.end())},
                          {"params_per_s", pps},
                          {"gb_per_s", gbs},
                          {"triad_gb_per_s", triads[ti].best_gbs},
                          {"frac_of_triad", frac},
                          {"native_bf16", k == CpuKernel::kAvx512 && optim::detail::cpu_has_avx512bf16()},
                          {"cpu", cpu},
                          {"valid", valid}};
      std::string line = j.dump();
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      if (jf) std::fprintf(jf, "%s\n", line.c_str());
    }
  if (jf) std::fclose(jf);
  if (!all_valid) std::fprintf(stderr, "bench adam: some results did not validate (see above)\n");
  return all_valid ? 0 : 1;
}

}  // namespace zt::cli

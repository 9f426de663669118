// bench_collectives: bandwidth of zt::comm::Group collectives, nccl-tests conventions.
//
//   zerotrain launch -n G -- build/bench_collectives [--min 1M] [--max 1G] [--factor 2]
//       [--dtype bf16|fp16|fp32] [--iters 20] [--warmup 5]
//       [--ops reduce_scatter,all_gather,all_reduce] [--device cuda|cpu] [--json PATH]
//
// CUDA tensors (NCCL) on cuda:LOCAL_RANK when GPUs exist, else CPU tensors (MPI), with a
// log line saying so. bench/anchors/collectives.py measures torch.distributed the same
// way, so the two compare line by line.
//
// Size = the FULL buffer: the reduce_scatter input, the all_gather output, the
// all_reduce buffer (nccl-tests' "size"); each rank's shard is size / world. All sizes
// use views of one pair of buffers allocated for the largest size.
// Timing: warm-up calls, a host barrier, then `iters` calls back to back between two
// CUDA events on the current stream (each call's Work::wait() orders the stream after
// the collective; the host never blocks), or between two host clock reads on CPU.
// time_us = elapsed / iters, averaged over ranks (time_us_max: the slowest rank).
//   algbw = size / time                     (GB/s, 1e9 bytes)
//   busbw = algbw * (n-1)/n                 reduce_scatter, all_gather
//   busbw = algbw * 2(n-1)/n                all_reduce
// Every size is checked once after timing: rank r's input element j is
// (r+1)*(1 + j % p) (p <= 7, small enough to be exact in the dtype), and the result must
// equal the exact reduction/gather everywhere; "wrong" counts the elements that differ
// on all ranks together. Exits 1 if any check failed.
#include <torch/headeronly/version.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <nccl.h>
#endif

#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace {

using zt::ConfigError;
using zt::comm::GroupPtr;
using zt::comm::ReduceOp;

constexpr const char* kUsage =
    "usage: zerotrain launch -n G -- bench_collectives [--min 1M] [--max 1G] [--factor 2] [--dtype bf16|fp16|fp32]\n"
    "           [--iters 20] [--warmup 5] [--ops reduce_scatter,all_gather,all_reduce] [--device cuda|cpu]\n"
    "           [--json PATH]\n"
    "Sizes are full buffers in bytes with K/M/G suffixes (KiB/MiB/GiB), from --min to --max in x--factor steps.\n";

struct Options {
  int64_t min_bytes = int64_t{1} << 20;
  int64_t max_bytes = int64_t{1} << 30;
  int64_t factor = 2;
  std::string dtype = "bf16";
  int iters = 20;
  int warmup = 5;
  std::vector<std::string> ops = {"reduce_scatter", "all_gather", "all_reduce"};
  std::string device;  // "" = cuda if available
  std::string json;
};

int64_t parse_size(const std::string& s0) {
  std::string s = s0;
  for (const char* suffix : {"iB", "IB", "B", "b"}) {
    const std::string suf(suffix);
    if (s.size() > suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0) {
      s.resize(s.size() - suf.size());
      break;
    }
  }
  int64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k': mult = int64_t{1} << 10; break;
      case 'M':
      case 'm': mult = int64_t{1} << 20; break;
      case 'G':
      case 'g': mult = int64_t{1} << 30; break;
      default: break;
    }
    if (mult > 1) s.pop_back();
  }
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ZT_CHECK_T(used == s.size() && !s.empty() && v > 0, ConfigError, "bad size '", s0, "' (e.g. 1M, 512K, 1G, 4096)");
  return static_cast<int64_t>(v * static_cast<double>(mult));
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    ZT_CHECK_T(i + 1 < argc, ConfigError, argv[i], " needs a value\n", kUsage);
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else if (a == "--min" || a == "--min-bytes") {
      o.min_bytes = parse_size(value(i));
    } else if (a == "--max" || a == "--max-bytes") {
      o.max_bytes = parse_size(value(i));
    } else if (a == "--factor") {
      o.factor = std::stoll(value(i));
    } else if (a == "--dtype") {
      o.dtype = value(i);
    } else if (a == "--iters") {
      o.iters = std::stoi(value(i));
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value(i));
    } else if (a == "--device") {
      o.device = value(i);
    } else if (a == "--json") {
      o.json = value(i);
    } else if (a == "--ops") {
      o.ops.clear();
      std::stringstream ss(value(i));
      for (std::string op; std::getline(ss, op, ',');) {
        if (op.empty()) continue;
        ZT_CHECK_T(op == "reduce_scatter" || op == "all_gather" || op == "all_reduce", ConfigError, "unknown op '", op,
                   "' (reduce_scatter, all_gather, all_reduce)");
        o.ops.push_back(op);
      }
    } else {
      throw ConfigError("unknown option '" + a + "'\n" + kUsage);
    }
  }
  ZT_CHECK_T(o.dtype == "bf16" || o.dtype == "fp16" || o.dtype == "fp32", ConfigError,
             "--dtype must be bf16, fp16 or fp32, got '", o.dtype, "'");
  ZT_CHECK_T(o.device.empty() || o.device == "cuda" || o.device == "cpu", ConfigError, "--device must be cuda or cpu");
  ZT_CHECK_T(o.factor >= 2 && o.min_bytes <= o.max_bytes && o.iters >= 1 && o.warmup >= 0 && !o.ops.empty(),
             ConfigError, "need --factor >= 2, --min <= --max, --iters >= 1, --warmup >= 0 and at least one op");
  return o;
}

at::ScalarType dtype_of(const std::string& s) {
  return s == "bf16" ? at::kBFloat16 : s == "fp16" ? at::kHalf : at::kFloat;
}

// Largest integer below which every integer is exact in the dtype.
double exact_limit(at::ScalarType dt) { return dt == at::kBFloat16 ? 256 : dt == at::kHalf ? 2048 : 16777216; }

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S+00:00", std::gmtime(&t));
  return buf;
}

// Times `iters` calls of `call` (each returns after Work::wait()), in microseconds per call.
class Timer {
 public:
  explicit Timer(const at::Device& d) : cuda_(d.is_cuda()) {}
  template <typename Call>
  double per_call_us(int iters, Call call) {
#ifdef ZT_WITH_CUDA
    if (cuda_) {
      auto stream = at::cuda::getCurrentCUDAStream();
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      start.record(stream);
      for (int k = 0; k < iters; ++k) call();
      end.record(stream);
      end.synchronize();
      return start.elapsed_time(end) * 1e3 / iters;
    }
#endif
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < iters; ++k) call();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  }
  void sync() {
#ifdef ZT_WITH_CUDA
    if (cuda_) at::cuda::getCurrentCUDAStream().synchronize();
#endif
  }

 private:
  bool cuda_;
};

int run(int argc, char** argv) {
  Options o = parse(argc, argv);
  GroupPtr g = zt::comm::world_group();
  const int me = g->rank(), n = g->size();
  const at::ScalarType dt = dtype_of(o.dtype);
  const int64_t esize = static_cast<int64_t>(c10::elementSize(dt));

  // Device: this rank's GPU, else the CPU (said out loud: the numbers mean MPI then).
  const char* lr = std::getenv("LOCAL_RANK");
  const int local_rank = lr ? std::atoi(lr) : 0;
  const bool have_gpu = torch::cuda::is_available() && torch::cuda::device_count() > local_rank;
  ZT_CHECK_T(o.device != "cuda" || have_gpu, ConfigError, "--device cuda, but rank ", me, " has no GPU ", local_rank,
             " (", torch::cuda::device_count(), " visible)");
  const bool cuda = o.device == "cuda" || (o.device.empty() && have_gpu);
  at::Device device(at::kCPU);
  std::string device_name = "cpu", backend = "mpi", nccl_version;
#ifdef ZT_WITH_CUDA
  if (cuda) {
    device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
    c10::cuda::set_device(device.index());
    device_name = at::cuda::getCurrentDeviceProperties()->name;
    backend = "nccl";
    int v = 0;
    ncclGetVersion(&v);
    nccl_version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
#endif
  if (me == 0 && !cuda) {
    std::fprintf(stderr, "bench_collectives: %s; timing CPU tensors through MPI (not comparable with NCCL numbers)\n",
                 o.device == "cpu" ? "--device cpu" : "no GPU");
  }

  nlohmann::ordered_json meta = {
      {"framework", "zerotrain"},
      {"bench", "collectives"},
      {"world", n},
      {"dtype", o.dtype},
      {"warmup", o.warmup},
      {"iters", o.iters},
      {"backend", backend},
      {"device", device_name},
      {"torch", std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                    std::to_string(TORCH_VERSION_PATCH)},
      {"nccl", nccl_version.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(nccl_version)},
      {"time", utc_now()}};

  const int64_t max_shard = o.max_bytes / esize / n;
  ZT_CHECK_T(max_shard >= 1, ConfigError, "--max ", o.max_bytes, " is less than one element per rank");
  ZT_CHECK_T(max_shard * n < (int64_t{1} << 31), ConfigError, "--max ", o.max_bytes, " is over 2^31 elements");
  auto opts = at::TensorOptions(dt).device(device);
  at::Tensor sendbuf = at::empty({max_shard * n}, opts);
  at::Tensor recvbuf = at::empty({max_shard * n}, opts);
  Timer timer(device);
  std::FILE* json = nullptr;
  if (me == 0 && !o.json.empty()) {
    json = std::fopen(o.json.c_str(), "a");
    ZT_CHECK_T(json != nullptr, ConfigError, "cannot open --json ", o.json, " for appending");
  }
  if (me == 0) {
    std::fprintf(stderr, "# world %d dtype %s backend %s device %s nccl %s\n", n, o.dtype.c_str(), backend.c_str(),
                 device_name.c_str(), nccl_version.empty() ? "-" : nccl_version.c_str());
    std::fprintf(stderr, "# %14s %12s %12s %10s %8s %8s %6s\n", "op", "size(B)", "count", "time(us)", "algbw", "busbw",
                 "wrong");
  }

  int64_t failures = 0;
  const double tri = n * (n + 1) / 2.0;
  for (const std::string& op : o.ops) {
    const bool rs = op == "reduce_scatter", ag = op == "all_gather";
    // Pattern period p: (r+1)*(1 + j%p) and its n-rank sum must stay exact.
    const double top = ag ? n : tri;
    const int64_t p = std::max<int64_t>(1, std::min<int64_t>(7, static_cast<int64_t>(exact_limit(dt) / top)));
    for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= o.factor) {
      const int64_t shard = size / esize / n;
      if (shard == 0) continue;
      const int64_t total = shard * n;
      at::Tensor full = recvbuf.narrow(0, 0, total);
      at::Tensor in = rs ? sendbuf.narrow(0, 0, total) : ag ? sendbuf.narrow(0, 0, shard) : full;
      at::Tensor out = rs ? recvbuf.narrow(0, 0, shard) : full;
      auto call = [&] {
        if (rs) {
          g->reduce_scatter(out, in, ReduceOp::kSum);
        } else if (ag) {
          g->all_gather(out, in);
        } else {
          g->all_reduce(full, ReduceOp::kSum);  // in place; values grow, which does not change the time
        }
      };
      // pattern(offset, count) = 1 + (j % p) for j in [offset, offset+count), on the device.
      auto pattern = [&](int64_t offset, int64_t count) {
        return at::arange(offset, offset + count, at::TensorOptions(at::kInt).device(device)).remainder_(p).add_(1);
      };
      auto fill_input = [&] {
        const int64_t offset = ag ? me * shard : 0;
        in.copy_(pattern(offset, in.numel()).mul_(me + 1));
      };

      fill_input();
      for (int k = 0; k < o.warmup; ++k) call();
      timer.sync();
      g->barrier();
      const double t_us = timer.per_call_us(o.iters, call);

      // Correctness: one fresh call with known inputs.
      out.fill_(-1);
      fill_input();
      call();
      // Expected values are small integers: exact in fp32.
      at::Tensor expected;
      if (rs) {
        expected = pattern(me * shard, shard).to(at::kFloat).mul_(tri);
      } else if (ag) {
        expected =
            pattern(0, total)
                .to(at::kFloat)
                .mul_(at::arange(total, at::TensorOptions(at::kInt).device(device)).div_(shard, "floor").add_(1));
      } else {
        expected = pattern(0, total).to(at::kFloat).mul_(tri);
      }
      const int64_t wrong_here = out.to(at::kFloat).ne(expected).sum().item<int64_t>();
      expected.reset();

      at::Tensor stats = at::tensor({t_us, static_cast<double>(wrong_here)}, at::kDouble);
      at::Tensor tmax = at::tensor({t_us}, at::kDouble);
      g->all_reduce(stats, ReduceOp::kSum);
      g->all_reduce(tmax, ReduceOp::kMax);
      const double t_avg = stats[0].item<double>() / n, t_max = tmax[0].item<double>();
      const int64_t wrong = static_cast<int64_t>(stats[1].item<double>());
      failures += wrong > 0;
      const int64_t bytes = total * esize;
      const double algbw = static_cast<double>(bytes) / (t_avg * 1e-6) / 1e9;
      const double busbw = algbw * (rs || ag ? (n - 1.0) / n : 2.0 * (n - 1.0) / n);
      if (me == 0) {
        nlohmann::ordered_json rec = meta;
        auto round_to = [](double v, double q) { return std::round(v * q) / q; };
        rec["op"] = op;
        rec["inplace"] = !rs && !ag;  // all_reduce is in place in zt::comm
        rec["bytes"] = bytes;
        rec["shard_bytes"] = rs || ag ? nlohmann::ordered_json(shard * esize) : nlohmann::ordered_json();
        rec["count"] = total;
        rec["time_us"] = round_to(t_avg, 100);
        rec["time_us_max"] = round_to(t_max, 100);
        rec["algbw_gbps"] = round_to(algbw, 1000);
        rec["busbw_gbps"] = round_to(busbw, 1000);
        rec["wrong"] = wrong;
        rec["check"] = wrong == 0 ? "ok" : "FAILED";
        const std::string line = rec.dump();
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
        if (json) {
          std::fprintf(json, "%s\n", line.c_str());
          std::fflush(json);
        }
        std::fprintf(stderr, "  %14s %12lld %12lld %10.2f %8.2f %8.2f %6lld\n", op.c_str(),
                     static_cast<long long>(bytes), static_cast<long long>(total), t_avg, algbw, busbw,
                     static_cast<long long>(wrong));
      }
    }
  }
  if (json) std::fclose(json);
  g->barrier();
  if (failures > 0) {
    if (me == 0)
      std::fprintf(stderr, "bench_collectives: %lld result(s) FAILED the data check\n",
                   static_cast<long long>(failures));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int rc = run(argc, argv);
    zt::comm::finalize();
    return rc;
  } catch (const zt::Error& e) {
    std::fprintf(stderr, "bench_collectives: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: unexpected error: %s\n", e.what());
    return 1;
  }
}

// bench_qlora_build: the time and host memory to build a random QLoRA Llama base, the whole
// way (LlamaForCausalLM(cfg), apply_lora, quantize_lora_bases) against the layerwise way
// (skeleton, init_layerwise with nf4_base_sink, apply_lora, attach_nf4_bases: [Layerwise
// Init], [Layerwise QLoRA Base]), LoRA r 16 on the seven projections.
//
//   build/bench_qlora_build [--model llama3-8b] [--layers 4] [--mode both|whole|layerwise]
//
// A first line times the serial part of [Parallel Init]: skipping the whole model's
// construction draws (discard_draws), in draws per second.
// One JSON line per mode: seconds, peak_rss_gib (the process's VmHWM, reset before each mode
// through /proc/self/clear_refs), nf4_bytes and a checksum of every adapter's NF4 codes, both
// absmax levels and A. With --mode both (whole first) the layerwise line is validated: its
// checksum and bytes must equal the whole build's ("equal"). Exits 1 if not.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/llama.h"
#include "models/parallel_init.h"

namespace {

double vm_hwm_gib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / (1024.0 * 1024.0);
  return -1;
}

void reset_hwm() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Result {
  double seconds = 0, peak = 0, checksum = 0;
  int64_t nf4_bytes = 0;
};

double checksum(const zt::lora::LoraModel& lm) {
  double s = 0;
  for (const auto& a : lm.adapters) {
    auto q = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr());
    s += q->nf4().packed.to(torch::kLong).sum().item<double>() + q->nf4().qabsmax.to(torch::kLong).sum().item<double>() +
         q->nf4().absmax2.to(torch::kDouble).sum().item<double>() + a.adapter->lora_A.to(torch::kDouble).sum().item<double>();
  }
  return s;
}

Result run(const zt::models::LlamaConfig& c, bool layerwise) {
  zt::lora::LoraOptions o;
  o.r = 16;
  o.alpha = 32;
  o.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  reset_hwm();
  torch::manual_seed(1234);
  const auto t0 = std::chrono::steady_clock::now();
  Result r;
  if (layerwise) {
    zt::models::LlamaForCausalLM m(zt::models::LlamaForCausalLMImpl::skeleton(c));
    auto space = zt::lora::lora_space(*m);
    zt::lora::Nf4Bases bases;
    m->init_layerwise(zt::lora::nf4_base_sink(zt::lora::select_targets(space.sites, o), bases));
    auto lm = zt::lora::apply_lora(*m, space.sites, o, zt::lora::LoraBase::kWholeOrHeldElsewhere);
    r.nf4_bytes = zt::lora::attach_nf4_bases(lm, std::move(bases));
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.peak = vm_hwm_gib();
    r.checksum = checksum(lm);
  } else {
    zt::models::LlamaForCausalLM m(c);
    auto space = zt::lora::lora_space(*m);
    auto lm = zt::lora::apply_lora(*m, space.sites, o);
    r.nf4_bytes = zt::lora::quantize_lora_bases(lm);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.peak = vm_hwm_gib();
    r.checksum = checksum(lm);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "llama3-8b", mode = "both";
  int64_t layers = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--layers")) layers = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--mode")) mode = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: bench_qlora_build [--model NAME] [--layers N (0: the model's)] [--mode both|whole|layerwise]\n");
      return 2;
    }
  }
  auto c = zt::models::named_llama(model);
  if (layers > 0) c.num_hidden_layers = layers;
  c.layer_sliding.resize(static_cast<size_t>(c.num_hidden_layers), c.sliding_window > 0);
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator().clone();
    const int64_t n = zt::models::LlamaForCausalLMImpl::construction_draws(c);
    const auto t0 = std::chrono::steady_clock::now();
    zt::models::discard_draws(gen, n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("{\"bench\": \"qlora_build\", \"mode\": \"discard\", \"model\": \"%s\", \"layers\": %lld, "
                "\"draws\": %lld, \"seconds\": %.3f, \"draws_per_s\": %.4g}\n",
                model.c_str(), static_cast<long long>(c.num_hidden_layers), static_cast<long long>(n), s, n / s);
  }
  bool ok = true;
  Result whole;
  for (const char* m : {"whole", "layerwise"}) {
    if (mode != "both" && mode != m) continue;
    const bool lw = std::strcmp(m, "layerwise") == 0;
    const Result r = run(c, lw);
    const bool checked = lw && mode == "both";
    const bool equal = !checked || (r.checksum == whole.checksum && r.nf4_bytes == whole.nf4_bytes);
    ok = ok && equal;
    std::printf("{\"bench\": \"qlora_build\", \"mode\": \"%s\", \"model\": \"%s\", \"layers\": %lld, \"threads\": %d, "
                "\"seconds\": %.2f, \"peak_rss_gib\": %.3f, \"nf4_bytes\": %lld, \"checksum\": %.17g%s}\n",
                m, model.c_str(), static_cast<long long>(c.num_hidden_layers), at::get_num_threads(), r.seconds, r.peak,
                static_cast<long long>(r.nf4_bytes), r.checksum,
                checked ? (equal ? ", \"equal\": true" : ", \"equal\": false") : "");
    std::fflush(stdout);
    if (!lw) whole = r;
  }
  return ok ? 0 : 1;
}

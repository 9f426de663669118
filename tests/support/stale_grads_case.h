// [Stale Gradients] one training run for tests/dist/test_stale_grads.cpp (CPU ranks) and
// tests/gpu/test_stale_grads_gpu.cpp (CUDA): a tiny model through the engine at a ZeRO stage,
// two micro-steps per step, three steps, with zero_grad() marking the gradients stale (and,
// with `poison`, NaN written into every stale gradient after each step: what a writer that
// adds instead of overwriting would read) or filling them (the reference). Returns the fp32
// master weights after the last step and the losses.
#pragma once
#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

#include "common/stale_grad.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/llama_engine.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt_test {

struct StaleRun {
  std::vector<torch::Tensor> params;  // fp32 master, full, on the CPU
  std::vector<double> losses;
  int64_t poisoned = 0;   // stale gradients NaN was written into (0 unless stale and poison)
  int64_t trainable = 0;  // the model's trainable parameters
};

// model: "llama-tied" (the LM head writes the tied embedding's gradient first, the lookup
// adds into it), "llama-untied" (q/k/v biases through AccumulateGrad; the lookup's own
// gradient) or "gpt2" (LinearFn, LayerNormFn, the fused LM head).
inline StaleRun stale_grads_run(const std::string& model, int stage, bool stale, bool poison, torch::Device dev,
                                const char* dtype = nullptr) {
  zt::set_stale_grads_enabled(stale);
  auto group = zt::comm::world_group();
  const int world = group->size(), rank = group->rank();
  constexpr int64_t kMicro = 2, kSeq = 16, kGas = 2;
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", kGas},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}, {"momentum", 0.9}}}}},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 5000}}},
  };
  if (dtype != nullptr) j[dtype] = {{"enabled", true}};
  auto cfg = zt::Config::from_json(j, world);
  zt::EngineOptions o;
  o.device = dev;
  o.print = false;

  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss_fn;
  int64_t vocab = 0;
  zt::models::LlamaForCausalLM llama{nullptr};
  torch::manual_seed(11);
  if (model == "gpt2") {
    zt::models::GPT2Config c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.vocab_size = 256;
    c.n_positions = 32;
    zt::models::GPT2 m(c);
    module = m.ptr();
    vocab = c.vocab_size;
    loss_fn = [m](const torch::Tensor& x, const torch::Tensor& y) mutable { return m->loss(x, y); };
  } else {
    auto c = zt::models::named_llama("llama-tiny");
    c.max_position_embeddings = 32;
    c.tie_word_embeddings = model == "llama-tied";
    c.qkv_bias = model == "llama-untied";
    llama = zt::models::LlamaForCausalLM(c);
    module = llama.ptr();
    vocab = c.vocab_size;
    zt::models::llama_engine_options(llama, o, nullptr);
    loss_fn = [llama](const torch::Tensor& x, const torch::Tensor& y) mutable { return llama->loss(x, y); };
  }
  auto engine = zt::initialize(module, cfg, o);
  if (llama) zt::models::attach_llama_engine(*llama, *engine);
  StaleRun r;
  for (int s = 0; s < 3; ++s) {
    auto g = at::make_generator<at::CPUGeneratorImpl>(7);  // the same window every step: the loss must fall
    for (int k = 0; k < kGas; ++k) {
      auto idx = at::randint(0, vocab, {kMicro * world, kSeq + 1}, g);
      auto x = idx.narrow(0, rank * kMicro, kMicro).narrow(1, 0, kSeq).contiguous().to(dev);
      auto y = idx.narrow(0, rank * kMicro, kMicro).narrow(1, 1, kSeq).contiguous().to(dev);
      auto loss = engine->forward([&] { return loss_fn(x, y); });
      engine->backward(loss);
      engine->step();  // a no-op but at the window's end
    }
    r.losses.push_back(engine->last_report().loss);
    if (poison) {
      torch::NoGradGuard ng;
      for (auto& p : module->parameters()) {
        if (p.grad().defined() && zt::grad_is_stale(p.grad())) {
          p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
          ++r.poisoned;
        }
      }
    }
  }
  for (const auto& p : module->parameters()) r.trainable += p.requires_grad() && p.numel() > 0 ? 1 : 0;
  for (auto& t : engine->gather_master_params()) r.params.push_back(t.to(torch::kCPU));
  if (llama) llama->set_layer_runner({});
  zt::set_stale_grads_enabled(true);
  return r;
}

}  // namespace zt_test

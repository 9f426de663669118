// A checkpoint save killed midway: run as `zerotrain launch -n 2 -- prog_ckpt_crash MODE DIR [POINT:RANK]`.
//   save DIR POINT:RANK  trains 2 steps and saves tag "a" (complete), trains 1 more step
//                        and saves tag "b" with ZT_CKPT_TEST_CRASH=POINT:RANK, so that
//                        rank SIGKILLs itself inside the save (the launcher ends the rest).
//   load DIR             loads DIR/latest into a fresh engine and prints
//                        "LOADED tag=T step=S fc1sum=X".
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"

namespace {
struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Tiny);

std::unique_ptr<zt::Engine> make_engine(Tiny& m, zt::comm::GroupPtr g) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", 2},
                      {"gradient_accumulation_steps", 1},
                      {"steps_per_print", 1000},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
                      {"zero_optimization", {{"stage", 1}, {"reduce_bucket_size", 100}}}};
  zt::EngineOptions o;
  o.device = torch::Device(torch::kCPU);
  o.print = false;
  return zt::initialize(m.ptr(), zt::Config::from_json(j, g->size()), o);
}

void train_step(zt::Engine& e, Tiny& m, int s) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + s);
  auto x = at::randn({2, 8}, gen), y = at::randn({2, 4}, gen);
  auto loss = e.forward([&] { return torch::mse_loss(m->forward(x), y); });
  e.backward(loss);
  e.step();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: prog_ckpt_crash save|load DIR [POINT:RANK]\n");
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  try {
    torch::set_num_threads(1);
    auto world = zt::comm::world_group();
    torch::manual_seed(3);
    Tiny m;
    auto e = make_engine(m, world);
    if (mode == "save") {
      train_step(*e, m, 0);
      train_step(*e, m, 1);
      e->save_checkpoint(dir, "a");
      train_step(*e, m, 2);
      if (argc > 3) setenv("ZT_CKPT_TEST_CRASH", argv[3], 1);
      e->save_checkpoint(dir, "b");
      std::printf("SAVED b (the crash point was not reached)\n");
    } else {
      e->load_checkpoint(dir);
      std::printf("LOADED step=%lld fc1sum=%.6f\n", static_cast<long long>(e->global_steps()),
                  m->fc1->weight.sum().item<double>());
    }
    std::fflush(stdout);
    zt::comm::finalize();
    return 0;
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "prog_ckpt_crash: %s\n", ex.what());
    return 1;
  }
}

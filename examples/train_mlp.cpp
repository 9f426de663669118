// A complete zerotrain program: an MLP regression trained with ZeRO from a DeepSpeed
// config. Run on 2 ranks (the optional second argument is the number of steps, 50 by
// default):
//   build/zerotrain launch -n 2 -- build/example_train_mlp configs/zero2.json [steps]
// It builds against an installed zerotrain too: see examples/CMakeLists.txt.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/engine.h"
#include "zerotrain/version.h"

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(32, 64));
    fc2 = register_module("fc2", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  try {
    auto group = zt::comm::world_group();
    auto cfg = zt::Config::from_file(argc > 1 ? argv[1] : "configs/zero2.json", group->size());
    const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
    if (group->rank() == 0) std::printf("zerotrain %s, %d rank(s), %d steps\n", zt::version(), group->size(), steps);
    torch::manual_seed(0);
    Net net;
    auto engine = zt::initialize(net.ptr(), cfg);
    auto w_true = torch::randn({32, 1});  // the same on every rank (same seed)
    torch::manual_seed(100 + group->rank());  // each rank draws its own data
    const auto dev = engine->device();
    for (int step = 0; step < steps; ++step) {
      for (int64_t k = 0; k < cfg.gradient_accumulation_steps; ++k) {
        auto x = torch::randn({cfg.train_micro_batch_size_per_gpu, 32});
        auto y = x.matmul(w_true);
        auto xb = x.to(dev, engine->compute_dtype()), yb = y.to(dev);
        auto loss = engine->forward([&] { return torch::mse_loss(net->forward(xb).to(torch::kFloat), yb); });
        engine->backward(loss);
        engine->step();
      }
      if (group->rank() == 0 && (step % 10 == 0 || step == steps - 1)) {
        std::printf("step %d loss %.5f lr %.2e\n", step, engine->last_report().loss, engine->get_lr());
      }
    }
    engine.reset();
    zt::comm::finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}

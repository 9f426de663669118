// DeepSpeed's CIFAR-10 tutorial, through the zerotrain engine: the tutorial's CNN, the
// CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin from the "binary version"),
// and the tutorial's DeepSpeed config.
//   build/zerotrain launch -n 2 -- build/example_cifar10 /path/to/cifar-10-batches-bin \
//       configs/cifar10_ds_config.json [epochs]
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>

#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/data/cifar10.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/engine.h"
#include "zerotrain/models/cifar_net.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: example_cifar10 CIFAR_BIN_DIR CONFIG.json [epochs]\n");
    return 2;
  }
  try {
    auto group = zt::comm::world_group();
    const int rank = group->rank(), world = group->size();
    auto cfg = zt::Config::from_file(argv[2], world);
    const int epochs = argc > 3 ? std::atoi(argv[3]) : 2;
    torch::manual_seed(0);
    zt::models::CifarNet net;
    auto engine = zt::initialize(net.ptr(), cfg);
    auto train = std::make_shared<zt::data::Cifar10Dataset>(std::string(argv[1]), true);
    zt::data::DistributedSampler sampler(train->size(), rank, world, true, 0);
    zt::data::Loader loader(train, sampler, cfg.train_micro_batch_size_per_gpu, engine->device());
    const int64_t steps = epochs * loader.batches_per_epoch() / cfg.gradient_accumulation_steps;
    double running = 0;
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t k = 0; k < cfg.gradient_accumulation_steps; ++k) {
        auto [x, y] = loader.next();
        auto xb = x.to(engine->compute_dtype());
        auto loss = engine->forward([&] { return net->loss(xb, y); });
        engine->backward(loss);
        engine->step();
      }
      running += engine->last_report().loss;
      if (rank == 0 && (s + 1) % 2000 == 0) {
        std::printf("[epoch %lld, step %lld] loss: %.3f\n", static_cast<long long>(loader.epoch() + 1),
                    static_cast<long long>(s + 1), running / 2000);
        running = 0;
      }
    }
    // Accuracy on the test set (every rank evaluates all of it; rank 0 prints).
    zt::data::Cifar10Dataset test(std::string(argv[1]), false);
    torch::NoGradGuard no_grad;
    auto logits = net->forward(
        ((test.images().to(torch::kFloat) / 255.0 - 0.5) / 0.5).to(engine->device(), engine->compute_dtype()));
    auto correct = (logits.argmax(1).cpu() == test.labels()).sum().item<int64_t>();
    if (rank == 0) std::printf("accuracy on %lld test images: %.1f%%\n", static_cast<long long>(test.size()),
                               100.0 * static_cast<double>(correct) / static_cast<double>(test.size()));
    engine.reset();
    zt::comm::finalize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_cifar10: %s\n", e.what());
    return 1;
  }
}

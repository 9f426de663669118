// DeepSpeed's CIFAR-10 tutorial, through the zerotrain engine: the tutorial's CNN, the
// CIFAR-10 binary files (data_batch_1..5.bin, test_batch.bin from the "binary version"),
// and the tutorial's DeepSpeed config.
//   build/zerotrain launch -n 2 -- build/example_cifar10 /path/to/cifar-10-batches-bin \
//       configs/cifar10_ds_config.json [epochs]
// With --moe, the tutorial's MoE variant (docs/moe.md#the-cifar-10-moe-example): fc3 becomes
// one MoE layer of Linear(84, 84) experts per --num-experts entry, then fc4 84 -> 10, e.g. the
// PR-MoE pyramid with its experts split over 2 ranks:
//   build/zerotrain launch -n 2 -- build/example_cifar10 DIR configs/cifar10_ds_config.json
//       --moe --ep 2 --num-experts 2 4 --mlp-type residual --top-k 1 --noisy-gate-policy RSample
//       --moe-param-group          (one command line)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/data/cifar10.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/data/sampler.h"
#include "zerotrain/engine.h"
#include "zerotrain/error.h"
#include "zerotrain/models/cifar_moe_net.h"
#include "zerotrain/models/cifar_net.h"

namespace {

constexpr const char* kUsage =
    "usage: example_cifar10 CIFAR_BIN_DIR CONFIG.json [epochs] [--steps N] [--log-interval N] [--seed N]\n"
    "         [--moe [--num-experts N [N ...]] [--ep N | --ep-world-size N] [--top-k 1|2]\n"
    "          [--min-capacity N] [--capacity-factor F] [--noisy-gate-policy None|RSample|Jitter]\n"
    "          [--mlp-type standard|residual] [--moe-param-group] [--moe-aux-coef X]]\n";

struct Args {
  std::string dir, config;
  int epochs = 2;
  long long steps = 0;          // 0: the epochs
  long long log_interval = 2000;
  uint64_t seed = 0;
  bool moe = false, moe_param_group = false;
  int ep = 1;
  zt::models::CifarMoEOptions moe_opt;
  std::vector<std::string> moe_flags;  // given MoE flags (refused without --moe)
};

[[noreturn]] void bad_arg(const std::string& msg) { throw zt::ConfigError("example_cifar10: " + msg + "\n" + kUsage); }

double number_of(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const double d = std::stod(v, &used);
    if (used == v.size()) return d;
  } catch (const std::exception&) {
  }
  bad_arg(flag + " takes a number, got '" + v + "'");
}

long long integer_of(const std::string& flag, const std::string& v) {
  const double d = number_of(flag, v);
  if (d != static_cast<double>(static_cast<long long>(d))) bad_arg(flag + " takes an integer, got '" + v + "'");
  return static_cast<long long>(d);
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_arg(f + " needs a value");
      return argv[++i];
    };
    auto moe_flag = [&] { a.moe_flags.push_back(f); };
    if (f.rfind("--", 0) != 0) {
      pos.push_back(f);
    } else if (f == "--steps") {
      a.steps = integer_of(f, value());
    } else if (f == "--log-interval") {
      a.log_interval = integer_of(f, value());
    } else if (f == "--seed") {
      a.seed = static_cast<uint64_t>(integer_of(f, value()));
    } else if (f == "--moe") {
      a.moe = true;
    } else if (f == "--ep" || f == "--ep-world-size") {
      moe_flag();
      a.ep = static_cast<int>(integer_of(f, value()));
    } else if (f == "--num-experts") {  // nargs='+', as the tutorial's
      moe_flag();
      a.moe_opt.num_experts.clear();
      while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) a.moe_opt.num_experts.push_back(integer_of(f, argv[++i]));
      if (a.moe_opt.num_experts.empty()) bad_arg("--num-experts needs at least one number (one MoE layer each)");
    } else if (f == "--top-k") {
      moe_flag();
      a.moe_opt.top_k = integer_of(f, value());
    } else if (f == "--min-capacity") {
      moe_flag();
      a.moe_opt.min_capacity = integer_of(f, value());
    } else if (f == "--capacity-factor") {
      moe_flag();
      a.moe_opt.capacity_factor = number_of(f, value());
    } else if (f == "--noisy-gate-policy") {
      moe_flag();
      a.moe_opt.noisy_gate_policy = value();
    } else if (f == "--mlp-type") {
      moe_flag();
      const std::string t = value();
      if (t != "standard" && t != "residual") bad_arg("--mlp-type takes standard or residual (PR-MoE), got '" + t + "'");
      a.moe_opt.use_residual = t == "residual";
    } else if (f == "--moe-param-group") {
      moe_flag();
      a.moe_param_group = true;
    } else if (f == "--moe-aux-coef") {
      moe_flag();
      a.moe_opt.aux_loss_coef = number_of(f, value());
    } else {
      bad_arg("unknown flag '" + f + "'");
    }
  }
  if (pos.size() < 2 || pos.size() > 3) bad_arg("needs CIFAR_BIN_DIR and CONFIG.json (and optionally epochs)");
  a.dir = pos[0];
  a.config = pos[1];
  if (pos.size() == 3) a.epochs = static_cast<int>(integer_of("epochs", pos[2]));
  if (a.epochs < 1 || a.steps < 0 || a.log_interval < 1) bad_arg("epochs and --log-interval must be >= 1, --steps >= 0");
  if (!a.moe && !a.moe_flags.empty())
    bad_arg(a.moe_flags.front() + " configures the MoE variant: add --moe (or drop the flag)");
  // DeepSpeed's ZeRO optimizers refuse MoE layers without MoE parameter groups; here they are
  // what keeps the experts in their own shard group over expert-dp, needed at ep > 1.
  if (a.moe && a.ep > 1 && !a.moe_param_group)
    bad_arg("--ep " + std::to_string(a.ep) + " needs --moe-param-group (the experts' own parameter groups, "
            "partitioned over expert-dp), as DeepSpeed's tutorial passes it");
  return a;
}

// A generator of the engine's device seeded with `seed` (the routing noise of each rank).
torch::Generator seeded_generator(const torch::Device& device, uint64_t seed) {
  auto g = at::globalContext().defaultGenerator(device).clone();
  g.set_current_seed(seed);
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    auto group = zt::comm::world_group();
    const int rank = group->rank(), world = group->size();
    auto cfg = zt::Config::from_file(args.config, world);
    torch::manual_seed(args.seed);
    // The net, its forward and its loss; MoE: the expert groups and the engine's expert options.
    std::shared_ptr<torch::nn::Module> module;
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss_of;
    zt::EngineOptions eo;
    zt::models::CifarMoENet moe_net{nullptr};
    if (args.moe) {
      zt::models::CifarMoEOptions mo = args.moe_opt;
      zt::models::check_cifar_moe_options(mo, args.ep);  // before any group or weight
      if (args.ep > 1) {
        auto g = zt::models::cifar_moe_groups(group, args.ep);
        mo.ep_group = g.ep;
        eo.ep = g.ep;
        eo.expert_dp = g.expert_dp;
      }
      moe_net = zt::models::CifarMoENet(mo);
      if (args.moe_param_group) {
        eo.is_expert = zt::models::CifarMoENetImpl::is_expert;
        eo.expert_global_name = [p = moe_net.ptr()](const std::string& n) { return p->global_param_name(n); };
      }
      module = moe_net.ptr();
      forward = [p = moe_net.ptr()](const torch::Tensor& x) { return p->forward(x); };
      loss_of = [p = moe_net.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
      if (rank == 0) {
        std::string layers;
        for (size_t l = 0; l < moe_net->moe_layers(); ++l)
          layers += (l ? " " : "") + std::to_string(moe_net->local_experts(l) * args.ep);
        std::printf("MoE: experts per layer [%s] over ep %d, top-%lld, %s, noisy gate %s, aux coef %g\n", layers.c_str(),
                    args.ep, static_cast<long long>(mo.top_k), mo.use_residual ? "residual (PR-MoE)" : "standard",
                    mo.noisy_gate_policy.c_str(), mo.aux_loss_coef);
      }
    } else {
      zt::models::CifarNet net;
      module = net.ptr();
      forward = [p = net.ptr()](const torch::Tensor& x) { return p->forward(x); };
      loss_of = [p = net.ptr()](const torch::Tensor& x, const torch::Tensor& y) { return p->loss(x, y); };
    }
    auto engine = zt::initialize(module, cfg, eo);
    // Each rank's own routing noise, the same at every ep (so ep N routes as ep 1).
    if (moe_net) moe_net->set_generator(seeded_generator(engine->device(), args.seed * 1000003ULL + rank));
    auto train = std::make_shared<zt::data::Cifar10Dataset>(args.dir, true);
    zt::data::DistributedSampler sampler(train->size(), rank, world, true, 0);
    zt::data::Loader loader(train, sampler, cfg.train_micro_batch_size_per_gpu, engine->device());
    int64_t steps = args.epochs * loader.batches_per_epoch() / cfg.gradient_accumulation_steps;
    if (args.steps > 0) steps = args.steps;
    double running = 0, running_aux = 0;
    // Timing: wall time of the steps after the first kTimedAfter (loading, routing, the step;
    // each step reads its loss back, as the tutorial's loss.item() does), and the most bytes
    // the steps' phases had allocated on this rank.
    constexpr int64_t kTimedAfter = 10;
    auto t_timed = std::chrono::steady_clock::now();
    int64_t peak_bytes = 0;
    for (int64_t s = 0; s < steps; ++s) {
      if (s == kTimedAfter) t_timed = std::chrono::steady_clock::now();
      for (int64_t k = 0; k < cfg.gradient_accumulation_steps; ++k) {
        auto [x, y] = loader.next();
        auto xb = x.to(engine->compute_dtype());
        auto loss = engine->forward([&] { return loss_of(xb, y); });
        engine->backward(loss);
        engine->step();
        if (moe_net) running_aux += moe_net->last_aux_loss().item<double>() / cfg.gradient_accumulation_steps;
      }
      const auto& rep = engine->last_report();
      running += rep.loss;
      peak_bytes = std::max({peak_bytes, rep.forward.mem_peak, rep.backward.mem_peak, rep.step_phase.mem_peak});
      if (rank == 0 && (s + 1) % args.log_interval == 0) {
        std::printf("[epoch %lld, step %lld] loss: %.3f", static_cast<long long>(loader.epoch() + 1),
                    static_cast<long long>(s + 1), running / args.log_interval);
        if (moe_net) std::printf(" (moe aux %.4f)", running_aux / args.log_interval);
        std::printf("\n");
        std::fflush(stdout);
        running = running_aux = 0;
      }
    }
    if (engine->device().is_cuda()) torch::cuda::synchronize();
    if (rank == 0 && steps > kTimedAfter) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_timed).count();
      std::printf("timing: %.3f ms/step over steps %lld-%lld, peak %.2f MiB allocated (rank 0)\n",
                  ms / static_cast<double>(steps - kTimedAfter), static_cast<long long>(kTimedAfter + 1),
                  static_cast<long long>(steps), static_cast<double>(peak_bytes) / (1 << 20));
    }
    // Accuracy on the test set (every rank evaluates all of it, so the MoE layers' all-to-alls
    // match at ep > 1; rank 0 prints).
    zt::data::Cifar10Dataset test(args.dir, false);
    module->eval();
    torch::NoGradGuard no_grad;
    auto logits = forward(
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

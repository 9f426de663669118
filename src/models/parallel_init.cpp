// See parallel_init.h, [Parallel Init].
#include "models/parallel_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <mutex>

#include "zerotrain/error.h"

namespace zt::models {
namespace {

constexpr int kMtN = 624;  // MT19937's state words (ATen's MERSENNE_STATE_N)
constexpr int kMtM = 397;
constexpr uint32_t kMtMatrixA = 0x9908b0dfU;
constexpr uint32_t kMtUpper = 0x80000000U;
constexpr uint32_t kMtLower = 0x7fffffffU;

// at::mt19937_engine::next_state, word for word: the state after the next 624 outputs.
void mt_next_state(std::array<uint32_t, kMtN>& s) {
  auto twist = [](uint32_t u, uint32_t v) { return (((u & kMtUpper) | (v & kMtLower)) >> 1) ^ (v & 1U ? kMtMatrixA : 0U); };
  int j = 0;
  for (; j < kMtN - kMtM; ++j) s[j] = s[j + kMtM] ^ twist(s[j], s[j + 1]);
  for (; j < kMtN - 1; ++j) s[j] = s[j + kMtM - kMtN] ^ twist(s[j], s[j + 1]);
  s[kMtN - 1] = s[kMtM - 1] ^ twist(s[kMtN - 1], s[0]);
}

// Elements per fill task: a multiple of 16 (normal_'s block), small enough to spread a
// decoder layer over the threads, large enough that copying the generator (2.5 KB) is noise.
constexpr int64_t kNormalChunk = int64_t{1} << 20;

// The draw count normal_draws() assumes, against the real op, for n % 16 == 0 and != 0.
void check_normal_draws_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int64_t n : {48, 41}) {
      auto real = at::detail::getDefaultCPUGenerator().clone();
      auto skip = real.clone();
      torch::empty({n}, torch::kFloat).normal_(0.0, 1.0, real);
      discard_draws(skip, normal_draws(n));
      auto* r = at::check_generator<at::CPUGeneratorImpl>(real);
      auto* k = at::check_generator<at::CPUGeneratorImpl>(skip);
      ZT_CHECK_T(r->random() == k->random() && r->random64() == k->random64(), InternalError,
                 "parallel init: this libtorch's CPU normal_ on ", n, " floats takes other than ", normal_draws(n),
                 " draws; [Parallel Init] in models/parallel_init.h no longer holds (build the model serially)");
    }
  });
}

}  // namespace

void discard_draws(at::Generator& gen, int64_t n) {
  ZT_ASSERT(n >= 0, "discard_draws: n = ", n);
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::mt19937 engine = impl->engine();
  at::mt19937_data_pod d = engine.data();
  // operator(): --left_; at 0 the state is renewed (left_ = 624, next_ = 0); then next_++.
  while (n > 0) {
    const int64_t before_renewal = d.left_ - 1;  // calls that do not renew the state
    if (n <= before_renewal) {
      d.left_ -= static_cast<int>(n);
      d.next_ += static_cast<uint32_t>(n);
      break;
    }
    n -= before_renewal + 1;
    mt_next_state(d.state_);
    d.left_ = kMtN;
    d.next_ = 1;
  }
  engine.set_data(d);
  impl->set_engine(engine);
}

int64_t normal_draws(int64_t n) { return n + (n % 16 != 0 ? 16 : 0); }

ParallelNormal::ParallelNormal() { check_normal_draws_once(); }

void ParallelNormal::add(const torch::Tensor& t, double mean, double std) {
  ZT_ASSERT(t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous(),
            "ParallelNormal: contiguous fp32 CPU tensors only, got ", t.scalar_type(), " on ", t.device());
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const int64_t n = t.numel();
  if (n < 16) {  // normal_ draws these otherwise (doubles, one by one): the real op, here
    t.normal_(mean, std);
    return;
  }
  auto flat = t.view({-1});
  for (int64_t a = 0; a < n;) {
    // The last chunk takes the remainder, so every chunk has at least 16 elements.
    const int64_t len = n - a < 2 * kNormalChunk ? n - a : kNormalChunk;
    chunks_.push_back({flat.narrow(0, a, len), gen.clone(), mean, std});
    discard_draws(gen, normal_draws(len));
    a += len;
  }
}

void ParallelNormal::run() {
  at::parallel_for(0, static_cast<int64_t>(chunks_.size()), 1, [this](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      auto& c = chunks_[static_cast<size_t>(i)];
      c.view.normal_(c.mean, c.std, c.gen);
    }
  });
  chunks_.clear();
}

}  // namespace zt::models

// [Parallel Init] and [Layerwise Init] (models/parallel_init.h, models/llama.h) and
// [Layerwise QLoRA Base] (lora/qlora.h): skipping draws equals drawing them; normal_ filled
// in parallel chunks equals normal_ in order; a Llama skeleton initialised layer by layer
// equals the whole construction bit for bit and leaves the generator where it does; the
// QLoRA model built that way equals the one quantize_lora_bases makes from the whole base.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <string>
#include <vector>

#include "lora/lora.h"
#include "lora/lora_models.h"
#include "lora/qlora.h"
#include "models/llama.h"
#include "models/parallel_init.h"
#include "quant/nf4.h"
#include "support/tiny_llama.h"
#include "zerotrain/error.h"

namespace zt_test_layerwise_init {
namespace {

using zt::models::LlamaForCausalLM;
using zt::models::LlamaForCausalLMImpl;

uint32_t next_draw(at::Generator& g) { return at::check_generator<at::CPUGeneratorImpl>(g)->random(); }

uint32_t next_default_draw() {
  at::Generator g = at::detail::getDefaultCPUGenerator();
  return next_draw(g);
}

// The tiny QLoRA Llama's shape (tests/support/tiny_llama.h) and variants that change what
// the constructors draw: biases, a tied head, a pad row, sizes that are not multiples of 16.
std::vector<std::pair<std::string, zt::models::LlamaConfig>> configs() {
  const auto c = zt_test::tiny_qlora_llama_config();
  auto biased = c;
  biased.qkv_bias = true;
  biased.o_bias = true;
  biased.mlp_bias = true;
  biased.pad_token_id = 3;
  auto odd = c;
  odd.vocab_size = 61;         // V * d = 3904: 3904 % 16 = 0; with d 40 below, 2440 % 16 = 8
  odd.hidden_size = 40;
  odd.head_dim = 10;
  odd.intermediate_size = 100;
  odd.qkv_bias = true;         // biases of 40 and 20 elements
  odd.tie_word_embeddings = true;
  auto big = c;                // several ParallelNormal chunks per MLP matrix (2^20 elements each)
  big.hidden_size = 512;
  big.head_dim = 128;
  big.intermediate_size = 4100;
  big.num_hidden_layers = 1;
  return {{"tiny", c}, {"biased", biased}, {"odd_tied", odd}, {"big", big}};
}

torch::Tensor ids(int64_t vocab) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  return at::randint(0, vocab, {2, 12}, g);
}

zt::lora::LoraOptions opts(std::vector<std::string> targets) {
  zt::lora::LoraOptions o;
  o.r = 4;
  o.alpha = 8;
  o.target_modules = std::move(targets);
  return o;
}

}  // namespace

TEST(ParallelInit, DiscardEqualsDrawing) {
  for (int64_t n : {0, 1, 622, 623, 624, 625, 1248, 624 * 3 + 7, 100000}) {
    at::Generator drawn = at::make_generator<at::CPUGeneratorImpl>(11);
    for (int i = 0; i < 3; ++i) next_draw(drawn);  // start mid-block
    at::Generator skipped = drawn.clone();
    for (int64_t i = 0; i < n; ++i) next_draw(drawn);
    zt::models::discard_draws(skipped, n);
    for (int i = 0; i < 700; ++i) ASSERT_EQ(next_draw(drawn), next_draw(skipped)) << "n " << n << ", draw " << i;
  }
}

TEST(ParallelInit, ParallelNormalEqualsNormalInOrder) {
  // Sizes: under 16 (filled serially), 16, a partial block, several chunks with and without
  // a remainder (the chunk is 2^20 elements).
  const std::vector<int64_t> sizes = {16, 5, 17, (int64_t{3} << 20) + 5, int64_t{2} << 20, 40, (int64_t{1} << 20) + 16};
  std::vector<torch::Tensor> serial, parallel;
  torch::manual_seed(7);
  for (int64_t n : sizes) serial.push_back(torch::empty({n}).normal_(0.0, 0.02));
  const uint32_t after_serial = next_default_draw();
  torch::manual_seed(7);
  zt::models::ParallelNormal fill;
  for (int64_t n : sizes) {
    parallel.push_back(torch::empty({n}));
    fill.add(parallel.back(), 0.0, 0.02);
  }
  fill.run();
  EXPECT_EQ(next_default_draw(), after_serial);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_TRUE(torch::equal(serial[i], parallel[i])) << "size " << sizes[i];
}

TEST(LayerwiseInit, EqualsTheWholeConstruction) {
  for (const auto& [label, c] : configs()) {
    SCOPED_TRACE(label);
    torch::manual_seed(3);
    LlamaForCausalLM whole(c);
    const uint32_t after_whole = next_default_draw();
    torch::manual_seed(3);
    LlamaForCausalLM m(LlamaForCausalLMImpl::skeleton(c));
    EXPECT_EQ(LlamaForCausalLMImpl::construction_draws(c) > 0, true);
    std::vector<std::string> seen;
    m->init_layerwise([&](const std::string& name, const torch::Tensor&) {
      seen.push_back(name);
      return false;
    });
    EXPECT_EQ(next_default_draw(), after_whole);  // the next draws (LoRA's A) are the same
    const auto a = whole->named_parameters(), b = m->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(seen.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].key(), b[i].key());
      EXPECT_EQ(seen[i], a[i].key());
      EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
    }
    for (const auto& item : m->named_modules("", false)) {
      if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value())) {
        EXPECT_EQ(lin->options.in_features(), lin->weight.size(1)) << item.key();
        EXPECT_EQ(lin->options.out_features(), lin->weight.size(0)) << item.key();
      }
    }
    const auto x = ids(c.vocab_size);
    EXPECT_TRUE(torch::equal(whole->forward(x), m->forward(x)));
  }
}

TEST(LayerwiseInit, SkeletonIsRefusedUntilInitialisedAndTakenParametersAreFreed) {
  const auto c = configs()[0].second;
  LlamaForCausalLM m(LlamaForCausalLMImpl::skeleton(c));
  EXPECT_THROW(m->forward(ids(c.vocab_size)), zt::Error);
  m->init_layerwise([](const std::string& name, const torch::Tensor&) { return name.ends_with("mlp.up_proj.weight"); });
  EXPECT_EQ(m->model->layers->ptr<zt::models::LlamaDecoderLayerImpl>(0)->mlp->up_proj->weight.numel(), 0);
  EXPECT_EQ(m->model->layers->ptr<zt::models::LlamaDecoderLayerImpl>(0)->mlp->down_proj->weight.numel(),
            c.hidden_size * c.intermediate_size);
  EXPECT_THROW(m->init_layerwise(nullptr), zt::ConfigError);  // once only
  auto deferred = c;
  deferred.deferred_init = true;
  EXPECT_THROW(LlamaForCausalLMImpl::skeleton(deferred), zt::ConfigError);
}

TEST(QLora, LayerwiseBaseEqualsTheWholeBase) {
  for (const auto& targets : std::vector<std::vector<std::string>>{
           {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, {"q_proj", "down_proj"}}) {
    for (const auto& [label, c] : configs()) {
      SCOPED_TRACE(label + " " + targets.back());
      const auto o = opts(targets);
      // The former path: the whole base, LoRA, then quantize_lora_bases.
      torch::manual_seed(3);
      LlamaForCausalLM whole(c);
      auto ws = zt::lora::lora_space(*whole);
      auto wl = zt::lora::apply_lora(*whole, ws.sites, o);
      const int64_t whole_bytes = zt::lora::quantize_lora_bases(wl);
      // [Layerwise QLoRA Base].
      torch::manual_seed(3);
      LlamaForCausalLM m(LlamaForCausalLMImpl::skeleton(c));
      auto ms = zt::lora::lora_space(*m);
      zt::lora::Nf4Bases bases;
      m->init_layerwise(zt::lora::nf4_base_sink(zt::lora::select_targets(ms.sites, o), bases));
      EXPECT_EQ(bases.size(), wl.adapters.size());
      auto ml = zt::lora::apply_lora(*m, ms.sites, o, zt::lora::LoraBase::kWholeOrHeldElsewhere);
      EXPECT_EQ(zt::lora::attach_nf4_bases(ml, std::move(bases)), whole_bytes);
      ASSERT_EQ(ml.adapters.size(), wl.adapters.size());
      for (size_t i = 0; i < ml.adapters.size(); ++i) {
        const auto& a = wl.adapters[i];
        const auto& b = ml.adapters[i];
        EXPECT_EQ(a.site.path, b.site.path);
        EXPECT_TRUE(torch::equal(a.adapter->lora_A, b.adapter->lora_A)) << a.site.path;
        auto qa = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(a.adapter.ptr());
        auto qb = std::dynamic_pointer_cast<zt::lora::QLoraAdapterImpl>(b.adapter.ptr());
        ASSERT_TRUE(qa && qb);
        EXPECT_TRUE(torch::equal(qa->nf4().packed, qb->nf4().packed)) << a.site.path;
        EXPECT_TRUE(torch::equal(qa->nf4().qabsmax, qb->nf4().qabsmax)) << a.site.path;
        EXPECT_TRUE(torch::equal(qa->nf4().absmax2, qb->nf4().absmax2)) << a.site.path;
        EXPECT_EQ(qa->nf4().offset, qb->nf4().offset);
        EXPECT_EQ(b.site.linear->weight.numel(), 0);
      }
      const auto wp = whole->named_parameters(), mp = m->named_parameters();
      for (size_t i = 0; i < wp.size(); ++i) EXPECT_TRUE(torch::equal(wp[i].value(), mp[i].value())) << wp[i].key();
      // Non-zero B so the adapters count in the logits.
      {
        torch::NoGradGuard ng;
        for (size_t i = 0; i < ml.adapters.size(); ++i) {
          auto b = torch::full_like(wl.adapters[i].adapter->lora_B, 0.01 * static_cast<double>(i + 1));
          wl.adapters[i].adapter->lora_B.copy_(b);
          ml.adapters[i].adapter->lora_B.copy_(b);
        }
      }
      const auto x = ids(c.vocab_size);
      EXPECT_TRUE(torch::equal(whole->forward(x), m->forward(x)));
    }
  }
}

TEST(QLora, AttachNf4BasesRefusesBasesThatDoNotFitTheAdapters) {
  const auto c = configs()[0].second;
  torch::manual_seed(3);
  LlamaForCausalLM m(LlamaForCausalLMImpl::skeleton(c));
  auto ms = zt::lora::lora_space(*m);
  zt::lora::Nf4Bases bases;
  m->init_layerwise(zt::lora::nf4_base_sink(zt::lora::select_targets(ms.sites, opts({"q_proj", "v_proj"})), bases));
  // Adapters on q_proj only: the v_proj bases are left over (their weights are gone).
  auto lm = zt::lora::apply_lora(*m, ms.sites, opts({"q_proj"}), zt::lora::LoraBase::kWholeOrHeldElsewhere);
  EXPECT_THROW(zt::lora::attach_nf4_bases(lm, bases), zt::ConfigError);
  // Adapters on v_proj and o_proj: o_proj has no base (and still holds its weight).
  LlamaForCausalLM m2(LlamaForCausalLMImpl::skeleton(c));
  auto s2 = zt::lora::lora_space(*m2);
  zt::lora::Nf4Bases only_v;
  m2->init_layerwise(zt::lora::nf4_base_sink(zt::lora::select_targets(s2.sites, opts({"v_proj"})), only_v));
  auto lm2 = zt::lora::apply_lora(*m2, s2.sites, opts({"v_proj", "o_proj"}), zt::lora::LoraBase::kWholeOrHeldElsewhere);
  EXPECT_THROW(zt::lora::attach_nf4_bases(lm2, only_v), zt::ConfigError);
  // Without kWholeOrHeldElsewhere a 0-element weight is refused as before.
  LlamaForCausalLM m3(LlamaForCausalLMImpl::skeleton(c));
  auto s3 = zt::lora::lora_space(*m3);
  zt::lora::Nf4Bases q3;
  m3->init_layerwise(zt::lora::nf4_base_sink(zt::lora::select_targets(s3.sites, opts({"q_proj"})), q3));
  EXPECT_THROW(zt::lora::apply_lora(*m3, s3.sites, opts({"q_proj"})), zt::ConfigError);
}

}  // namespace zt_test_layerwise_init

namespace zt_test_layerwise_init {

// quantize_nf4's double-quantization offset (the absmaxes' mean) must not follow the thread
// count: a parallel float mean over Llama-3-8B's MLP matrix (917504 absmaxes) gave another
// offset and 54 other 8-bit codes on 2 threads than on 1 before nf4_absmax_mean.
TEST(Nf4Threads, A14336x4096MatrixQuantizesTheSameOnOneAndTwoThreads) {
  torch::manual_seed(9);
  const auto t = torch::empty({14336, 4096}).normal_(0.0, 0.02);
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = zt::quant::quantize_nf4(t);
  at::set_num_threads(2);
  const auto two = zt::quant::quantize_nf4(t);
  at::set_num_threads(before);
  EXPECT_EQ(one.offset, two.offset);
  EXPECT_TRUE(torch::equal(one.packed, two.packed));
  EXPECT_TRUE(torch::equal(one.qabsmax, two.qabsmax));
  EXPECT_TRUE(torch::equal(one.absmax2, two.absmax2));
}

}  // namespace zt_test_layerwise_init

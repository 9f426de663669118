// [Stale Gradients] (src/common/stale_grad.h) end to end on CPU ranks: at ZeRO stages 0 and
// 1 zero_grad() marks the flat gradients stale instead of filling them, and the next
// backward's first writers overwrite them. Trained with NaN written into every stale
// gradient after each step (a writer that added instead of overwriting would read it), the
// tiny Llamas (tied and untied embeddings, q/k/v biases) and GPT-2 follow training with the
// fill (ZT_STALE_GRADS=0) over three steps of two micro-steps each. Run at world 1, 2, 4.
#include <gtest/gtest.h>

#include "support/stale_grads_case.h"

namespace zt_test_stale_grads {

struct Case {
  const char* model;
  int stage;
};

class StaleGrads : public ::testing::TestWithParam<Case> {};

TEST_P(StaleGrads, PoisonedStaleGradientsTrainAsZeroed) {
  const auto c = GetParam();
  const torch::Device cpu(torch::kCPU);
  const auto ref = zt_test::stale_grads_run(c.model, c.stage, /*stale=*/false, /*poison=*/false, cpu);
  const auto got = zt_test::stale_grads_run(c.model, c.stage, /*stale=*/true, /*poison=*/true, cpu);
  ASSERT_EQ(ref.params.size(), got.params.size());
  ASSERT_FALSE(ref.params.empty());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(got.params[i]).all().item<bool>()) << "parameter " << i << " read a stale gradient";
    // Overwriting (a beta-0 GEMM, a store) gives the value adding into zeros gives; the
    // CPU's BLAS may block a beta-0 product differently, hence not bit for bit.
    EXPECT_LE((ref.params[i] - got.params[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
  }
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(ref.losses[s], got.losses[s], 1e-6) << "step " << s;
  // Not vacuous: every trainable parameter's gradient was stale (and NaN) after each of the
  // three steps, and the model trained.
  EXPECT_GT(got.trainable, 0);
  EXPECT_EQ(got.poisoned, 3 * got.trainable);
  EXPECT_EQ(ref.poisoned, 0);
  EXPECT_LT(got.losses.back(), got.losses.front());
}

INSTANTIATE_TEST_SUITE_P(Models, StaleGrads,
                         ::testing::Values(Case{"llama-tied", 0}, Case{"llama-tied", 1}, Case{"llama-untied", 0},
                                           Case{"llama-untied", 1}, Case{"gpt2", 0}, Case{"gpt2", 1}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string n = std::string(i.param.model) + "_z" + std::to_string(i.param.stage);
                           for (auto& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace zt_test_stale_grads

#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);  // CI has 2 cores; tests are about math, not speed
  return RUN_ALL_TESTS();
}

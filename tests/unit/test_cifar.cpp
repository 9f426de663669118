// CIFAR-10 binary loader (on synthetic files in the real format) and the tutorial CNN.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ftw.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "zerotrain/data/cifar10.h"
#include "zerotrain/data/loader.h"
#include "zerotrain/error.h"
#include "zerotrain/models/cifar_net.h"

namespace zt_test_cifar {

namespace fs = std::filesystem;
using zt::data::Cifar10Dataset;

namespace {

// std::filesystem::remove_all segfaults in binaries linked to libtorch (libtorch.so
// exports its own std::filesystem copy, whose remove_all jumps through a null pointer),
// so temp dirs are removed with nftw.
int rm_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }
void rm_rf(const fs::path& p) { ::nftw(p.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

struct CifarDir {
  fs::path path;
  CifarDir() {
    path = fs::temp_directory_path() /
           ("zt_cifar_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    rm_rf(path);
    fs::create_directories(path);
  }
  ~CifarDir() { rm_rf(path); }
  // Record r of file f: label (f + r) % 10; every pixel of channel c is (r + c * 50) % 256,
  // except the first pixel, which is 255 - label.
  void write(const std::string& name, int file, int records) const {
    std::ofstream out(path / name, std::ios::binary);
    for (int r = 0; r < records; ++r) {
      const int label = (file + r) % 10;
      std::string rec(Cifar10Dataset::kRecordBytes, '\0');
      rec[0] = static_cast<char>(label);
      for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 1024; ++i) rec[1 + c * 1024 + i] = static_cast<char>((r + c * 50) % 256);
      rec[1] = static_cast<char>(255 - label);
      out << rec;
    }
  }
  void write_all(int records) const {
    for (int f = 1; f <= 5; ++f) write("data_batch_" + std::to_string(f) + ".bin", f, records);
    write("test_batch.bin", 0, records);
  }
};

}  // namespace

TEST(DataCifar10, ReadsTheBinaryFormatAndNormalises) {
  CifarDir d;
  d.write_all(4);
  Cifar10Dataset train(d.path.string(), true), test(d.path.string(), false);
  ASSERT_EQ(train.size(), 20);
  ASSERT_EQ(test.size(), 4);
  EXPECT_EQ(train.images().sizes(), torch::IntArrayRef({20, 3, 32, 32}));
  auto e = train.get(6);  // file 2, record 2
  EXPECT_EQ(e.y.item<int64_t>(), 4);
  EXPECT_EQ(e.y.scalar_type(), torch::kLong);
  ASSERT_EQ(e.x.sizes(), torch::IntArrayRef({3, 32, 32}));
  EXPECT_EQ(e.x.scalar_type(), torch::kFloat);
  EXPECT_FLOAT_EQ(e.x[0][0][0].item<float>(), (251.0f / 255.0f - 0.5f) / 0.5f);
  EXPECT_FLOAT_EQ(e.x[0][5][7].item<float>(), (2.0f / 255.0f - 0.5f) / 0.5f);
  EXPECT_FLOAT_EQ(e.x[2][31][31].item<float>(), (102.0f / 255.0f - 0.5f) / 0.5f);  // channel 2: CHW order
  EXPECT_EQ(test.get(3).y.item<int64_t>(), 3);
  EXPECT_THROW(train.get(20), zt::Error);
}

TEST(DataCifar10, BadFilesAreNamed) {
  CifarDir d;
  d.write_all(2);
  {
    std::ofstream out(d.path / "data_batch_3.bin", std::ios::binary | std::ios::app);
    out << "xyz";  // 3 stray bytes
  }
  try {
    Cifar10Dataset ds(d.path.string(), true);
    ADD_FAILURE();
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_batch_3.bin"), std::string::npos) << e.what();
  }
  fs::remove(d.path / "test_batch.bin");
  try {
    Cifar10Dataset ds(d.path.string(), false);
    ADD_FAILURE();
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_batch.bin"), std::string::npos) << e.what();
  }
  {
    std::string rec(Cifar10Dataset::kRecordBytes, '\0');
    rec[0] = 42;  // CIFAR-100-style label
    std::ofstream(d.path / "bad.bin", std::ios::binary) << rec;
  }
  EXPECT_THROW(Cifar10Dataset(std::vector<std::string>{(d.path / "bad.bin").string()}), zt::Error);
}

TEST(CifarNet, ShapesParametersAndBackward) {
  torch::manual_seed(0);
  zt::models::CifarNet net;
  int64_t n = 0;
  for (const auto& p : net->parameters()) n += p.numel();
  EXPECT_EQ(n, 62006);  // the tutorial's parameter count
  EXPECT_TRUE(net->named_parameters().contains("fc3.bias"));

  CifarDir d;
  d.write_all(4);
  auto ds = std::make_shared<Cifar10Dataset>(d.path.string(), true);
  zt::data::Loader loader(ds, zt::data::DistributedSampler(ds->size(), 0, 1, true, 1), 8);
  auto [x, y] = loader.next();
  EXPECT_EQ(x.sizes(), torch::IntArrayRef({8, 3, 32, 32}));
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({8}));
  auto logits = net->forward(x);
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({8, 10}));
  auto loss = net->loss(x, y);
  EXPECT_NEAR(loss.item<double>(), std::log(10.0), 0.3);
  loss.backward();
  EXPECT_GT(net->conv1->weight.grad().abs().sum().item<double>(), 0.0);
}

}  // namespace zt_test_cifar

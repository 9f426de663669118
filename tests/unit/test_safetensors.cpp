// Safetensors reader/writer and the HF GPT-2 import/export built on it.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <ftw.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "io/safetensors.h"
#include "zerotrain/error.h"

namespace zt_test_safetensors {

namespace fs = std::filesystem;
using namespace zt::models;
using namespace zt::io;

namespace {

// std::filesystem::remove_all segfaults in binaries linked to libtorch (libtorch.so
// exports its own std::filesystem copy, whose remove_all jumps through a null pointer),
// so temp dirs are removed with nftw.
int rm_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }
void rm_rf(const fs::path& p) { ::nftw(p.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

// A fresh directory per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = fs::temp_directory_path() /
           ("zt_st_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    rm_rf(path);
    fs::create_directories(path);
  }
  ~TempDir() { rm_rf(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

void expect_error_mentions(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected zt::Error";
  } catch (const zt::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

std::map<std::string, torch::Tensor> sample_tensors() {
  torch::manual_seed(5);
  return {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2, 3}).to(torch::kBFloat16)},
      {"f64", torch::randn({4}, torch::kDouble)},
      {"i64", torch::arange(-5, 6, torch::kLong)},
      {"i32", torch::arange(9, torch::kInt).view({3, 3})},
      {"u8", torch::arange(250, 256).to(torch::kUInt8)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::randn({6, 4}).t()},  // non-contiguous input
  };
}

torch::Tensor tokens(int64_t B, int64_t T, int64_t V) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  return torch::randint(V, {B, T}, gen, torch::kLong);
}

}  // namespace

TEST(Safetensors, RoundTripIsExact) {
  TempDir d;
  auto in = sample_tensors();
  save_safetensors(d / "t.safetensors", in, {{"format", "pt"}, {"note", "x"}});
  EXPECT_FALSE(fs::exists(d / "t.safetensors.tmp"));
  SafetensorsFile f(d / "t.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "x");
  auto out = load_safetensors(d / "t.safetensors");
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [n, t] : in) {
    ASSERT_TRUE(out.count(n)) << n;
    EXPECT_EQ(out[n].scalar_type(), t.scalar_type()) << n;
    EXPECT_EQ(out[n].sizes(), t.sizes()) << n;
    EXPECT_TRUE(torch::equal(out[n], t)) << n;
    // Largest-element-first order keeps every tensor aligned to its element size.
    EXPECT_EQ(f.entry(n).begin % t.element_size(), 0u) << n;
  }
  EXPECT_EQ(safetensors_dtype("BF16"), torch::kBFloat16);
  EXPECT_EQ(safetensors_dtype_name(torch::kLong), "I64");
}

TEST(Safetensors, HeaderLayoutFollowsTheSpec) {
  TempDir d;
  save_safetensors(d / "a.safetensors", {{"w", torch::ones({2, 3})}});
  std::ifstream in(d / "a.safetensors", std::ios::binary);
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["w"]["dtype"], "F32");
  EXPECT_EQ(j["w"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["w"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(fs::file_size(d / "a.safetensors"), 8 + n + 24);
}

TEST(Safetensors, CorruptAndTruncatedFilesNameTheFile) {
  TempDir d;
  const auto path = d / "m.safetensors";
  save_safetensors(path, sample_tensors());
  const auto size = fs::file_size(path);

  fs::resize_file(path, size - 10);  // data cut short
  expect_error_mentions([&] { SafetensorsFile f(path); }, {path, "truncated"});

  fs::resize_file(path, 5);  // not even the length
  expect_error_mentions([&] { SafetensorsFile f(path); }, {path});

  save_safetensors(path, sample_tensors());
  {  // clobber the JSON
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(9);
    io.write("\x01\x02\x03", 3);
  }
  expect_error_mentions([&] { SafetensorsFile f(path); }, {path, "JSON"});

  {  // a header length bigger than the file
    save_safetensors(path, sample_tensors());
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    const char big[8] = {0, 0, 0, 0x10, 0, 0, 0, 0};
    io.write(big, 8);
  }
  expect_error_mentions([&] { SafetensorsFile f(path); }, {path});
  expect_error_mentions([&] { SafetensorsFile f(d / "missing.safetensors"); }, {"missing.safetensors"});

  save_safetensors(path, sample_tensors());
  expect_error_mentions([&] { SafetensorsFile(path).read("nope"); }, {path, "nope"});
}

TEST(HFGPT2, SaveLoadRoundTripGivesIdenticalLogits) {
  TempDir d;
  torch::manual_seed(1);
  GPT2 a(named_gpt2("gpt2-tiny"));
  save_hf_gpt2(*a, d.path.string(), torch::kFloat);

  // HF layout: prefix, Conv1D (in, out), no lm_head, format=pt.
  SafetensorsFile f(d / "model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.entry("transformer.h.0.attn.c_attn.weight").shape, (std::vector<int64_t>{128, 384}));
  EXPECT_EQ(f.entry("transformer.h.1.mlp.c_proj.weight").shape, (std::vector<int64_t>{512, 128}));
  EXPECT_FALSE(f.contains("lm_head.weight"));
  EXPECT_EQ(f.names().size(), a->named_parameters().size());

  auto cfg = gpt2_config_from_hf_json(d.path.string());
  EXPECT_EQ(cfg.n_layer, 2);
  EXPECT_EQ(cfg.vocab_size, 256);
  EXPECT_EQ(cfg.n_positions, 256);

  torch::manual_seed(2);  // different init, then overwritten by the load
  GPT2 b(cfg);
  load_hf_gpt2(*b, d.path.string());
  torch::NoGradGuard ng;
  auto idx = tokens(2, 16, 256);
  EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx)));
  auto c = load_hf_gpt2_pretrained(d.path.string());
  EXPECT_TRUE(torch::equal(a->forward(idx), c->forward(idx)));
}

TEST(HFGPT2, Bf16ExportAndLoadIntoBf16Model) {
  TempDir d;
  torch::manual_seed(1);
  GPT2 a(named_gpt2("gpt2-tiny"));
  save_hf_gpt2(*a, d.path.string(), torch::kBFloat16);
  EXPECT_EQ(SafetensorsFile(d / "model.safetensors").entry("transformer.wte.weight").dtype, torch::kBFloat16);
  auto j = nlohmann::json::parse(std::ifstream(d / "config.json"));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  GPT2 b(named_gpt2("gpt2-tiny"));
  b->to(torch::kBFloat16);
  load_hf_gpt2(*b, d / "model.safetensors");
  a->to(torch::kBFloat16);
  torch::NoGradGuard ng;
  auto idx = tokens(1, 8, 256);
  EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx)));
}

TEST(HFGPT2, AcceptsUnprefixedNamesAndSkipsBuffers) {
  TempDir d;
  torch::manual_seed(1);
  GPT2 a(named_gpt2("gpt2-tiny"));
  std::map<std::string, torch::Tensor> t;
  for (const auto& p : a->named_parameters()) {
    auto v = p.value().detach().clone();
    const auto& n = p.key();
    const bool conv = n.find("c_attn.weight") != std::string::npos || n.find("c_proj.weight") != std::string::npos ||
                      n.find("c_fc.weight") != std::string::npos;
    t[n] = conv ? v.t().contiguous() : v;
  }
  t["h.0.attn.bias"] = torch::ones({1, 1, 256, 256}, torch::kBool);  // old HF causal-mask buffers
  t["h.0.attn.masked_bias"] = torch::tensor(-1e4f);
  t["lm_head.weight"] = a->wte->weight.detach().clone();
  save_safetensors(d / "model.safetensors", t);
  GPT2 b(named_gpt2("gpt2-tiny"));
  load_hf_gpt2(*b, d.path.string());
  torch::NoGradGuard ng;
  auto idx = tokens(1, 8, 256);
  EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx)));
}

TEST(HFGPT2, MismatchesAreNamed) {
  TempDir d;
  torch::manual_seed(1);
  GPT2 a(named_gpt2("gpt2-tiny"));
  save_hf_gpt2(*a, d.path.string());

  GPT2 wrong_vocab(GPT2Config{2, 4, 128, 300, 256});
  expect_error_mentions([&] { load_hf_gpt2(*wrong_vocab, d.path.string()); },
                        {"transformer.wte.weight", "[256, 128]", "[300, 128]"});
  GPT2 deeper(GPT2Config{3, 4, 128, 256, 256});
  expect_error_mentions([&] { load_hf_gpt2(*deeper, d.path.string()); }, {"lacks parameters", "h.2.ln_1.weight"});
  GPT2 shallower(GPT2Config{1, 4, 128, 256, 256});
  expect_error_mentions([&] { load_hf_gpt2(*shallower, d.path.string()); }, {"transformer.h.1."});
  expect_error_mentions([&] { load_hf_gpt2(*a, d / "nothing_here"); }, {"nothing_here"});
}

TEST(HFGPT2, ConfigJsonValidation) {
  TempDir d;
  auto write = [&](const std::string& text) {
    std::ofstream(d / "config.json") << text;
  };
  write(R"({"model_type":"gpt2","n_layer":12,"n_head":12,"n_embd":768,"vocab_size":50257,"n_ctx":1024,
            "activation_function":"gelu_new","layer_norm_epsilon":1e-05})");
  auto c = gpt2_config_from_hf_json(d / "config.json");
  EXPECT_EQ(c.n_positions, 1024);
  EXPECT_EQ(c.n_embd, 768);
  write(R"({"n_layer":2,"n_head":4,"n_embd":128,"vocab_size":256,"n_positions":64,"activation_function":"relu"})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"activation_function", "relu"});
  write(R"({"n_layer":2,"n_head":4,"n_embd":128,"vocab_size":256,"n_positions":64,"tie_word_embeddings":false})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"tie_word_embeddings"});
  write(R"({"n_layer":2,"n_head":4,"n_embd":128,"n_positions":64})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"vocab_size"});
}

// ---- strict loading (issue 23) --------------------------------------------------------

namespace {

// The tensors of a gpt2-tiny in HF layout, as save_hf_gpt2 writes them.
std::map<std::string, torch::Tensor> hf_tiny() {
  torch::manual_seed(1);
  GPT2 a(named_gpt2("gpt2-tiny"));
  return hf_gpt2_tensors(*a);
}

// A safetensors file whose header is `header` (padded) over `data`.
void write_raw(const std::string& path, std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
  out << header << data;
}

}  // namespace

TEST(HFGPT2, IntegerAndBoolTensorsAreNotCastToFloat) {
  TempDir d;
  GPT2 m(named_gpt2("gpt2-tiny"));
  for (auto dtype : {torch::kLong, torch::kInt, torch::kBool, torch::kUInt8}) {
    auto t = hf_tiny();
    auto& ln = t.at("transformer.ln_f.weight");
    ln = ln.to(dtype);
    save_safetensors(d / "model.safetensors", t);
    // Was: loaded, the integers (or 0/1) cast to float.
    expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); },
                          {"transformer.ln_f.weight", "model.safetensors", safetensors_dtype_name(dtype),
                           "not floating point"});
  }
  auto t = hf_tiny();
  t.at("transformer.ln_f.weight") = t.at("transformer.ln_f.weight").to(torch::kDouble);  // F64 is fine
  save_safetensors(d / "model.safetensors", t);
  load_hf_gpt2(*m, d.path.string());
}

TEST(HFGPT2, NonFiniteWeightsAreNamed) {
  TempDir d;
  GPT2 m(named_gpt2("gpt2-tiny"));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto t = hf_tiny();
    t.at("transformer.h.1.mlp.c_fc.bias")[3] = bad;
    t.at("transformer.h.1.mlp.c_fc.bias")[5] = -bad;
    save_safetensors(d / "model.safetensors", t);
    expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); },
                          {"transformer.h.1.mlp.c_fc.bias", "holds 2 non-finite value(s)"});
  }
  auto t = hf_tiny();
  t.at("transformer.wpe.weight")[0][0] = std::numeric_limits<float>::infinity();
  // bf16 too (the check converts before testing).
  t.at("transformer.wpe.weight") = t.at("transformer.wpe.weight").to(torch::kBFloat16);
  save_safetensors(d / "model.safetensors", t);
  expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); }, {"transformer.wpe.weight", "non-finite"});
}

TEST(Safetensors, DuplicateTensorNamesAreRejected) {
  TempDir d;
  // Two entries named "w": nlohmann kept the last one silently.
  const std::string data(16, '\0');
  write_raw(d / "dup.safetensors",
            R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            data);
  expect_error_mentions([&] { SafetensorsFile f(d / "dup.safetensors"); }, {"dup.safetensors", "tensor 'w' appears twice"});
  // A name nested deeper (a "dtype" key in each entry) is not a duplicate.
  write_raw(d / "ok.safetensors",
            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            data);
  EXPECT_EQ(SafetensorsFile(d / "ok.safetensors").names().size(), 2u);
}

TEST(HFGPT2, ShardedIndexIsChecked) {
  TempDir d;
  GPT2 m(named_gpt2("gpt2-tiny"));
  auto t = hf_tiny();
  // Two shards: ln_f in one, everything else in the other.
  std::map<std::string, torch::Tensor> a, b;
  for (const auto& [n, v] : t) (n == "transformer.ln_f.weight" ? b : a)[n] = v;
  save_safetensors(d / "a.safetensors", a);
  save_safetensors(d / "b.safetensors", b);
  auto index = [&](const nlohmann::json& extra) {
    nlohmann::json wm;
    for (const auto& [n, v] : a) wm[n] = "a.safetensors";
    for (const auto& [n, v] : b) wm[n] = "b.safetensors";
    if (extra.is_object()) wm.update(extra);
    std::ofstream(d / "model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
  };
  index({});
  load_hf_gpt2(*m, d.path.string());  // the good case loads

  // A shard outside the model directory (was: read from wherever it pointed).
  fs::create_directories(d.path / "sub");
  save_safetensors((d.path.parent_path() / ("zt_outside_" + std::to_string(::getpid()) + ".safetensors")).string(), b);
  for (const std::string& out : {"../zt_outside_" + std::to_string(::getpid()) + ".safetensors",
                                 (d.path.parent_path() / ("zt_outside_" + std::to_string(::getpid()) + ".safetensors")).string(),
                                 std::string("sub/../../x.safetensors")}) {
    index({{"transformer.ln_f.weight", out}});
    expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); },
                          {"model.safetensors.index.json", "transformer.ln_f.weight", "outside the model directory"});
  }
  fs::remove(d.path.parent_path() / ("zt_outside_" + std::to_string(::getpid()) + ".safetensors"));
  // A non-string file name (was: type_error.302).
  index({{"transformer.ln_f.weight", 7}});
  expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); },
                        {"weight_map[\"transformer.ln_f.weight\"] must be a file name string"});
  // The same tensor in two shards.
  a["transformer.ln_f.weight"] = b["transformer.ln_f.weight"];
  save_safetensors(d / "a.safetensors", a);
  index({});
  expect_error_mentions([&] { load_hf_gpt2(*m, d.path.string()); }, {"ln_f.weight", "appears twice"});
}

TEST(HFGPT2, ConfigJsonWrongTypesAreNamed) {
  TempDir d;
  auto write = [&](const std::string& text) { std::ofstream(d / "config.json") << text; };
  const std::string sizes = R"("n_layer":2,"n_head":4,"n_embd":128,"vocab_size":256,"n_positions":64)";
  // Each was a raw type_error.302 from the JSON library.
  write("{" + sizes + R"(,"activation_function":7})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"activation_function must be a string"});
  write("{" + sizes + R"(,"layer_norm_epsilon":"1e-5"})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"layer_norm_epsilon must be a number"});
  write("{" + sizes + R"(,"n_inner":"512"})");
  expect_error_mentions([&] { gpt2_config_from_hf_json(d.path.string()); }, {"n_inner must be an integer"});
}

}  // namespace zt_test_safetensors

// zerotrain generate: look at what a model learned. Loads a Hugging Face directory (what
// `--init-from` reads and `convert` writes: GPT-2 or the Llama family), encodes a prompt
// with the directory's tokenizer.json (or takes token ids), and continues it greedily or by
// sampling (temperature, top-k). No KV cache: each new token runs the model over the whole
// sequence, which is plenty for inspecting small fine-tunes on a CPU or one GPU.
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "data/bpe_tokenizer.h"
#include "models/gpt2.h"
#include "models/hf_gpt2.h"
#include "models/hf_llama.h"
#include "models/llama.h"
#include "zerotrain/error.h"

namespace zt::cli {

namespace {

const char* kGenerateUsage =
    "usage: zerotrain generate --model-dir DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n\n"
    "Continues a prompt with a Hugging Face model directory (config.json + safetensors: GPT-2,\n"
    "Llama, Mistral, Qwen2), as --init-from reads it and convert writes it.\n\n"
    "options:\n"
    "  --model-dir DIR       the model\n"
    "  --prompt TEXT         encoded with --tokenizer (default DIR/tokenizer.json)\n"
    "  --prompt-ids LIST     token ids, comma-separated (no tokenizer needed)\n"
    "  --tokenizer PATH      a tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen2)\n"
    "  --max-new-tokens N    tokens to add (default 32)\n"
    "  --temperature X       0 = greedy (default); > 0 samples from softmax(logits / X)\n"
    "  --top-k K             sample among the K most likely tokens (default 0 = all)\n"
    "  --seed N              sampling seed (default 1234)\n"
    "  --device cpu|cuda     default cpu\n"
    "  --dtype fp32|bf16     compute dtype (default fp32)\n"
    "Prints the generated ids on one line ('ids: ...') and, with a tokenizer, the text.\n";

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) ids.push_back(parse_count("generate", "--prompt-ids", tok));
  ZT_CHECK_T(!ids.empty(), UsageError, "generate: --prompt-ids needs at least one id");
  return ids;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  std::string dir, prompt, prompt_ids, tokenizer_path, device = "cpu", dtype = "fp32";
  int64_t max_new = 32, top_k = 0, seed = 1234;
  double temperature = 0.0;
  Flags f("generate");
  f.text("--model-dir", dir);
  f.text("--prompt", prompt);
  f.text("--prompt-ids", prompt_ids);
  f.text("--tokenizer", tokenizer_path);
  f.count("--max-new-tokens", max_new);
  f.number("--temperature", temperature, 0.0);
  f.count("--top-k", top_k);
  f.count("--seed", seed);
  f.choice("--device", device, {"cpu", "cuda"});
  f.choice("--dtype", dtype, {"fp32", "bf16"});
  if (!f.parse(argc, argv)) {
    std::fputs(kGenerateUsage, stdout);
    return 0;
  }
  const bool have_prompt = f.given("--prompt");
  ZT_CHECK_T(!dir.empty(), UsageError, "generate: --model-dir DIR is required (see zerotrain generate --help)");
  ZT_CHECK_T(have_prompt != !prompt_ids.empty(), UsageError, "generate: give one of --prompt TEXT and --prompt-ids LIST");

  // The model: the architecture named by DIR/config.json.
  std::ifstream cf(dir + "/config.json");
  ZT_CHECK_T(cf.good(), ConfigError, "generate: --model-dir ", dir, " has no config.json (give a Hugging Face model "
             "directory: what --init-from reads and zerotrain convert writes)");
  const nlohmann::json hc = nlohmann::json::parse(cf, nullptr, /*allow_exceptions=*/false);
  ZT_CHECK_T(hc.is_object(), ConfigError, "generate: ", dir, "/config.json is not a JSON object");
  std::string arch = hc.contains("architectures") && hc["architectures"].is_array() && !hc["architectures"].empty() &&
                             hc["architectures"][0].is_string()
                         ? hc["architectures"][0].get<std::string>()
                         : hc.value("model_type", std::string());
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> logits_of;
  int64_t vocab = 0, max_pos = 0;
  if (arch == "GPT2LMHeadModel" || arch == "gpt2") {
    models::GPT2 m = models::load_hf_gpt2_pretrained(dir);
    vocab = m->config().vocab_size;
    max_pos = m->config().n_positions;
    module = m.ptr();
    logits_of = [m](const torch::Tensor& idx) mutable { return m->forward(idx); };
  } else {
    models::LlamaForCausalLM m = models::load_hf_llama_pretrained(dir);  // names the supported architectures
    vocab = m->config().vocab_size;
    max_pos = m->config().max_position_embeddings;
    module = m.ptr();
    logits_of = [m](const torch::Tensor& idx) mutable { return m->forward(idx); };
  }
  const torch::Device dev = device == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  module->to(dev, dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  module->eval();

  // The prompt, and a tokenizer that fits the model.
  std::optional<data::BpeTokenizer> tok;
  if (tokenizer_path.empty() && have_prompt) tokenizer_path = dir + "/tokenizer.json";
  if (!tokenizer_path.empty() && (have_prompt || std::ifstream(tokenizer_path).good())) {
    tok = data::BpeTokenizer::from_file(tokenizer_path);
    ZT_CHECK_T(tok->vocab_size() <= vocab, ConfigError, "generate: the tokenizer ", tokenizer_path, " has ",
               tok->vocab_size(), " tokens but the model's vocabulary is ", vocab,
               ": give the tokenizer the model was trained with");
  }
  std::vector<int64_t> ids;
  if (have_prompt) {
    for (int32_t t : tok->encode(prompt)) ids.push_back(t);
    ZT_CHECK_T(!ids.empty(), UsageError, "generate: --prompt encodes to no tokens");
  } else {
    ids = parse_ids(prompt_ids);
  }
  for (int64_t t : ids) {
    ZT_CHECK_T(t >= 0 && t < vocab, ConfigError, "generate: prompt id ", t, " is outside the model's vocabulary of ",
               vocab);
  }
  ZT_CHECK_T(static_cast<int64_t>(ids.size()) + max_new <= max_pos, ConfigError, "generate: ", ids.size(),
             " prompt tokens + --max-new-tokens ", max_new, " exceed the model's ", max_pos, " positions");

  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  std::vector<int64_t> out;
  auto seqt = torch::tensor(ids, torch::kLong).unsqueeze(0).to(dev);
  for (int64_t n = 0; n < max_new; ++n) {
    auto last = logits_of(seqt).select(1, seqt.size(1) - 1).squeeze(0).to(torch::kFloat).cpu();  // (V)
    int64_t next = 0;
    if (temperature == 0.0) {
      next = last.argmax().item<int64_t>();
    } else {
      auto scaled = last / temperature;
      if (top_k > 0 && top_k < scaled.size(0)) {
        const auto kth = std::get<0>(scaled.topk(top_k)).min();
        scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(scaled, 0), 1, false, gen).item<int64_t>();
    }
    out.push_back(next);
    seqt = torch::cat({seqt, torch::full({1, 1}, next, seqt.options())}, 1);
  }
  std::printf("ids:");
  for (int64_t t : out) std::printf(" %lld", static_cast<long long>(t));
  std::printf("\n");
  if (tok) {
    std::vector<int32_t> all(ids.begin(), ids.end());
    for (int64_t t : out) all.push_back(static_cast<int32_t>(t));
    std::printf("%s\n", tok->decode(all).c_str());
  }
  return 0;
}

}  // namespace zt::cli

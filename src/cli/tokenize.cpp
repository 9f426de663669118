// `zerotrain tokenize`: text files or JSONL -> token shards in llm.c's format (see
// [Shard Format] in data/shards.h), with the end-of-text token before every document,
// several encoding threads, a progress line and an optional validation split.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "data/bpe_tokenizer.h"
#include "data/sentencepiece.h"
#include "data/sft.h"
#include "data/shards.h"
#include "zerotrain/error.h"
#include "log/log.h"

namespace zt::cli {
namespace {

namespace fs = std::filesystem;

const char* kTokenizeUsage =
    "usage: zerotrain tokenize --tokenizer TOKENIZER.json --out DIR [options] INPUT...\n\n"
    "  INPUT               text files (each file is one document) or JSONL files (.jsonl/.json: one\n"
    "                      JSON object per line, its text field is a document); globs are expanded\n"
    "  --tokenizer PATH    a Hugging Face tokenizer.json (byte-level BPE), a SentencePiece BPE .model\n"
    "                      (Llama 2, Mistral), or a directory holding tokenizer.json\n"
    "  --out DIR           where the shards go: DIR/NAME_train_000000.bin, ... and DIR/NAME_val_000000.bin\n"
    "  --name NAME         shard name prefix (default: data)\n"
    "  --shard-tokens N    tokens per shard (default 1e8); documents continue into the next shard\n"
    "  --val-fraction F    every (1/F)-th document goes to the validation shards (default 0: none)\n"
    "  --threads N         encoding threads (default: all cores)\n"
    "  --text-field KEY    the JSONL field holding the text (default: text)\n"
    "  --eot TOKEN         end-of-text token written before every document (default: the tokenizer's\n"
    "                      <|endoftext|>, <|end_of_text|>, </s> or <|im_end|>; a .model's </s>)\n"
    "  --sft               supervised fine-tuning: JSONL lines {\"prompt\": ..., \"response\": ...} (each\n"
    "                      example is prompt, response, EOS (the --eot token)) or {\"messages\": [...]}\n"
    "                      (formatted with the chat_template of tokenizer_config.json beside the\n"
    "                      tokenizer), packed back to back; a .mask file beside each shard marks the\n"
    "                      response and EOS, or the assistant turns, as the only training targets and\n"
    "                      where each example starts (see docs/data.md)\n"
    "Shards hold uint16 ids when the vocabulary fits (<= 65536 tokens), else uint32 (magic 20240801).\n";

struct TokenizeArgs {
  std::string tokenizer, out, name = "data", text_field = "text", eot;
  std::vector<std::string> inputs;
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0;
  int threads = 0;
  bool help = false;
  bool sft = false;
};

TokenizeArgs parse_tokenize_args(int argc, char** argv) {
  TokenizeArgs a;
  std::vector<std::string> inputs;
  Flags f("tokenize");
  f.text("--tokenizer", a.tokenizer);
  f.text("--out", a.out);
  f.text("--name", a.name);
  f.text("--text-field", a.text_field);
  f.text("--eot", a.eot);
  f.count("--shard-tokens", a.shard_tokens, 1);
  f.count("--threads", a.threads);
  f.number("--val-fraction", a.val_fraction, 0.0, 1.0);
  f.flag("--sft", a.sft);
  f.positionals(inputs, "INPUT files");
  a.help = !f.parse(argc, argv);
  if (a.help) return a;
  ZT_CHECK_T(!a.tokenizer.empty(), UsageError, "tokenize: --tokenizer TOKENIZER.json is required");
  ZT_CHECK_T(!a.out.empty(), UsageError, "tokenize: --out DIR is required");
  ZT_CHECK_T(!inputs.empty(), UsageError, "tokenize: no input files (give text or JSONL files after the options)");
  for (const auto& in : inputs)
    for (auto& p : expand_glob_or_self(in)) a.inputs.push_back(p);
  return a;
}

bool is_jsonl(const std::string& path) {
  const auto ext = fs::path(path).extension().string();
  return ext == ".jsonl" || ext == ".json" || ext == ".ndjson";
}

// One split's shards: tokens accumulate and are written shard_tokens at a time.
class SplitWriter {
 public:
  SplitWriter(std::string prefix, int64_t shard_tokens, int token_bytes, int64_t vocab)
      : prefix_(std::move(prefix)), shard_tokens_(shard_tokens), token_bytes_(token_bytes), vocab_(vocab) {}
  void add(int32_t eot, const std::vector<int32_t>& ids) {
    buf_.push_back(static_cast<uint32_t>(eot));
    for (int32_t t : ids) buf_.push_back(static_cast<uint32_t>(t));
    ++docs_;
    while (static_cast<int64_t>(buf_.size()) >= shard_tokens_) flush(static_cast<size_t>(shard_tokens_));
  }
  // One SFT example (see [SFT Packing] in data/sft.h); the shards get .mask files.
  void add_sft(const std::vector<std::vector<int32_t>>& ids, const std::vector<data::ChatSegment>& segments,
               std::optional<int32_t> eos) {
    data::append_sft_segments(ids, segments, eos, buf_, mask_);
    ++docs_;
    while (static_cast<int64_t>(buf_.size()) >= shard_tokens_) flush(static_cast<size_t>(shard_tokens_));
  }
  void finish() {
    if (!buf_.empty()) flush(buf_.size());
  }
  int64_t tokens() const { return tokens_; }
  int64_t docs() const { return docs_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void flush(size_t n) {
    char num[16];
    std::snprintf(num, sizeof(num), "%06zu", files_.size());
    const std::string path = prefix_ + num + ".bin";
    data::write_shard(path, std::span<const uint32_t>(buf_.data(), n), token_bytes_, vocab_);
    files_.push_back(path);
    tokens_ += static_cast<int64_t>(n);
    if (!mask_.empty()) {
      std::vector<uint32_t> m(mask_.begin(), mask_.begin() + static_cast<std::ptrdiff_t>(n));
      data::write_shard(data::mask_path(path), m, 2, data::kSftMaskValues);
      mask_.erase(mask_.begin(), mask_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::string prefix_;
  int64_t shard_tokens_;
  int token_bytes_;
  int64_t vocab_;
  std::vector<uint32_t> buf_;
  std::vector<uint8_t> mask_;  // SFT only: parallel to buf_
  std::vector<std::string> files_;
  int64_t tokens_ = 0, docs_ = 0;
};

}  // namespace

std::vector<std::string> expand_glob_or_self(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  return data::expand_glob(pattern);
}

int cmd_tokenize(int argc, char** argv) {
  TokenizeArgs a = parse_tokenize_args(argc, argv);
  if (a.help) {
    std::fputs(kTokenizeUsage, stdout);
    return 0;
  }
  std::string tok_path = a.tokenizer;
  if (fs::is_directory(tok_path)) tok_path = (fs::path(tok_path) / "tokenizer.json").string();
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Either tokenizer behind one batch encoder.
  std::optional<data::BpeTokenizer> bpe;
  std::optional<data::SentencePieceTokenizer> spm;
  int32_t eot = -1;
  std::string eot_text;
  if (fs::path(tok_path).extension() == ".model") {
    spm.emplace(data::SentencePieceTokenizer::from_file(tok_path));
    eot = a.eot.empty() ? spm->eos_id() : spm->piece_to_id(a.eot);
    ZT_CHECK_T(eot >= 0 && (a.eot.empty() || eot != spm->unk_id()), ConfigError, "tokenize: ", tok_path,
               a.eot.empty() ? " has no </s>; name the end-of-text piece with --eot" : " has no piece --eot '" + a.eot + "'");
    eot_text = spm->piece(eot).text;
  } else {
    bpe.emplace(data::BpeTokenizer::from_file(tok_path));
    std::optional<int32_t> id = a.eot.empty() ? bpe->end_of_text_id() : bpe->token_to_id(a.eot);
    ZT_CHECK_T(id.has_value(), ConfigError, "tokenize: ", tok_path,
               a.eot.empty() ? " has none of <|endoftext|>, <|end_of_text|>, </s>, <|im_end|>; name the end-of-text "
                               "token with --eot"
                             : " has no token --eot '" + a.eot + "'");
    eot = *id;
    eot_text = bpe->id_to_token(eot);
  }
  auto encode_batch = [&](const std::vector<std::string>& docs) {
    if (bpe) return bpe->encode_batch(docs, threads);
    std::vector<std::vector<int32_t>> out(docs.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i = next++; i < docs.size(); i = next++) out[i] = spm->encode(docs[i]);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    return out;
  };
  const int64_t vocab = bpe ? bpe->vocab_size() : spm->vocab_size();
  const int token_bytes = vocab <= 65536 ? 2 : 4;
  std::error_code ec;
  fs::create_directories(a.out, ec);
  ZT_CHECK_T(!ec, ConfigError, "tokenize: cannot create --out '", a.out, "': ", ec.message());
  const std::string base = (fs::path(a.out) / a.name).string();
  SplitWriter train(base + "_train_", a.shard_tokens, token_bytes, vocab);
  SplitWriter val(base + "_val_", a.shard_tokens, token_bytes, vocab);

  int64_t total_bytes = 0;
  for (const auto& p : a.inputs) {
    const auto sz = fs::file_size(p, ec);
    ZT_CHECK_T(!ec, ConfigError, "tokenize: cannot read input '", p, "': ", ec.message());
    total_bytes += static_cast<int64_t>(sz);
  }
  log::info("tokenize: %zu input file(s), %.1f MB, tokenizer %s (vocab %lld, eot %d '%s'), %d "
            "thread(s), %s shards",
              a.inputs.size(), total_bytes / 1e6, tok_path.c_str(), static_cast<long long>(vocab), eot,
              eot_text.c_str(), threads, token_bytes == 2 ? "uint16" : "uint32");

  const auto t0 = std::chrono::steady_clock::now();
  log::Progress bar("tokenize", static_cast<double>(total_bytes) / 1e6, "MB");
  int64_t read_bytes = 0, doc_index = 0;
  std::vector<std::string> batch;
  int64_t batch_bytes = 0;
  // --sft: the examples of `batch`, whose texts are their segments' in order.
  std::vector<data::SftExample> sft_batch;
  std::optional<data::ChatTemplate> chat;  // loaded at the first `messages` line
  auto progress = [&](bool final) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char detail[128];
    std::snprintf(detail, sizeof(detail), "%lld documents, %.2fM tokens, %.1f MB/s", static_cast<long long>(doc_index),
                  (train.tokens() + val.tokens()) / 1e6, s > 0 ? read_bytes / s / 1e6 : 0.0);
    if (final) bar.finish(detail);
    else bar.update(static_cast<double>(read_bytes) / 1e6, detail);
  };
  auto run_batch = [&] {
    if (batch.empty()) return;
    const auto ids = encode_batch(batch);
    if (a.sft) {  // the batch holds each example's segments in order
      size_t next = 0;
      for (const data::SftExample& ex : sft_batch) {
        const double f = a.val_fraction;
        const bool is_val = f > 0 && std::floor((doc_index + 1) * f) > std::floor(doc_index * f);
        const std::vector<std::vector<int32_t>> seg_ids(ids.begin() + static_cast<std::ptrdiff_t>(next),
                                                        ids.begin() + static_cast<std::ptrdiff_t>(next + ex.segments.size()));
        next += ex.segments.size();
        (is_val ? val : train).add_sft(seg_ids, ex.segments, ex.eos ? std::optional<int32_t>(eot) : std::nullopt);
        ++doc_index;
      }
      sft_batch.clear();
      batch.clear();
      batch_bytes = 0;
      progress(false);
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i, ++doc_index) {
      const double f = a.val_fraction;
      const bool is_val = f > 0 && std::floor((doc_index + 1) * f) > std::floor(doc_index * f);
      (is_val ? val : train).add(eot, ids[i]);
    }
    batch.clear();
    batch_bytes = 0;
    progress(false);
  };
  auto batch_full = [&] { return batch_bytes >= (int64_t{8} << 20) || batch.size() >= 8192; };
  auto add_doc = [&](std::string doc, int64_t bytes) {
    read_bytes += bytes;
    batch_bytes += static_cast<int64_t>(doc.size());
    batch.push_back(std::move(doc));
    if (batch_full()) run_batch();
  };
  auto add_sft = [&](data::SftExample ex, int64_t bytes) {  // a batch ends on an example's end
    read_bytes += bytes;
    for (auto& seg : ex.segments) {
      batch_bytes += static_cast<int64_t>(seg.text.size());
      batch.push_back(std::move(seg.text));
    }
    sft_batch.push_back(std::move(ex));
    if (batch_full()) run_batch();
  };
  const std::string config_path = (fs::path(tok_path).parent_path() / "tokenizer_config.json").string();
  for (const auto& path : a.inputs) {
    std::ifstream in(path, std::ios::binary);
    ZT_CHECK_T(in.good(), ConfigError, "tokenize: cannot open input '", path, "'");
    if (is_jsonl(path)) {
      std::string line;
      int64_t lineno = 0;
      while (std::getline(in, line)) {
        ++lineno;
        const int64_t bytes = static_cast<int64_t>(line.size()) + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) {
          read_bytes += bytes;
          continue;
        }
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const std::exception& e) {
          throw ConfigError(detail::cat("tokenize: ", path, ":", lineno, ": not valid JSON: ", e.what()));
        }
        if (a.sft) {
          if (data::sft_line_is_chat(j) && !chat) {
            ZT_CHECK_T(bpe.has_value(), ConfigError, "tokenize --sft: ", path, ":", lineno, ": 'messages' lines need a "
                       "tokenizer.json (byte-level BPE); with a SentencePiece .model the special tokens of the chat "
                       "template are not split out. Give {\"prompt\": ..., \"response\": ...} lines instead");
            try {
              chat.emplace(data::ChatTemplate::from_tokenizer_config(config_path));
            } catch (const ConfigError& e) {
              throw ConfigError(detail::cat("tokenize --sft: ", path, ":", lineno, ": ", e.what()));
            }
            log::info("tokenize --sft: chat template from %s (%s)", config_path.c_str(),
                      chat->has_generation_blocks() ? "its {% generation %} blocks are trained"
                                                    : "the assistant turns are trained");
          }
          add_sft(data::parse_sft_json(j, detail::cat(path, ":", lineno), chat ? &*chat : nullptr), bytes);
          continue;
        }
        ZT_CHECK_T(j.is_object() && j.contains(a.text_field) && j[a.text_field].is_string(), ConfigError,
                   "tokenize: ", path, ":", lineno, ": no string field '", a.text_field,
                   "' (name the field with --text-field)");
        add_doc(j[a.text_field].get<std::string>(), bytes);
      }
    } else {
      ZT_CHECK_T(!a.sft, ConfigError, "tokenize --sft: '", path,
                 "' is not JSONL (.jsonl/.json/.ndjson with {\"prompt\": ..., \"response\": ...} or {\"messages\": "
                 "[...]} per line)");
      std::stringstream ss;
      ss << in.rdbuf();
      std::string doc = ss.str();
      const auto bytes = static_cast<int64_t>(doc.size());
      add_doc(std::move(doc), bytes);
    }
  }
  run_batch();
  train.finish();
  val.finish();
  progress(true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const SplitWriter* w : {&train, &val}) {
    if (w->files().empty()) continue;
    log::info("%s: %lld documents, %lld tokens in %zu shard(s): %s%s", w == &train ? "train" : "val",
                static_cast<long long>(w->docs()), static_cast<long long>(w->tokens()), w->files().size(),
                w->files().front().c_str(), w->files().size() > 1 ? " ..." : "");
  }
  log::info("tokenized %.1f MB in %.2f s (%.1f MB/s, %.0f tokens/s)", read_bytes / 1e6, s,
              s > 0 ? read_bytes / s / 1e6 : 0.0, s > 0 ? (train.tokens() + val.tokens()) / s : 0.0);
  return 0;
}

}  // namespace zt::cli

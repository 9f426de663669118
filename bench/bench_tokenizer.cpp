// Tokenizing throughput of data::BpeTokenizer: a text file cut into documents of about
// --doc-bytes (at line ends), encoded with --threads threads, best of --repeat runs.
// Prints one JSON line; --ids-out writes every document's ids (uint32 little-endian,
// documents back to back) so bench/tokenizer_vs_hf.py can check them against Hugging
// Face `tokenizers` and time both with the same threads.
//
//   build/bench_tokenizer --tokenizer tests/fixtures/bpe/tokenizer.json --text /tmp/bpe_corpus.txt --threads 2
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe_tokenizer.h"
#include "zerotrain/error.h"

namespace {

std::vector<std::string> cut_documents(const std::string& text, size_t doc_bytes) {
  std::vector<std::string> docs;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = start + doc_bytes;
    if (end >= text.size()) {
      end = text.size();
    } else {
      const size_t nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    docs.push_back(text.substr(start, end - start));
    start = end;
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer, text_path, ids_out;
  int threads = 1, repeat = 3;
  size_t doc_bytes = 4096;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_tokenizer: %s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--tokenizer") tokenizer = val();
    else if (f == "--text") text_path = val();
    else if (f == "--threads") threads = std::stoi(val());
    else if (f == "--repeat") repeat = std::stoi(val());
    else if (f == "--doc-bytes") doc_bytes = std::stoul(val());
    else if (f == "--ids-out") ids_out = val();
    else {
      std::fprintf(stderr, "usage: bench_tokenizer --tokenizer JSON --text FILE [--threads N] [--repeat N] "
                           "[--doc-bytes N] [--ids-out FILE]\n");
      return 2;
    }
  }
  try {
    const auto tok = zt::data::BpeTokenizer::from_file(tokenizer);
    std::ifstream in(text_path, std::ios::binary);
    ZT_CHECK(in.good(), "cannot read ", text_path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const auto docs = cut_documents(text, doc_bytes);
    double best = 1e30;
    std::vector<std::vector<int32_t>> ids;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      ids = tok.encode_batch(docs, threads);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    size_t n = 0;
    for (const auto& d : ids) n += d.size();
    // Validation: decoding gives the text back (normalized, when the tokenizer has a normalizer).
    std::string back;
    for (const auto& d : ids) back += tok.decode(d);
    ZT_CHECK(back == tok.normalize(text), "bench_tokenizer: decode(encode(text)) differs from the (normalized) text");
    if (!ids_out.empty()) {
      std::ofstream out(ids_out, std::ios::binary);
      for (const auto& d : ids) {
        std::vector<uint32_t> u(d.begin(), d.end());
        out.write(reinterpret_cast<const char*>(u.data()), static_cast<std::streamsize>(u.size() * 4));
      }
    }
    std::printf("{\"impl\": \"zerotrain\", \"threads\": %d, \"documents\": %zu, \"bytes\": %zu, \"tokens\": %zu, "
                "\"seconds\": %.6f, \"mb_per_s\": %.3f, \"tokens_per_s\": %.0f, \"roundtrip\": true}\n",
                threads, docs.size(), text.size(), n, best, text.size() / best / 1e6, n / best);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}

// SFT `messages` lines through the tokenizer's chat template ([Chat Mask] in
// data/chat_template.h, [SFT Packing] in data/sft.h): the Llama 3 and ChatML templates
// (their Hugging Face text, rendered by minja) give exactly the hand-written text, ids and
// mask, with only the assistant turns trained; templates that cannot be used are errors
// naming the file; `zerotrain tokenize --sft` writes the same ids and mask.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt/fs.h"
#include "data/bpe_tokenizer.h"
#include "data/chat_template.h"
#include "data/sft.h"
#include "data/shards.h"
#include "support/run_shell.h"
#include "zerotrain/error.h"

namespace zt_test_chat_template {

namespace fs = std::filesystem;
using namespace zt::data;
using nlohmann::json;

namespace {

// Meta-Llama-3-8B-Instruct's chat_template, verbatim.
const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' "
    "%}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
// Qwen2-Instruct's ChatML template (a default system turn), verbatim.
const char* kChatMlTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] "
    "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\\n' }}{% endif %}";

// The BPE fixture's tokenizer.json (which has <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2)
// with Llama 3's special tokens added as ids 3000-3003, and a tokenizer_config.json with
// `chat_template`, in `dir`.
constexpr int32_t kBot = 3000, kStartHeader = 3001, kEndHeader = 3002, kEotId = 3003, kImStart = 1, kImEnd = 2;
void write_chat_tokenizer(const fs::path& dir, const std::string& chat_template) {
  fs::create_directories(dir);
  json tok = json::parse(std::ifstream(std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/tokenizer.json"));
  int32_t id = kBot;
  for (const char* t : {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}) {
    tok["added_tokens"].push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  std::ofstream(dir / "tokenizer.json") << tok.dump();
  std::ofstream(dir / "tokenizer_config.json")
      << json{{"bos_token", {{"content", "<|begin_of_text|>"}, {"lstrip", false}}},
              {"eos_token", "<|eot_id|>"},
              {"chat_template", chat_template}}
             .dump();
}

const json kLlamaChat = json::array({{{"role", "system"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "What is 2 + 2?"}},
                                     {{"role", "assistant"}, {"content", "4."}},
                                     {{"role", "user"}, {"content", "And 3 + 3?"}},
                                     {{"role", "assistant"}, {"content", " 6. "}}});
const json kChatMlChat = json::array({{{"role", "user"}, {"content", "Hi"}},
                                      {{"role", "assistant"}, {"content", "Hello!"}},
                                      {{"role", "user"}, {"content", "Bye"}},
                                      {{"role", "assistant"}, {"content", "Bye."}}});

// Ids by hand: each piece is either a special token's id or plain text encoded alone.
struct Piece {
  int32_t id = -1;
  std::string text;
};
std::vector<int32_t> ids_of(const BpeTokenizer& tok, const std::vector<Piece>& pieces) {
  std::vector<int32_t> out;
  for (const auto& p : pieces) {
    if (p.id >= 0) {
      out.push_back(p.id);
    } else {
      for (int32_t t : tok.encode(p.text)) out.push_back(t);
    }
  }
  return out;
}

// The expected Llama 3 segments: text, train flag and the pieces of its ids.
struct Expected {
  ChatSegment segment;
  std::vector<Piece> pieces;
};
std::vector<Expected> llama3_expected() {
  const Piece sh{kStartHeader, ""}, eh{kEndHeader, ""}, eot{kEotId, ""};
  return {
      {{"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        false},
       {{kBot, ""}, sh, {-1, "system"}, eh, {-1, "\n\nBe brief."}, eot, sh, {-1, "user"}, eh, {-1, "\n\nWhat is 2 + 2?"},
        eot, sh, {-1, "assistant"}, eh, {-1, "\n\n"}}},
      {{"4.<|eot_id|>", true}, {{-1, "4."}, eot}},
      {{"<|start_header_id|>user<|end_header_id|>\n\nAnd 3 + 3?<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n",
        false},
       {sh, {-1, "user"}, eh, {-1, "\n\nAnd 3 + 3?"}, eot, sh, {-1, "assistant"}, eh, {-1, "\n\n"}}},
      {{"6.<|eot_id|>", true}, {{-1, "6."}, eot}},  // the template trims " 6. "
  };
}
std::vector<Expected> chatml_expected() {
  const Piece st{kImStart, ""}, end{kImEnd, ""};
  return {
      {{"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
        "assistant\n",
        false},
       {st, {-1, "system\nYou are a helpful assistant."}, end, {-1, "\n"}, st, {-1, "user\nHi"}, end, {-1, "\n"}, st,
        {-1, "assistant\n"}}},
      {{"Hello!<|im_end|>", true}, {{-1, "Hello!"}, end}},
      {{"\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", false},
       {{-1, "\n"}, st, {-1, "user\nBye"}, end, {-1, "\n"}, st, {-1, "assistant\n"}}},
      {{"Bye.<|im_end|>", true}, {{-1, "Bye."}, end}},
      {{"\n", false}, {{-1, "\n"}}},  // the newline after the last <|im_end|>: not trained
  };
}

// The packed tokens and mask the expected segments give (start bit on the first token).
void pack_expected(const BpeTokenizer& tok, const std::vector<Expected>& want, std::vector<uint32_t>& tokens,
                   std::vector<uint8_t>& mask) {
  const size_t first = tokens.size();
  for (const auto& e : want) {
    for (int32_t t : ids_of(tok, e.pieces)) {
      tokens.push_back(static_cast<uint32_t>(t));
      mask.push_back(e.segment.train ? kSftTarget : 0);
    }
  }
  mask[first] |= kSftExampleStart;
}

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt_chat_" + std::to_string(::getpid()));
    zt::ckpt::remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { zt::ckpt::remove_tree(dir_); }
  // The error message of f(), or "no error".
  template <typename Fn>
  static std::string error_of(Fn&& f) {
    try {
      f();
    } catch (const zt::ConfigError& e) {
      return e.what();
    }
    return "no error";
  }
  fs::path dir_;
};

}  // namespace

// A Llama 3 and a ChatML conversation: the segments are exactly the hand-written text, the
// ids exactly the hand-split ids, and the mask 1 on the assistant turns (content and
// end-of-turn token) only.
TEST_F(ChatTemplateTest, Llama3AndChatMlGiveTheExpectedIdsAndMask) {
  struct Case {
    const char* name;
    const char* source;
    json messages;
    std::vector<Expected> want;
  };
  for (const Case& c : {Case{"llama3", kLlama3Template, kLlamaChat, llama3_expected()},
                        Case{"chatml", kChatMlTemplate, kChatMlChat, chatml_expected()}}) {
    SCOPED_TRACE(c.name);
    const fs::path d = dir_ / c.name;
    write_chat_tokenizer(d, c.source);
    const auto tmpl = ChatTemplate::from_tokenizer_config((d / "tokenizer_config.json").string());
    const auto tok = BpeTokenizer::from_file((d / "tokenizer.json").string());
    const SftExample ex = parse_sft_json(json{{"messages", c.messages}}, "chat.jsonl:1", &tmpl);
    EXPECT_FALSE(ex.eos);  // the template ends the turns: no EOS appended
    std::vector<ChatSegment> want_segments;
    for (const auto& e : c.want) want_segments.push_back(e.segment);
    ASSERT_EQ(ex.segments, want_segments);
    std::vector<std::vector<int32_t>> ids;
    for (const auto& s : ex.segments) ids.push_back(tok.encode(s.text));
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    append_sft_segments(ids, ex.segments, std::nullopt, tokens, mask);
    std::vector<uint32_t> want_tokens;
    std::vector<uint8_t> want_mask;
    pack_expected(tok, c.want, want_tokens, want_mask);
    EXPECT_EQ(tokens, want_tokens);
    EXPECT_EQ(mask, want_mask);
    // The trained ids are exactly the assistant contents and their end-of-turn ids.
    std::vector<uint32_t> trained;
    for (size_t i = 0; i < tokens.size(); ++i)
      if (mask[i] & kSftTarget) trained.push_back(tokens[i]);
    std::vector<uint32_t> want_trained;
    for (const auto& e : c.want)
      if (e.segment.train)
        for (int32_t t : ids_of(tok, e.pieces)) want_trained.push_back(static_cast<uint32_t>(t));
    EXPECT_EQ(trained, want_trained);
    EXPECT_EQ(trained.back(), static_cast<uint32_t>(std::string(c.name) == "llama3" ? kEotId : kImEnd));
  }
}

// Templates that cannot be used are ConfigErrors naming the file (or the line) and the fix.
TEST_F(ChatTemplateTest, UnusableTemplatesAreNamed) {
  const std::string cfg = (dir_ / "tokenizer_config.json").string();
  EXPECT_NE(error_of([&] { ChatTemplate::from_tokenizer_config(cfg); }).find("cannot open '" + cfg + "'"),
            std::string::npos);
  std::ofstream(cfg) << json{{"eos_token", "</s>"}}.dump();
  EXPECT_NE(error_of([&] { ChatTemplate::from_tokenizer_config(cfg); }).find("has no chat_template"),
            std::string::npos);
  // Not Jinja that minja knows: an unclosed block, and an unknown filter at render time.
  std::ofstream(cfg) << json{{"chat_template", "{% for m in messages %}{{ m['content'] }}"}}.dump();
  const std::string unclosed = error_of([&] { ChatTemplate::from_tokenizer_config(cfg); });
  EXPECT_NE(unclosed.find("chat template of '" + cfg + "' does not parse"), std::string::npos) << unclosed;
  std::ofstream(cfg) << json{{"chat_template", "{% for m in messages %}{{ m['content'] | frobnicate }}{% endfor %}"}}
                            .dump();
  const auto odd = ChatTemplate::from_tokenizer_config(cfg);
  const std::string filter = error_of([&] { odd.segments(kChatMlChat, "c.jsonl:3"); });
  EXPECT_NE(filter.find("c.jsonl:3"), std::string::npos) << filter;
  EXPECT_NE(filter.find("chat template of '" + cfg + "' failed"), std::string::npos) << filter;
  // raise_exception, as Llama 2 / Mistral templates use to refuse a conversation.
  const ChatTemplate strict("{{ raise_exception('Conversation roles must alternate user/assistant') }}", json::object(),
                            "strict.json");
  EXPECT_NE(error_of([&] { strict.segments(kChatMlChat, "c.jsonl:4"); }).find("roles must alternate"),
            std::string::npos);
  // A template whose earlier turns change once later ones follow: the split is refused.
  const ChatTemplate last_only(
      "{% for m in messages %}{% if loop.last %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endif %}{% endfor %}",
      json::object(), "last.json");
  const std::string prefix = error_of([&] { last_only.segments(kChatMlChat, "c.jsonl:5"); });
  EXPECT_NE(prefix.find("c.jsonl:5: the chat template of 'last.json' renders the conversation up to message 1"),
            std::string::npos)
      << prefix;
  // Lines: no assistant turn; no role; a messages line without a template.
  const ChatTemplate chatml(kChatMlTemplate, json::object(), "chatml.json");
  EXPECT_NE(error_of([&] { chatml.segments(json::array({{{"role", "user"}, {"content", "x"}}}), "c.jsonl:6"); })
                .find("c.jsonl:6: no message has role 'assistant'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { chatml.segments(json::array({{{"content", "x"}}}), "c.jsonl:7"); })
                .find("c.jsonl:7: message 0 has no string 'role'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_sft_json(json{{"messages", kChatMlChat}}, "c.jsonl:8", nullptr); })
                .find("c.jsonl:8: a 'messages' line needs the tokenizer's chat template"),
            std::string::npos);
}

// zerotrain tokenize --sft reads tokenizer_config.json beside tokenizer.json and writes
// the same ids and mask for `messages` lines, mixed with prompt/response lines.
TEST_F(ChatTemplateTest, TokenizeSftFormatsMessagesWithTheTemplate) {
  const fs::path tokdir = dir_ / "llama3";
  write_chat_tokenizer(tokdir, kLlama3Template);
  {
    std::ofstream j(dir_ / "chat.jsonl");
    j << json{{"messages", kLlamaChat}}.dump() << "\n";
    j << json{{"prompt", "Q"}, {"response", " A"}}.dump() << "\n";
    j << json{{"messages", kLlamaChat}}.dump() << "\n";
  }
  const std::string bin = std::string(ZT_BINARY_DIR) + "/zerotrain";
  const std::string out = (dir_ / "shards").string();
  const auto r = zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 120 " + bin + " tokenize --sft --tokenizer " +
                                             tokdir.string() + " --out " + out + " --eot '<|eot_id|>' " +
                                             (dir_ / "chat.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("chat template from " + (tokdir / "tokenizer_config.json").string()), std::string::npos)
      << r.output;
  const auto tok = BpeTokenizer::from_file((tokdir / "tokenizer.json").string());
  std::vector<uint32_t> want_tokens;
  std::vector<uint8_t> want_mask;
  pack_expected(tok, llama3_expected(), want_tokens, want_mask);
  append_sft_example(tok.encode("Q"), tok.encode(" A"), kEotId, want_tokens, want_mask);
  pack_expected(tok, llama3_expected(), want_tokens, want_mask);
  MappedShard s(out + "/data_train_000000.bin"), m(mask_path(out + "/data_train_000000.bin"));
  EXPECT_EQ(m.info().vocab_size, kSftMaskValues);
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < s.info().num_tokens; ++i) {
    tokens.push_back(s.token(i));
    mask.push_back(static_cast<uint8_t>(m.token(i)));
  }
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_EQ(mask, want_mask);

  // Without tokenizer_config.json: the error names the file and the line.
  fs::remove(tokdir / "tokenizer_config.json");
  const auto e = zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 120 " + bin + " tokenize --sft --tokenizer " +
                                             tokdir.string() + " --out " + out + "_2 " + (dir_ / "chat.jsonl").string());
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.output.find("cannot open '" + (tokdir / "tokenizer_config.json").string() + "'"), std::string::npos)
      << e.output;
}

// [Generation Blocks]: templates that wrap the assistant turns in {% generation %} give
// the ids and the mask transformers 5.24 gives (apply_chat_template(...,
// return_assistant_tokens_mask=True) with the BPE fixture's tokenizer.json, recorded
// below): exactly the text inside the blocks is trained. "chatml": the blocks hold the
// content and <|im_end|>; "think": earlier assistant turns lose their <think> part (the
// prefix rule refuses this template); "blocks": trim_blocks / lstrip_blocks leave the
// newline after <|im_end|> inside the block, so it is trained too (the prefix rule would
// not train it).
TEST_F(ChatTemplateTest, GenerationBlocksGiveTransformersAssistantMask) {
  const char* chatml = R"tmpl({% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})tmpl";
  const char* think = R"tmpl({%- for message in messages %}
    {%- if message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- if not loop.last %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
        {{- content + '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)tmpl";
  const char* blocks = R"tmpl({% for message in messages %}
  {% if message.role == 'assistant' %}
<|im_start|>assistant
  {% generation %}
{{ message.content }}<|im_end|>
  {% endgeneration %}
  {% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
  {% endif %}
{% endfor %})tmpl";
  const json think_chat = json::array({{{"role", "user"}, {"content", "2+2?"}},
                                       {{"role", "assistant"}, {"content", "<think>four</think>4."}},
                                       {{"role", "user"}, {"content", "3+3?"}},
                                       {{"role", "assistant"}, {"content", "<think>six</think>6."}}});
  struct Case {
    const char* name;
    const char* source;
    json messages;
    std::string text;
    std::vector<uint32_t> ids;
    std::vector<uint8_t> mask;  // transformers' assistant_masks
  };
  const std::vector<Case> cases = {
      {"chatml", chatml, kChatMlChat, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nBye.<|im_end|>\n",
       {1, 1146, 263, 202, 43, 76, 2, 202, 1, 2247, 1169, 460, 202, 43, 72, 353, 82, 4, 2, 202, 1, 1146, 263, 202, 37, 92, 72, 2, 202, 1, 2247, 1169, 460, 202, 37, 92, 72, 17, 2, 202},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0}},
      {"think", think, think_chat, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>six</think>6.<|im_end|>\n",
       {1, 1146, 263, 202, 21, 14, 21, 34, 2, 202, 1, 2247, 1169, 460, 202, 23, 17, 2, 202, 1, 1146, 263, 202, 22, 14, 22, 34, 2, 202, 1, 2247, 1169, 460, 202, 31, 260, 1228, 33, 343, 91, 31, 18, 260, 1228, 33, 25, 17, 2, 202},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0}},
      {"blocks", blocks, kChatMlChat, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\nBye.<|im_end|>\n",
       {1, 1146, 263, 202, 43, 76, 2, 202, 1, 2247, 1169, 460, 202, 43, 72, 353, 82, 4, 2, 202, 1, 1146, 263, 202, 37, 92, 72, 2, 202, 1, 2247, 1169, 460, 202, 37, 92, 72, 17, 2, 202},
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1}},
  };
  const fs::path d = dir_ / "gen";
  write_chat_tokenizer(d, chatml);
  const auto tok = BpeTokenizer::from_file((d / "tokenizer.json").string());
  auto hf_mask = [](const Case& c) {
    std::vector<uint8_t> m;
    for (size_t i = 0; i < c.mask.size(); ++i)
      m.push_back(static_cast<uint8_t>((c.mask[i] ? kSftTarget : 0) | (i == 0 ? kSftExampleStart : 0)));
    return m;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ChatTemplate tmpl(c.source, json::object(), c.name);
    EXPECT_TRUE(tmpl.has_generation_blocks());
    EXPECT_EQ(tmpl.render(c.messages, false), c.text);  // no marker left in the text
    const SftExample ex = parse_sft_json(json{{"messages", c.messages}}, "gen.jsonl:1", &tmpl);
    std::vector<std::vector<int32_t>> ids;
    for (const auto& seg : ex.segments) ids.push_back(tok.encode(seg.text));
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    append_sft_segments(ids, ex.segments, std::nullopt, tokens, mask);
    EXPECT_EQ(tokens, c.ids);
    EXPECT_EQ(mask, hf_mask(c));
  }
  // zerotrain tokenize --sft with the "blocks" template writes the same ids and mask.
  {
    const fs::path bd = dir_ / "gen_cli";
    write_chat_tokenizer(bd, blocks);
    std::ofstream(dir_ / "gen.jsonl") << json{{"messages", kChatMlChat}}.dump() << "\n";
    const std::string out = (dir_ / "gen_shards").string();
    const auto r = zt::test_support::run_shell("OMP_NUM_THREADS=1 timeout -k 5 120 " + std::string(ZT_BINARY_DIR) +
                                               "/zerotrain tokenize --sft --tokenizer " + bd.string() + " --out " + out +
                                               " " + (dir_ / "gen.jsonl").string());
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("its {% generation %} blocks are trained"), std::string::npos) << r.output;
    MappedShard sh(out + "/data_train_000000.bin"), m(mask_path(out + "/data_train_000000.bin"));
    std::vector<uint32_t> tokens;
    std::vector<uint8_t> mask;
    for (int64_t i = 0; i < sh.info().num_tokens; ++i) {
      tokens.push_back(sh.token(i));
      mask.push_back(static_cast<uint8_t>(m.token(i)));
    }
    EXPECT_EQ(tokens, cases[2].ids);
    EXPECT_EQ(mask, hf_mask(cases[2]));
  }
  // Without the tags the prefix rule applies: it trains no newline after <|im_end|> (the
  // "blocks" template's block does), and refuses "think".
  auto untagged = [](std::string s) {
    for (const char* t : {"{% generation %}", "{% endgeneration %}", "{%- generation %}", "{%- endgeneration %}"}) {
      for (size_t at; (at = s.find(t)) != std::string::npos;) s.erase(at, std::string(t).size());
    }
    return s;
  };
  const ChatTemplate plain_chatml(untagged(chatml), json::object(), "plain");
  EXPECT_FALSE(plain_chatml.has_generation_blocks());
  EXPECT_EQ(plain_chatml.segments(kChatMlChat, "x")[1], (ChatSegment{"Hello!<|im_end|>", true}));
  EXPECT_EQ(ChatTemplate(blocks, json::object(), "b").segments(kChatMlChat, "x")[1],
            (ChatSegment{"Hello!<|im_end|>\n", true}));
  const ChatTemplate plain_think(untagged(think), json::object(), "plain_think");
  EXPECT_NE(error_of([&] { plain_think.segments(think_chat, "x"); }).find("differently from the whole conversation"),
            std::string::npos);
  // Tags that do not pair up, and blocks that hold nothing for a conversation.
  EXPECT_NE(error_of([&] { ChatTemplate("{% generation %}x", json::object(), "open.json"); })
                .find("chat template of 'open.json': 1 {% generation %} block(s) without {% endgeneration %}"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ChatTemplate("x{% endgeneration %}", json::object(), "close.json"); })
                .find("{% endgeneration %} without a {% generation %}"),
            std::string::npos);
  const ChatTemplate bot_only(
      "{% for m in messages %}{% if m.role == 'bot' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ "
      "m.content }}{% endif %}{% endfor %}",
      json::object(), "bot.json");
  EXPECT_NE(error_of([&] { bot_only.segments(kChatMlChat, "c.jsonl:9"); })
                .find("c.jsonl:9: the {% generation %} blocks of the chat template of 'bot.json' hold no text"),
            std::string::npos);
}

}  // namespace zt_test_chat_template

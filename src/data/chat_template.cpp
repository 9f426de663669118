// Chat templates through minja (see [Chat Mask] in data/chat_template.h). This file is
// built outside the unity batches: minja.hpp declares a global `json` alias.
#include "data/chat_template.h"

#include <minja/minja.hpp>

#include <cctype>
#include <fstream>
#include <regex>
#include <sstream>
#include <string_view>

#include "zerotrain/error.h"

namespace zt::data {

struct ChatTemplate::Impl {
  std::shared_ptr<minja::TemplateNode> root;
  nlohmann::ordered_json special_tokens;  // {"bos_token": "<s>", ...}
  bool generation = false;                // the template has {% generation %} blocks
};

namespace {

// [Generation Blocks] markers: minja parses {% generation %} as a no-op, so each tag is
// rewritten to an `if` block that prints a marker, keeping the tag's whitespace control
// ({%- ... -%}, trim_blocks, lstrip_blocks act on the `if` and `endif` tags exactly as on
// the generation tag). Control characters that chat text does not hold.
constexpr std::string_view kChatGenOpen = "\x1e\x1fzt:generation\x1f\x1e";
constexpr std::string_view kChatGenClose = "\x1e\x1fzt:endgeneration\x1f\x1e";

// `source` with the generation tags replaced; `count` the number of blocks. ConfigError
// when the tags do not pair up.
std::string chat_mark_generation(const std::string& source, const std::string& where, int& count) {
  static const std::regex tag(R"(\{%([-+]?)\s*(generation|endgeneration)\s*([-+]?)%\})");
  std::string out;
  int depth = 0;
  count = 0;
  auto last = source.cbegin();
  for (std::sregex_iterator it(source.begin(), source.end(), tag), end; it != end; ++it) {
    const auto& m = *it;
    out.append(last, m[0].first);
    last = m[0].second;
    const bool open = m[2] == "generation";
    if (open) {
      ++depth;
      ++count;
    } else {
      ZT_CHECK_T(depth > 0, ConfigError, "chat template of '", where,
                 "': {% endgeneration %} without a {% generation %} before it");
      --depth;
    }
    out += "{%" + m[1].str() + " if true %}";
    out += open ? kChatGenOpen : kChatGenClose;
    out += "{% endif " + m[3].str() + "%}";
  }
  out.append(last, source.cend());
  ZT_CHECK_T(depth == 0, ConfigError, "chat template of '", where, "': ", depth,
             " {% generation %} block(s) without {% endgeneration %}");
  return out;
}

// `text` without the generation markers.
std::string chat_strip_generation(std::string text) {
  for (std::string_view mark : {kChatGenOpen, kChatGenClose}) {
    size_t w = 0;
    for (size_t r = 0; r < text.size();) {
      if (text.compare(r, mark.size(), mark) == 0) {
        r += mark.size();
      } else {
        text[w++] = text[r++];
      }
    }
    text.resize(w);
  }
  return text;
}

// A tokenizer_config.json token entry: "<s>" or {"content": "<s>", ...}; "" otherwise.
std::string chat_token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

ChatTemplate ChatTemplate::from_tokenizer_config(const std::string& path) {
  std::ifstream in(path);
  ZT_CHECK_T(in.good(), ConfigError, "chat template: cannot open '", path,
             "' (a `messages` line needs the model's tokenizer_config.json beside tokenizer.json, as Hugging Face "
             "ships it; or give {\"prompt\": ..., \"response\": ...} lines)");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("chat template: '", path, "' is not valid JSON: ", e.what()));
  }
  ZT_CHECK_T(j.is_object() && j.contains("chat_template"), ConfigError, "chat template: '", path,
             "' has no chat_template (take tokenizer_config.json from the instruct/chat model, or give {\"prompt\": "
             "..., \"response\": ...} lines)");
  std::string source;
  const auto& t = j["chat_template"];
  if (t.is_string()) {
    source = t.get<std::string>();
  } else if (t.is_array()) {  // named templates: [{"name": "default", "template": ...}, ...]
    for (const auto& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        source = e["template"].get<std::string>();
    ZT_CHECK_T(!source.empty(), ConfigError, "chat template: '", path,
               "': chat_template is a list without a \"default\" entry");
  } else {
    throw ConfigError(detail::cat("chat template: '", path, "': chat_template must be a string or a list of {name, "
                                  "template}"));
  }
  nlohmann::json tokens = nlohmann::json::object();
  for (const auto& [k, v] : j.items()) {
    const bool is_token = k.size() > 6 && k.compare(k.size() - 6, 6, "_token") == 0;
    if (is_token && !chat_token_text(v).empty()) tokens[k] = chat_token_text(v);
  }
  return ChatTemplate(source, tokens, path);
}

ChatTemplate::ChatTemplate(const std::string& source, const nlohmann::json& special_tokens, std::string where)
    : where_(std::move(where)) {
  auto impl = std::make_shared<Impl>();
  int blocks = 0;
  const std::string marked = chat_mark_generation(source, where_, blocks);
  impl->generation = blocks > 0;
  try {
    // transformers' Jinja environment: trim_blocks, lstrip_blocks.
    impl->root = minja::Parser::parse(marked, minja::Options{true, true, false});
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("chat template of '", where_, "' does not parse: ", e.what()));
  }
  impl->special_tokens = nlohmann::ordered_json::parse(special_tokens.dump());
  impl_ = std::move(impl);
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt) const {
  std::string text = render_marked(messages, add_generation_prompt);
  return impl_->generation ? chat_strip_generation(std::move(text)) : text;
}

bool ChatTemplate::has_generation_blocks() const { return impl_->generation; }

std::string ChatTemplate::render_marked(const nlohmann::json& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json ctx = impl_->special_tokens;
  ctx["messages"] = nlohmann::ordered_json::parse(messages.dump());
  ctx["add_generation_prompt"] = add_generation_prompt;
  try {
    return impl_->root->render(minja::Context::make(minja::Value(ctx)));
  } catch (const std::exception& e) {
    throw ConfigError(detail::cat("chat template of '", where_, "' failed: ", e.what()));
  }
}

std::vector<ChatSegment> ChatTemplate::segments(const nlohmann::json& messages, const std::string& where) const {
  ZT_CHECK_T(messages.is_array() && !messages.empty(), ConfigError, where,
             ": 'messages' must be a non-empty list of {\"role\": ..., \"content\": ...}");
  bool any_assistant = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    ZT_CHECK_T(m.is_object() && m.contains("role") && m["role"].is_string(), ConfigError, where, ": message ", i,
               " has no string 'role'");
    any_assistant |= m["role"] == "assistant";
  }
  ZT_CHECK_T(any_assistant, ConfigError, where,
             ": no message has role 'assistant' (only assistant turns are trained: nothing to learn)");
  auto at = [&](const std::string& what) { return detail::cat(where, ": ", what); };
  std::string full;
  try {
    full = impl_->generation ? render_marked(messages, false) : render(messages, false);
  } catch (const ConfigError& e) {
    throw ConfigError(at(e.what()));
  }
  std::vector<ChatSegment> out;
  auto push = [&](std::string text, bool train) {
    if (text.empty()) return;
    if (!out.empty() && out.back().train == train) out.back().text += text;
    else out.push_back({std::move(text), train});
  };
  if (impl_->generation) {  // [Generation Blocks]: exactly the text inside the blocks is trained
    int depth = 0;
    size_t from = 0;
    bool trained = false;
    for (size_t i = 0; i < full.size();) {
      const bool open = full.compare(i, kChatGenOpen.size(), kChatGenOpen) == 0;
      const bool close = !open && full.compare(i, kChatGenClose.size(), kChatGenClose) == 0;
      if (!open && !close) {
        ++i;
        continue;
      }
      push(full.substr(from, i - from), depth > 0);
      trained |= depth > 0 && i > from;
      depth += open ? 1 : -1;
      i += open ? kChatGenOpen.size() : kChatGenClose.size();
      from = i;
    }
    push(full.substr(from), depth > 0);
    ZT_CHECK_T(trained, ConfigError, where, ": the {% generation %} blocks of the chat template of '", where_,
               "' hold no text for this conversation, so nothing would be trained (the blocks should wrap the "
               "assistant turns)");
    return out;
  }
  size_t done = 0;  // full[0, done) is in `out`
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    std::string before, with;
    try {
      const auto head = nlohmann::json(std::vector<nlohmann::json>(messages.begin(), messages.begin() + i));
      const auto upto = nlohmann::json(std::vector<nlohmann::json>(messages.begin(), messages.begin() + i + 1));
      before = render(head, true);
      with = render(upto, false);
    } catch (const ConfigError& e) {
      throw ConfigError(at(e.what()));
    }
    ZT_CHECK_T(with.compare(0, before.size(), before) == 0 && full.compare(0, with.size(), with) == 0 &&
                   before.size() >= done,
               ConfigError, where, ": the chat template of '", where_, "' renders the conversation up to message ", i,
               " (assistant) differently from the whole conversation, so the assistant's tokens cannot be told apart "
               "(see [Chat Mask] in docs/data.md); give {\"prompt\": ..., \"response\": ...} lines instead");
    size_t end = with.size();
    while (end > before.size() && std::isspace(static_cast<unsigned char>(with[end - 1]))) --end;
    push(full.substr(done, before.size() - done), false);
    push(full.substr(before.size(), end - before.size()), true);
    done = end;
  }
  push(full.substr(done), false);
  return out;
}

}  // namespace zt::data

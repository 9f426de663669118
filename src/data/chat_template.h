// A Hugging Face chat template (tokenizer_config.json's `chat_template`, Jinja) rendered
// by minja (third_party/minja, the engine llama.cpp used), and the split of a rendered
// conversation into the text the model trains on and the text it does not.
//
// [Chat Mask] The loss of a `messages` example covers the assistant turns only: for each
// message i with role "assistant", the text the template adds for it after the generation
// prompt,  render(messages[:i+1]) minus render(messages[:i], add_generation_prompt=true),
// i.e. the assistant's content and its end-of-turn token (`Hi<|eot_id|>` for Llama 3,
// `Hi<|im_end|>` for ChatML). Whitespace the template writes after the end-of-turn token
// (ChatML's newline) is not trained. Everything else (system and user turns, the role
// headers, the BOS) is context only. The split needs each such render to be a prefix of
// the whole conversation's render; a template that renders earlier turns differently
// once later ones follow (e.g. one that drops the reasoning of earlier assistant turns) is
// a ConfigError naming the file and the message.
//
// [Generation Blocks] A template that marks what the model generates with
// `{% generation %}...{% endgeneration %}` (the blocks of transformers'
// `return_assistant_tokens_mask`) is cut by them instead: exactly the text rendered inside
// the blocks is trained, the rest is context, and the prefix rule above is not used (such
// a template may rewrite earlier turns). A conversation whose render has no text inside a
// block is a ConfigError; so are tags that do not pair up. minja itself treats the tags as
// no-ops: each is rewritten before parsing to an `if` block that prints a marker (with the
// tag's whitespace control), and the markers are cut out of the render.
//
// As transformers' apply_chat_template: trim_blocks and lstrip_blocks, the context holds
// `messages`, `add_generation_prompt` and the special tokens of tokenizer_config.json
// (bos_token, eos_token, ...); `raise_exception` raises a ConfigError. Unlike it,
// `strftime_now` is not defined, so a template that prints the date (Llama 3.1/3.2) takes
// its fixed default and the tokens do not depend on the day they were made.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zt::data {

// A piece of rendered text and whether its tokens are loss targets.
struct ChatSegment {
  std::string text;
  bool train = false;
  bool operator==(const ChatSegment&) const = default;
};

class ChatTemplate {
 public:
  // Reads tokenizer_config.json: `chat_template` (a string, or a list of {name, template}
  // whose "default" entry is used) and every `*_token` (a string or {"content": ...}).
  // ConfigError naming the file when it is missing, has no chat_template, or the template
  // does not parse.
  static ChatTemplate from_tokenizer_config(const std::string& path);
  // `source` the Jinja text; `special_tokens` e.g. {"bos_token": "<s>"}; `where` names the
  // template's origin in errors.
  ChatTemplate(const std::string& source, const nlohmann::json& special_tokens, std::string where);

  // The template applied to `messages` (a JSON array of {"role", "content", ...}).
  std::string render(const nlohmann::json& messages, bool add_generation_prompt) const;
  // Whether the template has {% generation %} blocks ([Generation Blocks]).
  bool has_generation_blocks() const;
  // The whole conversation's render cut into untrained and trained pieces ([Chat Mask], or
  // [Generation Blocks] when the template has them),
  // adjacent pieces merged, empty ones dropped. ConfigError naming `where` (file:line) for
  // messages that are not a list of objects with a string role, a conversation without an
  // assistant turn, and a template whose renders are not prefixes of one another.
  std::vector<ChatSegment> segments(const nlohmann::json& messages, const std::string& where) const;
  const std::string& where() const { return where_; }

 private:
  // render() with the [Generation Blocks] markers left in.
  std::string render_marked(const nlohmann::json& messages, bool add_generation_prompt) const;
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  std::string where_;
};

}  // namespace zt::data

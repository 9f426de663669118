#include "data/sft.h"

#include "zerotrain/error.h"

namespace zt::data {

bool sft_line_is_chat(const nlohmann::json& j) {
  return j.is_object() && j.contains("messages") && !j.contains("prompt");
}

SftExample parse_sft_json(const nlohmann::json& j, const std::string& where, const ChatTemplate* chat) {
  ZT_CHECK_T(j.is_object(), ConfigError, "tokenize --sft: ", where, ": not a JSON object");
  if (sft_line_is_chat(j)) {
    ZT_CHECK_T(chat != nullptr, ConfigError, "tokenize --sft: ", where,
               ": a 'messages' line needs the tokenizer's chat template (tokenizer_config.json)");
    return {chat->segments(j["messages"], "tokenize --sft: " + where), /*eos=*/false};
  }
  for (const char* key : {"prompt", "response"}) {
    ZT_CHECK_T(j.contains(key) && j[key].is_string(), ConfigError, "tokenize --sft: ", where, ": no string field '",
               key, "' (each line needs {\"prompt\": ..., \"response\": ...} or {\"messages\": [...]})");
  }
  return {{{j["prompt"].get<std::string>(), false}, {j["response"].get<std::string>(), true}}, /*eos=*/true};
}

void append_sft_segments(const std::vector<std::vector<int32_t>>& ids, const std::vector<ChatSegment>& segments,
                         std::optional<int32_t> eos, std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  ZT_ASSERT(ids.size() == segments.size(), "append_sft_segments: ", ids.size(), " id lists for ", segments.size(),
            " segments");
  const size_t first = tokens.size();
  for (size_t k = 0; k < ids.size(); ++k) {
    for (int32_t t : ids[k]) {
      tokens.push_back(static_cast<uint32_t>(t));
      mask.push_back(segments[k].train ? kSftTarget : 0);
    }
  }
  if (eos) {
    tokens.push_back(static_cast<uint32_t>(*eos));
    mask.push_back(kSftTarget);
  }
  if (tokens.size() > first) mask[first] |= kSftExampleStart;
}

void append_sft_example(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response, int32_t eos,
                        std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  append_sft_segments({prompt, response}, {{"", false}, {"", true}}, eos, tokens, mask);
}

}  // namespace zt::data

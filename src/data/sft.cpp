#include "data/sft.h"

#include "zerotrain/error.h"

namespace zt::data {

SftText parse_sft_json(const nlohmann::json& j, const std::string& where) {
  ZT_CHECK_T(j.is_object(), ConfigError, "tokenize --sft: ", where, ": not a JSON object");
  ZT_CHECK_T(!j.contains("messages") || j.contains("prompt"), ConfigError, "tokenize --sft: ", where,
             ": 'messages' (chat templates) is not supported yet; give {\"prompt\": ..., \"response\": ...}");
  for (const char* key : {"prompt", "response"}) {
    ZT_CHECK_T(j.contains(key) && j[key].is_string(), ConfigError, "tokenize --sft: ", where, ": no string field '",
               key, "' (each line needs {\"prompt\": ..., \"response\": ...})");
  }
  return {j["prompt"].get<std::string>(), j["response"].get<std::string>()};
}

void append_sft_example(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response, int32_t eos,
                        std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  for (int32_t t : prompt) {
    tokens.push_back(static_cast<uint32_t>(t));
    mask.push_back(0);
  }
  for (int32_t t : response) {
    tokens.push_back(static_cast<uint32_t>(t));
    mask.push_back(1);
  }
  tokens.push_back(static_cast<uint32_t>(eos));
  mask.push_back(1);
}

}  // namespace zt::data

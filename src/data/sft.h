// Supervised fine-tuning examples: a prompt and a response, packed into one token stream
// with a loss mask that trains on the response only.
//
// [SFT Packing] Each example is written as  prompt ids, response ids, EOS  and the
// examples follow one another in the shard with nothing between them. The mask holds one
// byte per token: 1 where the token is a training target (the response and its EOS), 0
// where it is not (the prompt). ShardDataset cuts the stream into windows of seq+1 tokens
// as for pre-training, and a target y[i] = token[i+1] whose mask is 0 becomes -1, which
// every zerotrain loss ignores (see models/lm_head_loss.h). Windows cross example
// boundaries and attention is plain causal over the whole window: a response attends to
// the examples packed before it in the window (no per-document attention mask; the
// models have none). The EOS after each response is what tells examples apart. Prompt and
// response are encoded separately (no special tokens added), so the ids at the seam can
// differ from those of the concatenated text, as in most SFT tools.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zt::data {

struct SftText {
  std::string prompt, response;
};

// The prompt and response of one JSONL object {"prompt": ..., "response": ...}. Throws
// ConfigError naming `where` (file:line) for a missing or non-string field, and for a
// `messages` line (chat templates are not supported yet).
SftText parse_sft_json(const nlohmann::json& j, const std::string& where);

// Appends one example ([SFT Packing]): prompt, response, eos to `tokens` and 0 / 1 / 1 to
// `mask`.
void append_sft_example(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response, int32_t eos,
                        std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);

}  // namespace zt::data

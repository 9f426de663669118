// Supervised fine-tuning examples, packed into one token stream with a loss mask that
// trains on the response (or the assistant turns) only.
//
// [SFT Packing] An example is a list of text segments, each a loss target or not:
//   {"prompt": P, "response": R}   ->  P (no), R (yes), then the EOS token (yes)
//   {"messages": [...]}            ->  the chat template's render, cut by [Chat Mask]
//                                      (data/chat_template.h): the assistant turns with
//                                      their end-of-turn token (yes), the rest (no); no
//                                      EOS is appended (the template ends its turns)
// Each segment is encoded on its own (no special tokens added; special tokens written in
// the text, such as <|eot_id|>, are split out as their ids), so the ids at a seam can
// differ from those of the concatenated text, as in most SFT tools. Examples follow one
// another in the shard with nothing between them. The mask holds one value per token
// (see [SFT Mask] in data/shards.h): bit kSftTarget where the token is a training target,
// bit kSftExampleStart on the first token of each example. ShardDataset cuts the stream
// into windows of seq+1 tokens as for pre-training, and a target y[i] = token[i+1] whose
// kSftTarget bit is 0 becomes -1, which every zerotrain loss ignores (see
// models/lm_head_loss.h). Windows cross example boundaries; by default attention is plain
// causal over the whole window, and with `train --sft-attention per-example` (Llama) it
// stays within each example ([SFT Attention] in data/shards.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"

namespace zt::data {

// The mask bits of [SFT Packing].
constexpr uint8_t kSftTarget = 1;        // the token is a loss target
constexpr uint8_t kSftExampleStart = 2;  // the token is the first of its example

struct SftExample {
  std::vector<ChatSegment> segments;  // in order; `train` = loss targets
  bool eos = true;                    // append the EOS token (a target) after them
};

// Whether a JSONL object is a chat ({"messages": [...]}) rather than a prompt/response.
bool sft_line_is_chat(const nlohmann::json& j);

// One JSONL object as an example ([SFT Packing]). A prompt/response line needs both
// string fields; a `messages` line needs `chat` (the tokenizer's chat template). Throws
// ConfigError naming `where` (file:line) otherwise.
SftExample parse_sft_json(const nlohmann::json& j, const std::string& where, const ChatTemplate* chat);

// Appends one example: the ids of each segment (ids[k] for segments[k]), then `eos` when
// given, to `tokens`, and their mask values ([SFT Packing]) to `mask`.
void append_sft_segments(const std::vector<std::vector<int32_t>>& ids, const std::vector<ChatSegment>& segments,
                         std::optional<int32_t> eos, std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);
// A prompt/response example: prompt (mask 0), response and eos (kSftTarget), the first
// token also kSftExampleStart.
void append_sft_example(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response, int32_t eos,
                        std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);

}  // namespace zt::data

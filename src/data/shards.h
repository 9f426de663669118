// Token shards in llm.c's format, and a memory-mapped dataset over a glob of them.
//
// [Shard Format] A shard is a 256 x int32 little-endian header, then the tokens:
//   header[0] magic: 20240520 (uint16 tokens, header[1] version 1) or
//                    20240801 (uint32 tokens, header[1] version 7)
//   header[2] number of tokens that follow
//   header[3] zerotrain's addition: the tokenizer's vocabulary size (0 = not recorded,
//             as in llm.c's own files); the other entries are 0.
// `zerotrain tokenize` writes uint16 when every id fits (vocabulary <= 65 536), else
// uint32; documents are each preceded by the end-of-text token, as llm.c's scripts do.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerotrain/data/dataset.h"

namespace zt::data {

constexpr int32_t kShardMagicU16 = 20240520;
constexpr int32_t kShardMagicU32 = 20240801;
constexpr int64_t kShardHeaderInts = 256;

struct ShardInfo {
  std::string path;
  int64_t num_tokens = 0;
  int token_bytes = 2;     // 2 (uint16) or 4 (uint32)
  int64_t vocab_size = 0;  // header[3]; 0 when the file does not record it
};

// Writes one shard (see [Shard Format]); token_bytes 2 or 4. Throws naming the path when
// it cannot be written or an id does not fit.
void write_shard(const std::string& path, std::span<const uint32_t> tokens, int token_bytes, int64_t vocab_size);
// [SFT Mask] The loss mask of shard `path` (see [SFT Packing] in data/sft.h): the same
// path with the extension `.mask` (data_train_000000.bin -> data_train_000000.mask, so a
// `*.bin` glob does not pick it up), in the shard format with one uint16 value per token:
// bit 0 (kSftTarget) the token is a loss target, bit 1 (kSftExampleStart) it is the first
// token of an example; header[3] = kSftMaskValues (4). Masks written before the start bit
// existed hold 0 / 1 with header[3] = 2: they still give the loss mask, but no example
// boundaries. ShardDataset reads a mask when it exists.
constexpr int64_t kSftMaskValues = 4;
std::string mask_path(const std::string& shard_path);
// Reads and checks the header (magic, version, that the size matches the count).
ShardInfo read_shard_info(const std::string& path);
// Whether the file starts with a shard magic (false for a missing or short file).
bool looks_like_shard(const std::string& path);

// The files matching a glob pattern (or the one path when it has no wildcard), sorted.
// Throws ConfigError naming the pattern when nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

// A read-only memory map of a shard's tokens.
class MappedShard {
 public:
  explicit MappedShard(const std::string& path);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
  const ShardInfo& info() const { return info_; }
  uint32_t token(int64_t i) const {
    return info_.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(data_)[i]
                                  : reinterpret_cast<const uint32_t*>(data_)[i];
  }

 private:
  ShardInfo info_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* data_ = nullptr;  // first token
};

// Windows of seq+1 tokens over a list of shards: shard k gives (n_k - 1) / seq windows
// (no window crosses a file boundary), indexed in file order. Files are memory-mapped, so
// a rank reads only the pages of the windows its sampler hands it.
class ShardDataset : public Dataset {
 public:
  // `model_vocab` > 0: every window is checked to hold ids below it (a mismatch between
  // the tokenizer and the model is an error naming the file and the id, not an
  // out-of-range embedding lookup).
  ShardDataset(const std::vector<std::string>& files, int64_t seq, int64_t model_vocab = 0);

  int64_t size() const override { return offsets_.back(); }
  // x, y: (seq) int64; y[i] = -1 (ignored by the losses) where the shard has a mask
  // ([SFT Mask]) and token i+1 is not a loss target. With example positions on, also
  // pos: (seq) int64, the position of x[i] within its example (0 on each example's first
  // token, and on the window's first token, whose example may have begun before).
  Example get(int64_t index) const override;
  // Whether every shard has a mask with example starts ([SFT Mask], kSftMaskValues).
  bool has_example_starts() const;
  // Turns Example::pos on (per-example attention, [SFT Attention] in models/llama.h).
  // ConfigError when !has_example_starts().
  void set_example_positions(bool on);
  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<std::unique_ptr<MappedShard>>& shards() const { return shards_; }
  // The vocabulary the shards declare (header[3], equal across files), or 0 when none does.
  int64_t declared_vocab() const { return declared_vocab_; }
  // The largest token id in all shards (reads every page: for checks on small data).
  int64_t max_token_id() const;
  // How many of the shards have a loss mask ([SFT Mask]).
  int64_t masked_shards() const;

 private:
  int64_t seq_, model_vocab_, num_tokens_ = 0, declared_vocab_ = 0;
  bool example_positions_ = false;
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::vector<std::unique_ptr<MappedShard>> masks_;  // per shard; null when it has none
  std::vector<int64_t> offsets_;  // offsets_[k] = windows in shards before k; back() = total
};

}  // namespace zt::data

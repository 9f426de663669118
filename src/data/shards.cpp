#include "data/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/sft.h"
#include "zerotrain/error.h"

namespace zt::data {

void write_shard(const std::string& path, std::span<const uint32_t> tokens, int token_bytes, int64_t vocab_size) {
  ZT_CHECK(token_bytes == 2 || token_bytes == 4, "write_shard: token_bytes must be 2 or 4, got ", token_bytes);
  std::vector<int32_t> header(kShardHeaderInts, 0);
  header[0] = token_bytes == 2 ? kShardMagicU16 : kShardMagicU32;
  header[1] = token_bytes == 2 ? 1 : 7;
  ZT_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_shard: ", tokens.size(),
           " tokens do not fit one shard's int32 count (use smaller shards)");
  header[2] = static_cast<int32_t>(tokens.size());
  header[3] = static_cast<int32_t>(vocab_size);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    ZT_CHECK(f.good(), "write_shard: cannot write '", tmp, "'");
    f.write(reinterpret_cast<const char*>(header.data()), kShardHeaderInts * 4);
    if (token_bytes == 4) {
      f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
    } else {
      std::vector<uint16_t> narrow(tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) {
        ZT_CHECK(tokens[i] <= 0xFFFF, "write_shard: token ", tokens[i], " at ", i, " does not fit uint16 ('", path,
                 "')");
        narrow[i] = static_cast<uint16_t>(tokens[i]);
      }
      f.write(reinterpret_cast<const char*>(narrow.data()), static_cast<std::streamsize>(narrow.size() * 2));
    }
    ZT_CHECK(f.good(), "write_shard: writing '", tmp, "' failed (disk full?)");
  }
  // Visible under its name only when complete.
  ZT_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "write_shard: cannot rename '", tmp, "' to '", path, "': ",
           std::strerror(errno));
}

ShardInfo read_shard_info(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ZT_CHECK_T(f.good(), ConfigError, "shard '", path, "': cannot open");
  int32_t h[kShardHeaderInts];
  f.read(reinterpret_cast<char*>(h), sizeof(h));
  ZT_CHECK_T(f.gcount() == static_cast<std::streamsize>(sizeof(h)), ConfigError, "shard '", path,
             "': shorter than the 1024-byte header (not a token shard)");
  ShardInfo info;
  info.path = path;
  if (h[0] == kShardMagicU16) {
    ZT_CHECK_T(h[1] == 1, ConfigError, "shard '", path, "': magic ", h[0], " with version ", h[1], " (expected 1)");
    info.token_bytes = 2;
  } else if (h[0] == kShardMagicU32) {
    ZT_CHECK_T(h[1] == 7, ConfigError, "shard '", path, "': magic ", h[0], " with version ", h[1], " (expected 7)");
    info.token_bytes = 4;
  } else {
    throw ConfigError(detail::cat("shard '", path, "': magic ", h[0], " is not a token shard's (", kShardMagicU16,
                                  " uint16 or ", kShardMagicU32, " uint32; write shards with zerotrain tokenize)"));
  }
  info.num_tokens = h[2];
  info.vocab_size = h[3];
  struct stat st {};
  ZT_CHECK_T(::stat(path.c_str(), &st) == 0, ConfigError, "shard '", path, "': ", std::strerror(errno));
  const int64_t want = kShardHeaderInts * 4 + info.num_tokens * info.token_bytes;
  ZT_CHECK_T(info.num_tokens >= 0 && st.st_size == want, ConfigError, "shard '", path, "': ", st.st_size,
             " bytes, but its header says ", info.num_tokens, " tokens of ", info.token_bytes, " bytes (", want,
             " bytes with the header): truncated or not a shard");
  return info;
}

std::string mask_path(const std::string& shard_path) {
  return std::filesystem::path(shard_path).replace_extension(".mask").string();
}

bool looks_like_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  int32_t magic = 0;
  if (!f.read(reinterpret_cast<char*>(&magic), 4)) return false;
  return magic == kShardMagicU16 || magic == kShardMagicU32;
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  ZT_CHECK_T(!out.empty(), ConfigError, "no file matches '", pattern, "'");
  std::sort(out.begin(), out.end());
  return out;
}

MappedShard::MappedShard(const std::string& path) : info_(read_shard_info(path)) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZT_CHECK_T(fd >= 0, ConfigError, "shard '", path, "': cannot open: ", std::strerror(errno));
  map_bytes_ = static_cast<size_t>(kShardHeaderInts * 4 + info_.num_tokens * info_.token_bytes);
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  ZT_CHECK_T(map_ != MAP_FAILED, ConfigError, "shard '", path, "': mmap failed: ", std::strerror(err));
  data_ = static_cast<const uint8_t*>(map_) + kShardHeaderInts * 4;
}

MappedShard::~MappedShard() {
  if (map_ && map_ != MAP_FAILED) ::munmap(map_, map_bytes_);
}

ShardDataset::ShardDataset(const std::vector<std::string>& files, int64_t seq, int64_t model_vocab)
    : seq_(seq), model_vocab_(model_vocab) {
  ZT_CHECK_T(seq > 0, ConfigError, "ShardDataset: seq must be positive, got ", seq);
  ZT_CHECK_T(!files.empty(), ConfigError, "ShardDataset: no files");
  offsets_.push_back(0);
  for (const auto& f : files) {
    shards_.push_back(std::make_unique<MappedShard>(f));
    const ShardInfo& info = shards_.back()->info();
    num_tokens_ += info.num_tokens;
    const std::string mp = mask_path(f);
    if (std::filesystem::exists(mp)) {
      masks_.push_back(std::make_unique<MappedShard>(mp));
      ZT_CHECK_T(masks_.back()->info().num_tokens == info.num_tokens, ConfigError, "loss mask '", mp, "' has ",
                 masks_.back()->info().num_tokens, " entries but its shard '", f, "' has ", info.num_tokens,
                 " tokens (rewrite both with zerotrain tokenize --sft)");
    } else {
      masks_.push_back(nullptr);
    }
    const int64_t windows = info.num_tokens > seq ? (info.num_tokens - 1) / seq : 0;
    offsets_.push_back(offsets_.back() + windows);
    if (info.vocab_size > 0) {
      ZT_CHECK_T(declared_vocab_ == 0 || declared_vocab_ == info.vocab_size, ConfigError, "shard '", f,
                 "' was written for a vocabulary of ", info.vocab_size, " tokens but an earlier one for ",
                 declared_vocab_, " (shards of different tokenizers in one glob)");
      declared_vocab_ = info.vocab_size;
    }
  }
  ZT_CHECK_T(size() > 0, ConfigError, "ShardDataset: the ", files.size(), " shard(s) starting with '", files[0],
             "' hold ", num_tokens_, " tokens, no file has the seq+1 = ", seq + 1,
             " a window needs (use a shorter --seq or more data)");
}

Example ShardDataset::get(int64_t index) const {
  ZT_CHECK(index >= 0 && index < size(), "ShardDataset: index ", index, " out of range [0, ", size(), ")");
  const auto k = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin() - 1);
  const MappedShard& s = *shards_[k];
  const int64_t first = (index - offsets_[k]) * seq_;
  auto w = torch::empty({seq_ + 1}, torch::kLong);  // (seq+1)
  int64_t* p = w.data_ptr<int64_t>();
  const MappedShard* mask = masks_[k].get();
  for (int64_t i = 0; i <= seq_; ++i) {
    const uint32_t t = s.token(first + i);
    ZT_CHECK_T(model_vocab_ <= 0 || static_cast<int64_t>(t) < model_vocab_, ConfigError, "shard '", s.info().path,
               "': token ", t, " at position ", first + i, " is outside the model's vocabulary of ", model_vocab_,
               " (the data was tokenized with another tokenizer than the model's)");
    p[i] = t;
  }
  if (!mask) return {w.narrow(0, 0, seq_), w.narrow(0, 1, seq_)};
  auto y = w.narrow(0, 1, seq_).clone();  // (seq)
  int64_t* q = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < seq_; ++i) {
    if ((mask->token(first + i + 1) & kSftTarget) == 0) q[i] = -1;  // a prompt token: not a target
  }
  if (!example_positions_) return {w.narrow(0, 0, seq_), y};
  auto pos = torch::empty({seq_}, torch::kLong);  // (seq)
  int64_t* r = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < seq_; ++i) {
    r[i] = i == 0 || (mask->token(first + i) & kSftExampleStart) ? 0 : r[i - 1] + 1;
  }
  return {w.narrow(0, 0, seq_), y, pos};
}

bool ShardDataset::has_example_starts() const {
  for (const auto& m : masks_)
    if (!m || m->info().vocab_size != kSftMaskValues) return false;
  return true;
}

void ShardDataset::set_example_positions(bool on) {
  for (size_t k = 0; on && k < masks_.size(); ++k) {
    ZT_CHECK_T(masks_[k] && masks_[k]->info().vocab_size == kSftMaskValues, ConfigError, "shard '",
               shards_[k]->info().path, "' ",
               masks_[k] ? "has a loss mask without example starts (written by an older zerotrain tokenize --sft)"
                         : "has no loss mask (.mask): it is not SFT data",
               "; per-example attention needs the example boundaries: tokenize the data again with zerotrain "
               "tokenize --sft");
  }
  example_positions_ = on;
}

int64_t ShardDataset::max_token_id() const {
  int64_t m = -1;
  for (const auto& s : shards_) {
    for (int64_t i = 0; i < s->info().num_tokens; ++i) m = std::max<int64_t>(m, s->token(i));
  }
  return m;
}

int64_t ShardDataset::masked_shards() const {
  int64_t n = 0;
  for (const auto& m : masks_) n += m != nullptr;
  return n;
}

}  // namespace zt::data

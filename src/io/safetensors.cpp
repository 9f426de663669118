#include "io/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "zerotrain/error.h"

namespace zt::io {
namespace {

// A header bigger than this is corruption, not a model (the Rust reader uses 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
const DtypeName kDtypes[] = {
    {"BOOL", at::kBool},       {"U8", at::kByte},        {"I8", at::kChar},
    {"I16", at::kShort},       {"U16", at::kUInt16},     {"I32", at::kInt},
    {"U32", at::kUInt32},      {"I64", at::kLong},       {"U64", at::kUInt64},
    {"F16", at::kHalf},        {"BF16", at::kBFloat16},  {"F32", at::kFloat},
    {"F64", at::kDouble},      {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2},
};

uint64_t read_u64_le(const unsigned char* b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw zt::Error(zt::detail::cat("safetensors: dtype ", t, " has no safetensors name"));
}

at::ScalarType safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw zt::Error(zt::detail::cat("safetensors: unknown dtype '", name, "'"));
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path_, ec);
  ZT_CHECK(!ec, "safetensors: cannot open '", path_, "': ", ec.message());
  ZT_CHECK(file_size >= 8, "safetensors: '", path_, "' is ", file_size,
           " bytes, too short for the 8-byte header length (truncated or not a safetensors file)");
  std::ifstream in(path_, std::ios::binary);
  ZT_CHECK(in.good(), "safetensors: cannot open '", path_, "'");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  const uint64_t header_len = read_u64_le(len_bytes);
  ZT_CHECK(header_len <= kMaxHeaderBytes && header_len <= file_size - 8, "safetensors: '", path_,
           "' declares a ", header_len, "-byte header but the file has ", file_size - 8,
           " bytes after the length (truncated or not a safetensors file)");
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  ZT_CHECK(in.good(), "safetensors: '", path_, "': failed reading the header");
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size - data_start_;

  // A tensor name written twice would silently keep the last entry: an error instead.
  int depth = 0;
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& v) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) ++depth;
    else if (event == E::object_end) --depth;
    else if (event == E::key && depth == 1 && !seen.insert(v.get<std::string>()).second && duplicate.empty())
      duplicate = v.get<std::string>();
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, on_event);
  } catch (const std::exception& e) {
    throw zt::Error(zt::detail::cat("safetensors: '", path_, "' has a corrupt JSON header: ", e.what()));
  }
  ZT_CHECK(duplicate.empty(), "safetensors: '", path_, "': tensor '", duplicate,
           "' appears twice in the header (corrupt or hand-edited file): keep one entry");
  ZT_CHECK(j.is_object(), "safetensors: '", path_, "': header is not a JSON object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == kMetadataKey) {
      ZT_CHECK(v.is_object(), "safetensors: '", path_, "': __metadata__ must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        ZT_CHECK(m.value().is_string(), "safetensors: '", path_, "': __metadata__['", m.key(),
                 "'] must be a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& why) {
      return zt::Error(zt::detail::cat("safetensors: '", path_, "': tensor '", name, "': ", why));
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") ||
        !v["dtype"].is_string() || !v["shape"].is_array() || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      throw bad("entry needs dtype (string), shape (array) and data_offsets ([begin, end])");
    SafetensorsEntry e;
    try {
      e.dtype = safetensors_dtype(v["dtype"].get<std::string>());
    } catch (const zt::Error&) {
      throw bad("unknown dtype '" + v["dtype"].get<std::string>() + "'");
    }
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
      e.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    if (!v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
      throw bad("data_offsets must be non-negative integers");
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.begin > e.end) throw bad("data_offsets begin > end");
    if (e.end > data_size)
      throw bad(zt::detail::cat("data ends at byte ", e.end, " but the file's data section has only ", data_size,
                                " bytes (truncated file)"));
    const uint64_t expect = numel * c10::elementSize(e.dtype);
    if (e.end - e.begin != expect)
      throw bad(zt::detail::cat("holds ", e.end - e.begin, " bytes but dtype ", v["dtype"].get<std::string>(),
                                " and shape ", v["shape"].dump(), " need ", expect));
    entries_.emplace(name, std::move(e));
  }
  // Overlapping tensors mean a corrupt header (the format forbids them).
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [n, e] : entries_)
    if (e.end > e.begin) spans.emplace_back(e.begin, e.end);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    ZT_CHECK(spans[i].first >= spans[i - 1].second, "safetensors: '", path_,
             "': tensors overlap in the data section (corrupt header)");
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [n, e] : entries_) out.push_back(n);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  ZT_CHECK(it != entries_.end(), "safetensors: '", path_, "' has no tensor '", name, "'");
  return it->second;
}

torch::Tensor SafetensorsFile::read(const std::string& name) const {
  const auto& e = entry(name);
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  const uint64_t n = e.end - e.begin;
  if (n == 0) return t;
  std::ifstream in(path_, std::ios::binary);
  ZT_CHECK(in.good(), "safetensors: cannot open '", path_, "'");
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(n));
  ZT_CHECK(in.good() && static_cast<uint64_t>(in.gcount()) == n, "safetensors: '", path_, "': short read of tensor '",
           name, "' (file changed or truncated while reading)");
  return t;
}

torch::Tensor SafetensorsFile::read_narrow(const std::string& name, int64_t dim, int64_t start, int64_t length) const {
  const auto& e = entry(name);
  const int64_t ndim = static_cast<int64_t>(e.shape.size());
  ZT_CHECK(dim >= 0 && dim < ndim && start >= 0 && length >= 0 && start + length <= e.shape[static_cast<size_t>(dim)],
           "safetensors: '", path_, "': narrow(", dim, ", ", start, ", ", length, ") is outside tensor '", name,
           "' of ", ndim, " dimension(s)");
  auto shape = e.shape;
  shape[static_cast<size_t>(dim)] = length;
  auto t = torch::empty(shape, torch::TensorOptions().dtype(e.dtype));
  if (t.numel() == 0) return t;
  int64_t outer = 1, inner = static_cast<int64_t>(c10::elementSize(e.dtype));
  for (int64_t d = 0; d < dim; ++d) outer *= e.shape[static_cast<size_t>(d)];
  for (int64_t d = dim + 1; d < ndim; ++d) inner *= e.shape[static_cast<size_t>(d)];
  const int64_t full = e.shape[static_cast<size_t>(dim)];
  const auto chunk = static_cast<std::streamsize>(length * inner);  // bytes per outer index
  std::ifstream in(path_, std::ios::binary);
  ZT_CHECK(in.good(), "safetensors: cannot open '", path_, "'");
  auto* out = static_cast<char*>(t.data_ptr());
  for (int64_t o = 0; o < outer; ++o) {
    in.seekg(static_cast<std::streamoff>(data_start_ + e.begin + static_cast<uint64_t>((o * full + start) * inner)));
    in.read(out + o * chunk, chunk);
    ZT_CHECK(in.good() && in.gcount() == chunk, "safetensors: '", path_, "': short read of tensor '", name,
             "' (file changed or truncated while reading)");
  }
  return t;
}

std::map<std::string, torch::Tensor> load_safetensors(const std::string& path) {
  SafetensorsFile f(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& n : f.names()) out.emplace(n, f.read(n));
  return out;
}

void save_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Largest elements first, then by name (the Rust writer's order): with an 8-byte-aligned
  // data start this keeps every tensor aligned to its element size.
  std::vector<std::pair<std::string, torch::Tensor>> order;
  for (const auto& [n, t] : tensors) {
    ZT_CHECK(n != kMetadataKey, "safetensors: '", path, "': a tensor may not be named ", kMetadataKey);
    ZT_CHECK(t.defined(), "safetensors: '", path, "': tensor '", n, "' is undefined");
    order.emplace_back(n, t.detach().to(torch::kCPU).contiguous());
  }
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second.element_size() > b.second.element_size();
  });

  nlohmann::ordered_json header;
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [n, t] : order) {
    const uint64_t bytes = t.nbytes();
    header[n] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                 {"shape", t.sizes().vec()},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((static_cast<uint64_t>(h.size()) >> (8 * i)) & 0xff);

  const std::string tmp = path + ".tmp";
  {
    FilePtr f(std::fopen(tmp.c_str(), "wb"));
    ZT_CHECK(f, "safetensors: cannot create '", tmp, "'");
    bool ok = std::fwrite(len, 1, 8, f.get()) == 8 && std::fwrite(h.data(), 1, h.size(), f.get()) == h.size();
    for (const auto& [n, t] : order) {
      if (!ok) break;
      const size_t bytes = t.nbytes();
      ok = bytes == 0 || std::fwrite(t.const_data_ptr(), 1, bytes, f.get()) == bytes;
    }
    ok = ok && std::fflush(f.get()) == 0 && ::fsync(fileno(f.get())) == 0;
    if (!ok) {
      f.reset();
      std::remove(tmp.c_str());
      throw zt::Error(zt::detail::cat("safetensors: failed writing '", tmp, "' (disk full?)"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ZT_CHECK(!ec, "safetensors: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace zt::io

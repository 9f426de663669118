// Safetensors reader/writer (https://github.com/huggingface/safetensors format):
//   [u64 little-endian N][N bytes of JSON header][data]
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the start of data) plus an optional "__metadata__" string map.
// Every error names the file and, where there is one, the tensor.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace zt::io {

struct SafetensorsEntry {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
};

// An open file whose header has been parsed and validated (dtypes known, offsets in
// bounds and consistent with shapes, file not truncated). Tensors are read on demand,
// so loading one tensor of a 6 GB checkpoint reads only its bytes.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A new contiguous CPU tensor with the stored dtype and shape.
  torch::Tensor read(const std::string& name) const;
  // read(name).narrow(dim, start, length) as a new contiguous tensor, reading only those
  // bytes: one read along dim 0, else one per index of the dimensions before `dim` (a
  // tensor-parallel rank's rows or columns of a matrix, models/hf_tp.h).
  torch::Tensor read_narrow(const std::string& name, int64_t dim, int64_t start, int64_t length) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads every tensor of a file.
std::map<std::string, torch::Tensor> load_safetensors(const std::string& path);

// Writes tensors (any device; copied to CPU contiguous) with their own dtypes. The write
// goes to `path`.tmp and is renamed into place, so a crash never leaves a partial file.
void save_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Safetensors dtype names ("F32", "BF16", "I64", ...) <-> torch.
std::string safetensors_dtype_name(at::ScalarType t);
at::ScalarType safetensors_dtype(const std::string& name);

}  // namespace zt::io

// Hugging Face checkpoint directories, tensor by tensor, in both directions.
//
// A checkpoint is DIR/model.safetensors, or shards DIR/model-0000K-of-0000N.safetensors
// listed by DIR/model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {tensor name: shard file}}), as transformers' save_pretrained writes them.
// Neither direction ever holds more than one tensor (reading) or one shard (writing) of
// the model in memory.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace zt::models {

using io::SafetensorsEntry;
using io::SafetensorsFile;
using io::load_safetensors;
using io::save_safetensors;
using io::safetensors_dtype_name;
using io::safetensors_dtype;

// transformers' default max_shard_size ("5GB").
constexpr int64_t kHfMaxShardBytes = 5'000'000'000;

class HfCheckpointReader {
 public:
  // dir_or_file: a .safetensors file, or a directory holding model.safetensors or
  // model.safetensors.index.json. Parses every shard's header (not the data); errors
  // name the file: a missing shard, a tensor the index puts in a shard that lacks it, or
  // a tensor stored twice.
  explicit HfCheckpointReader(const std::string& dir_or_file);

  const std::string& where() const { return where_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;
  // A new contiguous CPU tensor with the stored dtype and shape (reads only its bytes).
  torch::Tensor read(const std::string& name) const;
  // read(name).narrow(dim, start, length), reading only those bytes (SafetensorsFile::read_narrow).
  torch::Tensor read_narrow(const std::string& name, int64_t dim, int64_t start, int64_t length) const;

 private:
  std::string where_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_;  // tensor -> index into files_
};

struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Writes the tensors `specs` in `dtype` to DIR: one model.safetensors when they fit in
// max_shard_bytes, else shards model-0000K-of-0000N.safetensors (a new shard starts when
// the next tensor would pass max_shard_bytes; a larger tensor gets a shard of its own)
// and model.safetensors.index.json. produce(name) returns the tensor (any device/dtype;
// converted), called once per tensor, shard by shard: only one shard is held at a time.
// Earlier model*.safetensors files and index in DIR are removed first (a stale
// model.safetensors would shadow a new index). Metadata format=pt, which transformers
// requires. Returns the files written (shards, then the index when there is one).
std::vector<std::string> save_hf_checkpoint(const std::string& dir, const std::vector<HfTensorSpec>& specs,
                                            at::ScalarType dtype, int64_t max_shard_bytes,
                                            const std::function<torch::Tensor(const std::string&)>& produce);

// "float32" / "bfloat16" / "float16" (config.json's torch_dtype); ConfigError otherwise.
const char* hf_torch_dtype_name(at::ScalarType t);

}  // namespace zt::models

// The full (unsplit) shape of each GPT-2 parameter by its Hugging Face name, shared by
// GPT2 (partitioned construction) and GPT2TP (building tensor-parallel slices from it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "models/gpt2.h"

namespace zt::models {

// InternalError for a name GPT-2 does not have.
std::vector<int64_t> gpt2_param_shape(const GPT2Config& cfg, const std::string& name);

}  // namespace zt::models

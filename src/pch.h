// Precompiled header for every zerotrain target: the heavy, stable includes only.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <memory>
#include <functional>

// Peak dense bf16 tensor-core throughput by device name, the denominator of MFU.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace zt::monitor {

struct DevicePeak {
  std::string model;   // the table's row, e.g. "H100 SXM"
  double tflops = 0;   // dense bf16 (fp16 where the same), per device
};

// The row of the table that a CUDA device name (cudaDeviceProp::name, e.g. "NVIDIA H100
// 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA H100 PCIe", "NVIDIA L40S") belongs to;
// nullopt for a device the table does not know (then MFU is left out). The figures are
// NVIDIA's datasheet numbers without sparsity; docs/monitoring.md lists the table.
std::optional<DevicePeak> dense_bf16_peak(std::string_view device_name);

}  // namespace zt::monitor

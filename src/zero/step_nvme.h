// NvmeStep: the ZeRO-Infinity step backend (step_backend.h), offload_optimizer.device
// "nvme". The CPU Adam of CpuAdamStep, whose gradient streaming and copy streams it
// shares, over fp32 master and Adam state kept in one swap file per rank instead of host
// memory, swapped per sub-group through buffer_count staging buffers ([NVMe Pipeline] in
// src/offload/nvme_state.h; the flow is in the note at the top of step_nvme.cpp). No
// delayed update (the config refuses it with NVMe).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "zero/step_cpu_adam.h"

namespace zt::zero {

struct NvmeOffload;  // step_nvme.cpp

class NvmeStep final : public CpuAdamStep {
 public:
  // Before any state exists, on every rank: the swap file's directory and its room
  // (ConfigError naming offload_optimizer.nvme_path on every rank).
  static void check_path(const ZeroOptions& opt, const comm::GroupPtr& group, int64_t owned);
  // Creates the swap file and writes the initial state (master from ctx.param_src or the
  // parameter file, m = v = 0) into it.
  explicit NvmeStep(StepContext ctx);
  ~NvmeStep() override;

  const char* name() const override { return "nvme"; }
  bool update(double factor, const StepInputs& in) override;
  bool flush() override { return false; }
  // Host copies of the owned state read back from the swap file.
  std::vector<torch::Tensor> state_buffers(bool master_only) override;
  bool import_state(const LayoutStateFetch& fetch) override;
  void finish_import() override;
  void add_state_bytes(ModelStateBytes& m) const override;
  std::string swap_file() const override;
  StepReport::Nvme swap_stats() const override { return step_; }

 private:
  std::shared_ptr<NvmeOffload> nvme_;  // the swap file, staging buffers, upload events
  StepReport::Nvme step_;              // the last step's swap
};

}  // namespace zt::zero

// offload_param.device "nvme" (stage 3, [NVMe Params] in src/offload/nvme_state.h): the
// compute-dtype shard of this rank's parameters lives in a swap file under
// offload_param.nvme_path, read per unit into param_buffer_count staging slots as units are
// gathered and written by the step backend (CpuAdamStep / NvmeStep, through
// StepContext::param_file_write). The optimizer state's swap file is NvmeStep's
// (step_nvme.cpp).
#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "log/log.h"
#include "offload/nvme_state.h"
#include "zero/agree.h"
#include "zero/swap_events.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"
#include "zerotrain/error.h"

namespace zt::zero {

struct NvmeParams : SwapWithEvents<offload::NvmeParamFile> {};

namespace {
constexpr const char* kParamNvmePathKey = "zero_optimization.offload_param.nvme_path";
}  // namespace

void ZeroOptimizer::param_nvme_state_bytes(ModelStateBytes& m) const {
  // The compute-dtype shard is a model state like any other, kept on the drive.
  m.params += L_.flat.shard_numel * static_cast<int64_t>(c10::elementSize(opt_.dtype));
  m.nvme += param_nvme_->state->file_bytes();
  m.host += param_nvme_->state->staging_bytes();
}

void ZeroOptimizer::init_param_nvme(int64_t max_unit_shard) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  const int64_t bytes = std::max<int64_t>(1, L_.flat.shard_numel) * esize;
  ZT_CHECK_T(max_unit_shard <= opt_.param_buffer_size, ConfigError, "zero_optimization.offload_param.buffer_size = ",
             opt_.param_buffer_size, " elements, but the largest unit's shard on this rank has ", max_unit_shard,
             ": raise buffer_size to at least ", max_unit_shard, " (each staging buffer holds one unit's shard)");
  // max_in_cpu bounds the parameters kept resident in host memory besides the swap
  // buffers (DeepSpeed's cache); zerotrain keeps none, so any value holds.
  const int local = std::max(1, comm::discover_rank().local_world_size);
  agree<ConfigError>(group_, [&] { offload::check_nvme_path(kParamNvmePathKey, opt_.param_nvme_path, bytes * local); });
  const int world_rank = comm::discover_rank().rank;
  offload::NvmeStateOptions so;
  so.dir = opt_.param_nvme_path;
  so.stem = "zerotrain_rank" + std::to_string(world_rank) + "_params";
  so.buffer_count = opt_.param_buffer_count;
  so.pin = opt_.pin_memory && opt_.device.is_cuda();
  so.aio = opt_.aio;
  auto sink = std::make_shared<SwapLogSink>();
  sink->rank = world_rank;
  sink->hold = false;
  so.log = [sink, this](const std::string& line) {
    if (rank_ == 0) sink->print(line, log::Level::kInfo);
  };
  param_nvme_ = make_swap<NvmeParams>(group_, opt_.device, [&] {
    return std::make_unique<offload::NvmeParamFile>(bytes, max_unit_shard * esize, so);
  });
  if (rank_ == 0) {
    const auto& f = *param_nvme_->state;
    log::info("offload_param nvme: %s of %s parameters per rank in swap file '%s' (engine %s, %s), "
              "%d staging buffers of %s in %s host memory",
                 bytes_text(bytes).c_str(), c10::toString(opt_.dtype), f.path().c_str(), f.file().engine().c_str(),
                 f.file().direct() ? "O_DIRECT" : "buffered, no O_DIRECT", f.num_buffers(),
                 bytes_text(max_unit_shard * esize).c_str(), f.pinned() ? "page-locked" : "pageable");
  }
}

std::pair<torch::Tensor, int> ZeroOptimizer::param_nvme_read(int64_t begin, int64_t numel) {
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  const auto v = param_nvme_->state->read(begin * esize, numel * esize);
  return {torch::from_blob(const_cast<void*>(v.data), {numel}, torch::TensorOptions().dtype(opt_.dtype)), v.slot};
}

void ZeroOptimizer::param_nvme_uploaded(int slot) {
#ifdef ZT_WITH_CUDA
  if (opt_.device.is_cuda()) param_nvme_->uploaded[static_cast<size_t>(slot)].record(
      c10::cuda::getCurrentCUDAStream(opt_.device.index()));
#else
  (void)slot;
#endif
}

void ZeroOptimizer::param_nvme_write(int64_t begin, const torch::Tensor& src) {
  ZT_ASSERT(src.device().is_cpu() && src.is_contiguous() && src.scalar_type() == opt_.dtype, "parameter write source");
  const int64_t esize = static_cast<int64_t>(c10::elementSize(opt_.dtype));
  param_nvme_->state->write(begin * esize, src.data_ptr(), src.numel() * esize);
}

}  // namespace zt::zero

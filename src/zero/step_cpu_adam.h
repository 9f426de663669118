// CpuAdamStep: the ZeRO-Offload step backend (step_backend.h). The fp32 master and Adam
// state of the owned elements live in host memory (OwnedState's buffers, allocated by the
// owner); the gradients stream to the host during backward, the SIMD CPU Adam
// (src/optim/cpu_adam.h) updates one sub-group at a time and the compute-dtype copies go
// back to the device on an upload stream. It owns the delayed parameter update
// (offload_optimizer.delayed_param_update): the CPU step of step t runs on a worker thread
// during step t+1's forward/backward and is put in place at step t+1's update.
// Data flow, threads and streams: the note at the top of step_cpu_adam.cpp.
#pragma once
#include <torch/torch.h>

#include <exception>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "zero/step_backend.h"
#include "zero/zero_options.h"

namespace zt::zero {

class CpuAdamStep : public StepBackend {
 public:
  // The host buffers, copy streams and OpenMP threads; logs the state's place on rank 0
  // (not with NVMe, whose backend says where its state is).
  explicit CpuAdamStep(StepContext ctx);
  ~CpuAdamStep() override;  // joins a delayed step still running

  const char* name() const override { return "cpu_adam"; }
  void grad_issued(int b, const comm::WorkPtr& reduce) override;
  bool update(double factor, const StepInputs& in) override;
  bool flush() override;
  void drop_in_flight() override;
  void finish_import() override;
  void add_state_bytes(ModelStateBytes& m) const override;

  // Bytes of host memory the offload set-up allocates on this rank (the fp32 master and
  // Adam state, the gradient buffers, the upload buffer, the stage-3 host parameter shard;
  // not the NVMe staging buffers), before any of it exists. Equals state_bytes().host with
  // CPU offload. 0 without offload_optimizer.
  static int64_t host_bytes_planned(const ZeroOptions& opt, const ShardLayout& L);
  // A zero-filled host buffer: page-locked at its exact size with pin_memory on CUDA
  // (offload/host_memory.h). The dtype defaults to the compute dtype.
  static torch::Tensor host_buffer(const ZeroOptions& opt, int64_t numel,
                                   std::optional<at::ScalarType> dtype = std::nullopt);

 protected:
  // Gradients on the host: what backward did not stream yet is copied now; then the host
  // waits for the copy stream.
  void grads_to_host();

  StepContext ctx_;
  torch::Tensor host_grad_;              // (owned) compute dtype, host: gradients for the CPU step
  torch::Tensor host_param_;             // (owned) compute dtype, host: the CPU step's output
  std::vector<bool> streamed_;           // per bucket: gradient already copied to host in backward
  std::shared_ptr<void> streams_;        // CUDA copy streams (offload_streams.h)

 private:
  // Elements of host_param_ when it is a buffer of its own: the whole owned part, or one
  // bucket's scratch with offload_param nvme; 0 when the CPU step writes the host-resident
  // shard (offload_param cpu) or the NVMe staging buffers instead.
  static int64_t upload_buffer_numel(const ZeroOptions& opt, const ShardLayout& L);
  // Where the CPU step sends each updated compute-dtype shard: nowhere, into the
  // parameters (param_dst), or into delayed_stage_ (the delayed update's worker).
  enum class Upload { kNone, kParams, kDelayedStage };
  void cpu_update(const torch::Tensor& grads, double factor, const StepInputs& in, Upload upload);
  void upload_bucket(int b, Upload to);  // bucket b's updated compute-dtype shard
  void upload_all();                     // every bucket's, into the parameters
  void apply_delayed_update();           // joins the worker and puts its update in place

  torch::Tensor host_grad_spare_;        // delayed update: backward fills one while the CPU reads the other
  torch::Tensor delayed_stage_;          // delayed update (CUDA): the worker's uploads, (owned) compute dtype
  std::thread worker_;                   // delayed update: the CPU step of the previous step
  std::exception_ptr worker_error_;
};

}  // namespace zt::zero

// StepReport's JSON form (one line of the metrics file; docs/engine.md).
#include "zerotrain/report.h"

namespace zt {

nlohmann::json StepReport::to_json() const {
  auto phase = [](const PhaseStats& p) { return nlohmann::json{{"after", p.mem_after}, {"peak", p.mem_peak}}; };
  nlohmann::json j = {{"step", step},
          {"micro_steps", micro_steps},
          {"samples", samples},
          {"loss", loss},
          {"lr", lr},
          {"loss_scale", loss_scale},
          {"skipped", skipped},
          {"grad_norm", grad_norm},
          {"phase_ms", {{"forward", forward.ms}, {"backward", backward.ms}, {"step", step_phase.ms}}},
          {"phase_mem", {{"forward", phase(forward)}, {"backward", phase(backward)}, {"step", phase(step_phase)}}},
          {"model_state_bytes",
           {{"params", model_state.params},
            {"grads", model_state.grads},
            {"master", model_state.master},
            {"optimizer", model_state.optimizer},
            {"host", model_state.host},
            {"nvme", model_state.nvme}}},
          {"comm", {{"buckets", buckets},
                    {"buckets_before_backward_end", buckets_before_backward_end},
                    {"exposed_ms", exposed_comm_ms}}},
          {"zero3", {{"gathers", gathers}, {"prefetched", gathers_prefetched},
                     {"gathered_peak_bytes", gathered_peak_bytes}, {"frozen_gathered_peak_bytes", frozen_gathered_peak_bytes}, {"gathered_bytes", model_state.gathered}}},
          {"nvme", {{"read_wait_ms", nvme.read_wait_ms}, {"write_wait_ms", nvme.write_wait_ms},
                    {"visit_ms", nvme.visit_ms}, {"bytes_read", nvme.bytes_read},
                    {"bytes_written", nvme.bytes_written}}}};
  for (const auto& [k, v] : extra.items()) j[k] = v;
  return j;
}

}  // namespace zt

// `zerotrain bench` (the sweep): what each ZeRO configuration costs in memory and time,
// measured in fresh processes, next to PyTorch's anchors. src/cli/bench_sweep.cpp runs
// it; sweep_report.cpp reads run logs and turns the rows into the Markdown table and the
// PNG charts.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace zt::bench {

// One configuration of the sweep.
struct SweepConfig {
  const char* name;    // short label, used in file names and charts
  int stage;
  const char* dtype;   // "bf16" | "fp16"
  bool offload_optimizer;
  bool offload_param;
  const char* anchor;  // the PyTorch mode it is compared with (bench/anchors/train_anchor.py)
  bool delayed_update = false;  // offload_optimizer.delayed_param_update
};

// The DeepSpeed anchor run a configuration is compared with: "deepspeed-z<stage>" plus
// "-offopt" (offload_optimizer cpu) or "-offall" (+ offload_param cpu); "" for the fp16
// rows (the anchors train in bf16). The delayed update has no DeepSpeed counterpart: its
// row is compared with DeepSpeed's plain optimizer offload.
std::string deepspeed_anchor(const SweepConfig& c);
// The torch.compile'd model, compared with the ZeRO-0 rows.
inline constexpr const char* kCompileAnchor = "torch-compile";

// Ratios of each zerotrain row against its anchors (the anchors' time over the row's:
// > 1 means zerotrain is faster; the row's peak over the anchor's): keys
// anchor_ms_per_iter / speedup_vs_anchor / peak_vs_anchor for the PyTorch counterpart,
// ds_ms_per_iter / speedup_vs_deepspeed / peak_vs_deepspeed for DeepSpeed, and
// compile_ms_per_iter / speedup_vs_compile for the compiled model (stage 0 rows). Each ok
// anchor gets "vs" (the first ok row compared with it) and "speedup" (the same ratio).
void add_anchor_ratios(nlohmann::json& rows, nlohmann::json& anchors);

// results.json's object: {"meta": {...}, "rows": [...], "anchors": [...]}. Writes
// OUT/results.md, OUT/memory.png and OUT/time.png.
void write_sweep_report(const nlohmann::json& results, const std::string& out_dir);

// Why a run failed, from its log text: {"status": "oom", "phase": P} when the engine said
// "out of device memory in the P phase" (or "setup" for any other out-of-memory), else
// {"status": "timeout"|"failed"}; plus "error" (the first line mentioning an error: the
// root cause, later ones are other ranks ending) and "exit_code".
nlohmann::json classify_failure(const std::string& log_text, int exit_code, bool timed_out);

}  // namespace zt::bench

// Engine checkpoints: save and load everything needed to continue training exactly,
// stored by parameter name and element range so any world size and ZeRO stage loads it.
// Layout and guarantees: docs/checkpoints.md. The engine (src/engine/engine.cpp) calls
// these with references to its state; nothing here outlives the call.
#pragma once
#include <map>
#include <torch/torch.h>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/shard_coords.h"
#include "optim/loss_scaler.h"
#include "zero/zero_optimizer.h"
#include "zerotrain/comm.h"
#include "zerotrain/config.h"
#include "zerotrain/report.h"

namespace zt::ckpt {

constexpr const char* kFormat = "zerotrain-checkpoint";
// 2: params entries carry shard coordinates ([Shard Keys] in ckpt/shard_coords.h).
// Version 1 (no coordinates: every parameter whole, stage 0, dense) still loads.
constexpr int kVersion = 2;
constexpr int kOldestReadableVersion = 1;

// The engine's step counters (see EngineImpl).
struct Counters {
  int64_t micro_steps = 0;
  int64_t global_steps = 0;
  int64_t applied_steps = 0;  // steps not skipped: the LR schedule position and Adam's step
  bool last_skipped = false;
  // DeepSpeed's global_samples: samples trained so far, each step adding the train_batch_size
  // it ran with (skipped steps too), so it stays exact across a resume at another batch size.
  int64_t global_samples = 0;
};

// References into a live engine.
struct EngineParts {
  torch::nn::Module& model;
  zero::ZeroOptimizer& zero;
  optim::LossScaler& scaler;
  const Config& config;
  const comm::GroupPtr& group;
  torch::Device device;
  at::ScalarType dtype;
  Counters& counters;
  // This rank's shard coordinates per trained parameter ([Shard Keys]); null: every
  // parameter at the default (tp 1, pipeline stage 0, dense), as today's engine runs.
  const ShardLayout* layout = nullptr;
  // [Expert Checkpoints] (engine_checkpoint.cpp) An engine whose experts are split over ep:
  // the experts' shard group (over expert-dp) and the name each expert is stored under, its
  // ep-1 name (global expert index); null: every trained parameter is in `zero`.
  zero::ZeroOptimizer* expert = nullptr;
  std::function<std::string(const std::string& model_name)> expert_name = nullptr;
  // [Pipeline Checkpoints] (engine_checkpoint.cpp) This rank's model is one part of a model
  // cut by layers (a pipeline stage) holding its parameters under the whole model's names,
  // and `group` spans every part (all stages and their dp ranks): one checkpoint of the whole
  // model, as a non-pipelined run writes it. false: `model` is the whole model.
  bool model_part = false;
};

// Collective. Writes DIR/TAG/ and then DIR/latest (see [Checkpoint Protocol] in the .cpp).
// Throws CheckpointError on every rank when any rank fails.
CheckpointSaveReport save_checkpoint(EngineParts& e, const std::string& dir, const std::string& tag,
                                     const nlohmann::json& client_state);

struct Snapshot;  // one save's state, in host memory (async) or referencing the engine (sync)
class DirLock;

// [Async Save] One per engine. save(async) snapshots on the calling thread and starts a
// writer thread that only writes this rank's file; everything collective (error
// agreement, gathering the file digests, rank 0's manifest/rename/`latest`) runs on the
// calling thread in wait() or poll(), so it never overlaps training's collectives.
class AsyncSaver {
 public:
  AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  ~AsyncSaver();  // abandon(): joins the writer, runs no collective

  // Collective. Waits for (and publishes) an in-flight save first; when that one failed,
  // this save is still taken and the failure is thrown after it ([Failed Previous Save] in
  // the .cpp). async = false is
  // save_checkpoint() above. At the first save into DIR, rank 0 takes DIR's lock
  // ([Save Dir Lock]) and holds it while this saver lives; another job holding it is a
  // CheckpointError on every rank naming that job, and nothing is written.
  void save(EngineParts& e, const std::string& dir, const std::string& tag, const nlohmann::json& client_state,
            bool async, double wait_ms_before = 0);
  bool pending() const { return pending_ != nullptr; }
  // Collective: joins the writer and publishes (throws the writer's error on every rank).
  void wait(const comm::GroupPtr& g, int64_t global_step);
  // Collective, one 1-element all-reduce: publishes when every rank's writer is done.
  void poll(const comm::GroupPtr& g, int64_t global_step);
  // Joins the writer and drops the save unpublished (its .TAG.partial stays). No collective.
  void abandon();
  const CheckpointSaveReport& last() const { return last_; }

 private:
  struct Pending;
  void finish(const comm::GroupPtr& g, int64_t global_step);
  std::unique_ptr<Pending> pending_;
  torch::Tensor host_flat_;  // reused snapshot buffer for the fp32 fragments (pinned on CUDA)
  CheckpointSaveReport last_;
  int64_t published_ = 0;
  std::map<std::string, std::unique_ptr<DirLock>> dir_locks_;  // rank 0: directories saved into
};

namespace testing {
// Tests only: called on the writer (async) or calling (sync) thread with the path of the
// rank's file just before it is written.
void set_before_shard_write(std::function<void(const std::string& path)> hook);
// Tests only: the layout used by saves and loads whose EngineParts has none (nullopt:
// the default), until the engine passes the layout of its model-parallel features.
void set_shard_layout(std::optional<ShardLayout> layout);
}  // namespace testing

// Collective. tag "" = the tag in DIR/latest. Returns the saved client_state. Throws
// CheckpointError on every rank, naming the file and the mismatch, when any rank fails.
nlohmann::json load_checkpoint(EngineParts& e, const std::string& dir, const std::string& tag);

// [Failed Previous Save] on load, as on save (AsyncSaver::save), for an engine's
// load_checkpoint: settle() waits for a save in flight and throws its failure as
// CheckpointError (the same on every rank); a failure there does not stop the load. load()
// loads the requested checkpoint and brings the engine's state to it (what must also happen
// when the previous save failed, e.g. a pipeline's tied-weight exchange); it returns the
// client state, and the engine's global step through *step. Then the previous failure is
// thrown, saying the load succeeded; a failing load carries it along.
nlohmann::json load_after_settling(const std::function<void()>& settle,
                                   const std::function<nlohmann::json(int64_t* step)>& load, const std::string& dir,
                                   const std::string& tag);

// DIR/latest's tag; throws CheckpointError when there is none.
std::string read_latest_tag(const std::string& dir);

// Reads DIR/TAG/manifest.json (tag "" = latest) and checks its format.
nlohmann::json read_manifest(const std::string& dir, const std::string& tag);

// Streams the consolidated fp32 value of every managed parameter, by name, from a
// checkpoint (one parameter in memory at a time; every file verified). Plus the
// unmanaged tensors (frozen parameters, buffers) under their own names.
class ConsolidatedReader {
 public:
  ConsolidatedReader(const std::string& dir, const std::string& tag);
  const nlohmann::json& manifest() const { return manifest_; }
  std::vector<std::string> param_names() const;  // managed parameters, manifest order
  std::vector<std::string> extra_names() const;  // unmanaged tensors (rank 0's file)
  torch::Tensor param(const std::string& name);  // fp32, its shape
  torch::Tensor extra(const std::string& name);

  struct Impl;  // verified files and fragment lookup (also used by load_checkpoint)

 private:
  std::shared_ptr<Impl> impl_;
  nlohmann::json manifest_;
};

}  // namespace zt::ckpt

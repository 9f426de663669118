// DeepSpeed's monitors for zerotrain's step reports: the TensorBoard, CSV and wandb outputs
// of the config's "tensorboard", "csv_monitor" and "wandb" sections, with DeepSpeed's
// directories (output_path/job_name/; wandb's own run directory) and event names. The
// engine makes one on rank 0 and hands it every StepReport as it resolves
// (src/engine/engine.cpp, report()), so library users and `zerotrain train` get the same
// files. docs/monitoring.md lists the events.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerotrain/config.h"
#include "zerotrain/engine.h"

namespace zt::monitor {

class CsvMonitor;
class EventFileWriter;
class WandbWriter;

// One scalar: DeepSpeed's (log_name, value, step) tuple. `samples` is the x axis, the
// samples trained so far as DeepSpeed counts them (StepReport::samples, the engine's
// global_samples: each step adds the train_batch_size it ran with).
struct Event {
  std::string name;
  double value = 0;
  int64_t samples = 0;
};

// The events of one step, in the order DeepSpeed writes them: Train/Samples/train_loss at
// the samples before the step (DeepSpeed logs it in backward, before global_samples
// grows), then at the samples after it Train/Samples/lr, Train/Samples/loss_scale (fp16
// only) and zerotrain's additions (grad norm, phase times and memory), then the model's
// StepReport::extra values (an MoE model: Train/Samples/moe_aux_loss, ...).
std::vector<Event> step_events(const StepReport& r, const Config& c);

// Where wandb runs go, as wandb puts them: $WANDB_DIR/wandb, or ./wandb when WANDB_DIR is
// unset or empty. (DeepSpeed's "wandb" section has no path of its own.)
std::string wandb_root();

class Monitor {
 public:
  // nullptr when none of tensorboard, csv_monitor and wandb is enabled. Creates the
  // directories, the event file and the wandb run (throws zt::Error naming a path that
  // cannot be written) and prints where they are. Call on one rank only (the engine:
  // rank 0).
  static std::unique_ptr<Monitor> create(const Config& c);
  // Ends the wandb run: its last row, summary and exit record, exit code 1 when the
  // monitor goes with an exception's unwinding (the engine's failed), else 0.
  ~Monitor();

  // step_events(r) to every enabled output, then flushed (as DeepSpeed flushes each write;
  // a wandb row goes out when an event of a later step comes, or when the run ends).
  void write(const StepReport& r);
  void write_events(const std::vector<Event>& events);

  // Where the outputs go (empty when that output is off).
  std::string tensorboard_file() const;
  std::string csv_dir() const;
  std::string wandb_run_dir() const;

 private:
  explicit Monitor(const Config& c);
  Config cfg_;
  std::unique_ptr<EventFileWriter> tb_;
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<WandbWriter> wandb_;
};

}  // namespace zt::monitor

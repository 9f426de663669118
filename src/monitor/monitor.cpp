// DeepSpeed's monitors over zerotrain's step reports; see monitor.h.
#include "monitor/monitor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "monitor/csv_monitor.h"
#include "monitor/tfevents.h"
#include "monitor/wandb_writer.h"
#include "log/log.h"

namespace zt::monitor {

namespace {

// os.path.join(output_path, job_name), as DeepSpeed builds the log directory.
std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  if (!name.empty() && name.front() == '/') return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

std::vector<Event> step_events(const StepReport& r, const Config& c) {
  // The engine's global_samples (exact across a resume at another batch size); the step
  // itself ran at this config's train_batch_size.
  const int64_t after = r.samples;
  const int64_t before = r.samples - c.train_batch_size;
  std::vector<Event> e;
  e.push_back({"Train/Samples/train_loss", r.loss, before});
  e.push_back({"Train/Samples/lr", r.lr, after});
  if (c.fp16.enabled) e.push_back({"Train/Samples/loss_scale", r.loss_scale, after});
  // zerotrain's additions. The times carry the names DeepSpeed gives them under
  // wall_clock_breakdown (this rank's forward, backward and step, summed over the step's
  // micro-batches); zerotrain writes them always.
  e.push_back({"Train/Samples/grad_norm", r.grad_norm, after});
  e.push_back({"Train/Samples/skipped", r.skipped ? 1.0 : 0.0, after});
  e.push_back({"Train/Samples/elapsed_time_ms_forward", r.forward.ms, after});
  e.push_back({"Train/Samples/elapsed_time_ms_backward", r.backward.ms, after});
  e.push_back({"Train/Samples/elapsed_time_ms_step", r.step_phase.ms, after});
  e.push_back({"Train/Samples/exposed_comm_ms", r.exposed_comm_ms, after});
  e.push_back({"Train/Samples/peak_memory_MiB_forward", r.forward.mem_peak / kMiB, after});
  e.push_back({"Train/Samples/peak_memory_MiB_backward", r.backward.mem_peak / kMiB, after});
  e.push_back({"Train/Samples/peak_memory_MiB_step", r.step_phase.mem_peak / kMiB, after});
  e.push_back({"Train/Samples/model_states_MiB", r.model_state.total() / kMiB, after});
  // The model's own values (StepReport::extra): numbers, and arrays of numbers one event
  // per element (key/<i>); anything else stays in the metrics line only.
  for (const auto& [k, v] : r.extra.items()) {
    if (v.is_number()) {
      e.push_back({"Train/Samples/" + k, v.get<double>(), after});
    } else if (v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_number(); })) {
      for (size_t i = 0; i < v.size(); ++i) {
        e.push_back({"Train/Samples/" + k + "/" + std::to_string(i), v[i].get<double>(), after});
      }
    }
  }
  return e;
}

std::string wandb_root() {
  const char* dir = std::getenv("WANDB_DIR");
  return dir && *dir ? join(dir, "wandb") : "wandb";
}

Monitor::Monitor(const Config& c) : cfg_(c) {
  if (c.tensorboard.enabled) tb_ = std::make_unique<EventFileWriter>(join(c.tensorboard.output_path, c.tensorboard.job_name));
  if (c.csv_monitor.enabled) csv_ = std::make_unique<CsvMonitor>(join(c.csv_monitor.output_path, c.csv_monitor.job_name));
  if (c.wandb.enabled) {
    // As DeepSpeed's WandbMonitor calls wandb.init(project=, group=, entity=team).
    WandbRun run;
    run.entity = c.wandb.team;
    run.project = c.wandb.project;
    run.group = c.wandb.group;
    run.host = hostname();
    wandb_ = std::make_unique<WandbWriter>(wandb_root(), run);
  }
}

Monitor::~Monitor() = default;

std::unique_ptr<Monitor> Monitor::create(const Config& c) {
  if (!c.tensorboard.enabled && !c.csv_monitor.enabled && !c.wandb.enabled) return nullptr;
  std::unique_ptr<Monitor> m(new Monitor(c));
  if (m->tb_) log::info("tensorboard: writing %s", m->tb_->path().c_str());
  if (m->csv_) log::info("csv_monitor: writing %s/*.csv", m->csv_->dir().c_str());
  if (m->wandb_) {
    const std::string& dir = m->wandb_->run_dir();
    log::info("wandb: writing the offline run %s (upload it with `wandb sync %s`)", dir.c_str(), dir.c_str());
  }
  std::fflush(stdout);
  return m;
}

void Monitor::write(const StepReport& r) { write_events(step_events(r, cfg_)); }

void Monitor::write_events(const std::vector<Event>& events) {
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& e : events) {
    if (tb_) tb_->add_scalar(e.name, e.value, e.samples, wall);
    if (csv_) csv_->write(e.name, e.value, e.samples);
    if (wandb_) wandb_->log(e.name, e.value, e.samples, wall);
  }
  if (tb_) tb_->flush();
  if (wandb_) wandb_->flush();
}

std::string Monitor::tensorboard_file() const { return tb_ ? tb_->path() : ""; }
std::string Monitor::csv_dir() const { return csv_ ? csv_->dir() : ""; }
std::string Monitor::wandb_run_dir() const { return wandb_ ? wandb_->run_dir() : ""; }

}  // namespace zt::monitor

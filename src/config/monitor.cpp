// The monitor sections of a DeepSpeed config: "tensorboard", "csv_monitor" and "wandb",
// with DeepSpeed's keys and defaults (deepspeed/monitor/config.py). What they write is
// src/monitor's business; "comet" and "trackio" stay in support.cpp's "not supported yet".
#include "config/sections.h"

namespace zt::config {

namespace {

// DeepSpeed's Optional[str] keys: null and absent read as empty.
std::string optional_string(Section& s, std::string_view key) {
  const json* v = s.find(key);
  if (!v || v->is_null()) return "";
  return to_string(s.ctx(), s.path_of(key), *v).value_or("");
}

}  // namespace

MonitorOutputConfig parse_monitor_output(Section s) {
  MonitorOutputConfig m;
  m.enabled = s.get_bool("enabled", m.enabled);
  m.output_path = optional_string(s, "output_path");
  m.job_name = s.get_string("job_name", m.job_name);
  if (m.enabled && m.job_name.empty()) {
    s.ctx().error(s.path_of("job_name") + ": empty: name the directory the files go to inside output_path (" +
                  "DeepSpeed's default is \"DeepSpeedJobName\")");
  }
  return m;
}

WandbConfig parse_wandb(Section s) {
  WandbConfig w;
  w.enabled = s.get_bool("enabled", w.enabled);
  w.team = optional_string(s, "team");
  w.group = optional_string(s, "group");
  w.project = s.get_string("project", w.project);
  return w;
}

json monitor_output_to_json(const MonitorOutputConfig& m) {
  return json{{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
}

json wandb_to_json(const WandbConfig& w) {
  auto opt = [](const std::string& v) { return v.empty() ? json(nullptr) : json(v); };
  return json{{"enabled", w.enabled}, {"team", opt(w.team)}, {"group", opt(w.group)}, {"project", w.project}};
}

}  // namespace zt::config

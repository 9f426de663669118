// The sweep's report: results.md (two tables: zerotrain's configurations, then the PyTorch
// anchors) and two charts, memory.png (peak per phase per configuration, with the
// estimate and the device's capacity) and time.png (time per iteration, split by phase).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/sweep.h"
#include "report/chart.h"
#include "zerotrain/error.h"

namespace zt::bench {
namespace {

using nlohmann::json;

const char* kPhases[] = {"forward", "backward", "step"};

// GiB with enough digits for small models (a tiny model's states are a few MiB).
std::string gib_fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), v >= 10 ? "%.1f" : v >= 0.1 ? "%.2f" : "%.4f", v);
  return buf;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

double num(const json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
}

// "a / b / c" of a {forward, backward, step} object (sub-key `sub` when given).
std::string per_phase(const json& j, const char* key, const char* sub, const char* f) {
  if (!j.contains(key) || !j[key].is_object()) return "-";
  std::string s;
  for (const char* p : kPhases) {
    const json& v = sub ? j[key][p][sub] : j[key][p];
    s += (s.empty() ? "" : " / ") + (!v.is_number() ? std::string("-") : f ? fmt(f, v.get<double>()) : gib_fmt(v.get<double>()));
  }
  return s;
}

std::string status_cell(const json& r) {
  const std::string st = r.value("status", "?");
  if (st == "ok") return "ok";
  if (st == "oom") return "**OOM in " + r.value("phase", std::string("?")) + "**";
  return "**" + st + "**";
}

std::string md_table(const json& results) {
  const json& meta = results["meta"];
  std::string s;
  s += "# zerotrain bench: " + meta["model"].get<std::string>() + " (" +
       fmt("%.1f", meta["n_params"].get<double>() / 1e6) + "M parameters)\n\n";
  s += "- device: " + meta.value("device", std::string("unknown")) + ", " + std::to_string(meta["ranks"].get<int>()) +
       (meta["gpus"].get<int>() > 0 ? " GPU(s)" : " CPU rank(s)") + "\n";
  s += "- date: " + meta["date"].get<std::string>() + ", commit " + meta["commit"].get<std::string>() + "\n";
  s += "- command: `" + meta["command"].get<std::string>() + "`\n";
  s += "- workload: micro-batch " + std::to_string(meta["micro_batch"].get<int>()) + " x seq " +
       std::to_string(meta["seq"].get<int>()) + " per rank, random tokens, AdamW, gradient clipping 1.0; " +
       std::to_string(meta["steps"].get<int>()) + " timed iterations after " +
       std::to_string(meta["warmup"].get<int>()) + " warm-up, each configuration in fresh processes\n";
  s += "- MFU: " + meta["mfu_formula"].get<std::string>() + "\n";
  s += "- memory: " + meta["memory_source"].get<std::string>() + "\n";
  s += "- exposed comm: time the step waited for gradient communication after backward (the last step; "
       "the rest overlapped with backward)\n\n";
  s += "| config | stage | dtype | offload | status | ms/iter | fwd / bwd / step ms | exposed comm ms | tokens/s | "
       "TFLOP/s per GPU | MFU | "
       "peak GiB fwd / bwd / step | estimate GiB (error) | model states GiB | vs PyTorch: anchor, its ms/iter, "
       "speed-up, peak ratio | vs DeepSpeed: its ms/iter, speed-up, peak ratio |\n";
  s += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results["rows"]) {
    const bool ok = r["status"] == "ok";
    const bool states = r.value("estimate_basis", std::string("peak")) == "model states";
    const double est = r["estimate_gib"][states ? "model_states" : "peak"].get<double>();
    std::string anchor = r["anchor"].get<std::string>();
    if (r.contains("speedup_vs_anchor")) {
      anchor += ", " + fmt("%.1f", num(r, "anchor_ms_per_iter")) + ", **" + fmt("%.2fx", num(r, "speedup_vs_anchor")) +
                "**" + (r.contains("peak_vs_anchor") ? ", " + fmt("%.2f", num(r, "peak_vs_anchor")) : "");
    } else if (!results["anchors"].empty()) {
      anchor += ", -";
    }
    std::string ds = "-";
    if (r.contains("speedup_vs_deepspeed")) {
      ds = r.value("ds_anchor", std::string("")) + ", " + fmt("%.1f", num(r, "ds_ms_per_iter")) + ", **" +
           fmt("%.2fx", num(r, "speedup_vs_deepspeed")) + "**" +
           (r.contains("peak_vs_deepspeed") ? ", " + fmt("%.2f", num(r, "peak_vs_deepspeed")) : "");
    }
    s += "| " + r["name"].get<std::string>() + " | " + std::to_string(r["stage"].get<int>()) + " | " +
         r["dtype"].get<std::string>() + " | " + r["offload"].get<std::string>() + " | " + status_cell(r) + " | " +
         (ok ? fmt("%.1f", num(r, "ms_per_iter")) : "-") + " | " + (ok ? per_phase(r, "phase_ms", nullptr, "%.1f") : "-") +
         " | " + (ok && r.contains("exposed_comm_ms") ? fmt("%.2f", num(r, "exposed_comm_ms")) : "-") + " | " +
         (ok ? fmt("%.0f", num(r, "tokens_per_s")) : "-") + " | " +
         (ok ? fmt("%.3g", num(r, "tflops_per_gpu")) : "-") + " | " +
         (ok && num(r, "mfu") > 0 ? fmt("%.1f%%", 100 * num(r, "mfu")) : "-") + " | " +
         (ok ? per_phase(r, "phase_mem_gib", "peak", nullptr) : "-") + " | " + gib_fmt(est) + (states ? " states" : "") +
         (ok ? " (" + fmt("%+.1f%%", 100 * num(r, "estimate_error")) + ")" : "") + " | " +
         (ok ? gib_fmt(num(r, "model_state_gib")) : "-") + " | " + anchor + " | " + ds + " |\n";
  }
  if (!results["anchors"].empty()) {
    s += "\nAnchors: PyTorch, torch.compile and DeepSpeed (bench/anchors/train_anchor.py, same devices, same call; "
         "bf16). Speed-up = the anchor's ms/iter over the zerotrain row's (> 1: zerotrain is faster):\n\n";
    s += "| anchor | ~ZeRO | status | ms/iter | fwd / bwd / step ms | tokens/s | MFU | peak GiB fwd / bwd / step | "
         "vs zerotrain row: speed-up |\n";
    s += "|---|---|---|---|---|---|---|---|---|\n";
    for (const auto& r : results["anchors"]) {
      const bool ok = r["status"] == "ok";
      const std::string vs = r.contains("speedup") ? r["vs"].get<std::string>() + ", **" + fmt("%.2fx", num(r, "speedup")) + "**"
                                                    : std::string("-");
      s += "| " + r.value("name", r["mode"].get<std::string>()) + " | " + r.value("zero_equiv", std::string("")) + " | " + status_cell(r) +
           " | " + (ok ? fmt("%.1f", num(r, "ms_per_iter")) : "-") + " | " +
           (ok ? per_phase(r, "phase_ms", nullptr, "%.1f") : "-") + " | " + (ok ? fmt("%.0f", num(r, "tokens_per_s")) : "-") +
           " | " + (ok && num(r, "mfu") > 0 ? fmt("%.1f%%", 100 * num(r, "mfu")) : "-") + " | " +
           (ok ? per_phase(r, "phase_mem_gib", "peak", nullptr) : "-") + " | " + vs + " |\n";
    }
  }
  bool failed = false;
  for (const auto& part : {"rows", "anchors"}) {
    for (const auto& r : results[part]) failed = failed || r["status"] != "ok";
  }
  if (failed) {
    s += "\nFailed runs:\n\n";
    for (const auto& part : {"rows", "anchors"}) {
      for (const auto& r : results[part]) {
        if (r["status"] == "ok") continue;
        s += "- " + r["name"].get<std::string>() + ": " + status_cell(r) + " — `" + r.value("error", std::string("")) +
             "` (log: " + r["log"].get<std::string>() + ")\n";
      }
    }
  }
  s += "\nCharts: memory.png (peak memory per phase; the tick is the estimate), time.png (ms per iteration by "
       "phase). Raw results: results.json; per-run configs, logs and per-step metrics in configs/, logs/, runs/.\n";
  return s;
}

// One category per run (zerotrain rows, then anchors); failed runs get a note, no bars.
void build_charts(const json& results, report::BarChart& mem, report::BarChart& time) {
  const json& meta = results["meta"];
  const std::string foot = meta.value("device", std::string("")) + " x" + std::to_string(meta["ranks"].get<int>()) +
                           " | " + meta["model"].get<std::string>() + ", micro-batch " +
                           std::to_string(meta["micro_batch"].get<int>()) + " x seq " +
                           std::to_string(meta["seq"].get<int>()) + " | " + meta["date"].get<std::string>() +
                           " | commit " + meta["commit"].get<std::string>();
  mem.title = "Peak memory per phase, per rank";
  mem.y_label = meta["gpus"].get<int>() > 0 ? "GiB per GPU" : "GiB per rank (model states)";
  time.title = "Time per iteration";
  time.y_label = "ms per iteration";
  time.stacked = true;
  mem.footnote = time.footnote = foot;
  mem.marker_label = "estimate (zerotrain estimate)";
  for (const char* p : kPhases) {
    mem.series.push_back({std::string(p) + " peak", {}});
    time.series.push_back({p, {}});
  }
  double capacity = NAN;
  for (const auto& part : {"rows", "anchors"}) {
    for (const auto& r : results[part]) {
      const bool ok = r["status"] == "ok";
      const std::string label = r["framework"] == "pytorch" && r["mode"] != "compile" ? r["mode"].get<std::string>()
                                                                                    : r["name"].get<std::string>();
      mem.categories.push_back(label);
      time.categories.push_back(label);
      const std::string note = ok ? "" : (r["status"] == "oom" ? "OOM in " + r.value("phase", std::string("?"))
                                                               : r["status"].get<std::string>());
      mem.category_notes.push_back(note);
      time.category_notes.push_back(note);
      for (size_t p = 0; p < 3; ++p) {
        const bool have = ok && r.contains("phase_mem_gib") && r["phase_mem_gib"][kPhases[p]]["peak"].is_number();
        mem.series[p].values.push_back(have ? r["phase_mem_gib"][kPhases[p]]["peak"].get<double>() : NAN);
        time.series[p].values.push_back(ok ? r["phase_ms"][kPhases[p]].get<double>() : NAN);
      }
      const char* basis = r.value("estimate_basis", std::string("peak")) == "model states" ? "model_states" : "peak";
      mem.markers.push_back(r.contains("estimate_gib") ? r["estimate_gib"][basis].get<double>() : NAN);
      if (r.contains("device_total_gib") && num(r, "device_total_gib") > 0) capacity = num(r, "device_total_gib");
    }
  }
  // The device's capacity as a line when the peaks come near it; otherwise in the title
  // (a 140 GiB line would flatten 20 GiB bars).
  double top = 0;
  for (const auto& s : mem.series) {
    for (double v : s.values) top = std::isnan(v) ? top : std::max(top, v);
  }
  if (!std::isnan(capacity) && top >= 0.4 * capacity) {
    mem.reference = capacity;
    mem.reference_label = "device memory " + fmt("%.1f", capacity) + " GiB";
  } else if (!std::isnan(capacity)) {
    mem.title += " (device memory " + fmt("%.1f", capacity) + " GiB)";
  }
}

}  // namespace

nlohmann::json classify_failure(const std::string& text, int exit_code, bool timed_out) {
  json row;
  std::smatch m;
  static const std::regex kPhase("out of device memory in the (\\w+) phase");
  if (std::regex_search(text, m, kPhase)) {
    row["status"] = "oom";
    row["phase"] = m[1].str();
  } else if (text.find("out of memory") != std::string::npos || text.find("OutOfMemoryError") != std::string::npos) {
    row["status"] = "oom";
    row["phase"] = "setup";
  } else {
    row["status"] = timed_out ? "timeout" : "failed";
  }
  std::istringstream in(text);
  std::string line, first;
  while (std::getline(in, line)) {
    if (line.find("error") != std::string::npos || line.find("Error") != std::string::npos) {
      first = line;
      break;
    }
  }
  if (first.size() > 400) first = first.substr(0, 400) + "...";
  row["error"] = timed_out ? std::string("ended after the run's --timeout") : first;
  row["exit_code"] = exit_code;
  return row;
}

std::string deepspeed_anchor(const SweepConfig& c) {
  if (std::string(c.dtype) != "bf16") return "";
  return "deepspeed-z" + std::to_string(c.stage) + (c.offload_param ? "-offall" : c.offload_optimizer ? "-offopt" : "");
}

void add_anchor_ratios(nlohmann::json& rows, nlohmann::json& anchors) {
  auto find = [&](const std::string& name) -> json* {
    for (auto& an : anchors) {
      if (an.value("name", std::string("")) == name && an.value("status", std::string("")) == "ok") return &an;
    }
    return nullptr;
  };
  for (auto& row : rows) {
    if (row.value("status", std::string("")) != "ok") continue;
    const double ms = row["ms_per_iter"].get<double>();
    const bool has_peak = row.contains("peak_gib") && row["peak_gib"].is_number();
    struct Link {
      std::string anchor;
      const char *ms_key, *speed_key, *peak_key;
    };
    std::vector<Link> links = {{"torch-" + row.value("anchor", std::string("")), "anchor_ms_per_iter",
                                "speedup_vs_anchor", "peak_vs_anchor"},
                               {row.value("ds_anchor", std::string("")), "ds_ms_per_iter", "speedup_vs_deepspeed",
                                "peak_vs_deepspeed"}};
    if (row.value("stage", -1) == 0) links.push_back({kCompileAnchor, "compile_ms_per_iter", "speedup_vs_compile", nullptr});
    for (const Link& l : links) {
      json* an = l.anchor.empty() ? nullptr : find(l.anchor);
      if (an == nullptr) continue;
      const double ams = (*an)["ms_per_iter"].get<double>();
      row[l.ms_key] = ams;
      row[l.speed_key] = ams / ms;
      if (l.peak_key && has_peak && (*an)["peak_gib"].is_number() && (*an)["peak_gib"].get<double>() > 0) {
        if (std::string(l.peak_key) == "peak_vs_anchor") row["anchor_peak_gib"] = (*an)["peak_gib"];
        row[l.peak_key] = row["peak_gib"].get<double>() / (*an)["peak_gib"].get<double>();
      }
      if (!an->contains("speedup")) {
        (*an)["vs"] = row["name"];
        (*an)["speedup"] = ams / ms;
      }
    }
  }
}

void write_sweep_report(const nlohmann::json& results, const std::string& out_dir) {
  {
    std::ofstream f(out_dir + "/results.md");
    f << md_table(results);
    ZT_CHECK(f.good(), "bench: cannot write ", out_dir, "/results.md");
  }
  report::BarChart mem, time;
  build_charts(results, mem, time);
  report::write_bar_chart_png(out_dir + "/memory.png", mem);
  report::write_bar_chart_png(out_dir + "/time.png", time);
}

}  // namespace zt::bench

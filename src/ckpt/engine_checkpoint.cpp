// [Checkpoint Protocol] (save_checkpoint; see also [Atomic Publish] in ckpt/fs.h)
//  1. rank 0 clears and creates DIR/.TAG.partial/;                      barrier
//  2. every rank writes DIR/.TAG.partial/rank_RRRRR.safetensors (written to a .tmp name,
//     fsync'ed, renamed) and its CRC-32C;                              gather to rank 0
//  3. rank 0 fsyncs the directory, writes manifest.json (atomically), renames
//     DIR/.TAG.partial to DIR/TAG, fsyncs DIR, then writes DIR/latest atomically.
//  4. every rank learns whether any rank failed (one all-reduce per phase), so a failure
//     on one rank throws on all instead of hanging the others in the next collective.
// A crash before step 3's rename leaves only a .partial directory (ignored, removed by the
// next save of that tag); a crash before the `latest` write leaves `latest` naming the
// previous checkpoint, which is untouched.
#include "ckpt/engine_checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <set>
#include <thread>

#ifdef ZT_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <torch/cuda.h>
#endif
#include <ATen/CPUGeneratorImpl.h>

#include "ckpt/crc32c.h"
#include "ckpt/dir_lock.h"
#include "ckpt/fs.h"
#include "ckpt/tp_reshard.h"
#include "io/safetensors.h"
#include "zerotrain/error.h"
#include "log/log.h"
#include "zerotrain/version.h"

namespace zt::ckpt {
namespace {

std::string rank_file_name(int rank) {
  char s[64];
  std::snprintf(s, sizeof s, "rank_%05d.safetensors", rank);
  return s;
}
// KIND/ID/BEGIN, ID = param_id(name, coordinates) ([Shard Keys]).
std::string state_key(const std::string& kind, const std::string& id, int64_t begin) {
  return kind + "/" + id + "/" + std::to_string(begin);
}

std::optional<ShardLayout>& test_layout() {
  static std::optional<ShardLayout> l;
  return l;
}
// The coordinates a save or load uses: the engine's, else the tests', else the default.
const ShardLayout& layout_of(const EngineParts& e) {
  static const ShardLayout kDefault;
  if (e.layout != nullptr) return *e.layout;
  return test_layout() ? *test_layout() : kDefault;
}

// Fault injection for the crash tests: ZT_CKPT_TEST_CRASH=POINT:RANK makes that rank
// SIGKILL itself at POINT ("after_shard", "before_publish", "before_latest").
void crash_point(const char* point, int rank) {
  const char* env = std::getenv("ZT_CKPT_TEST_CRASH");
  if (env == nullptr) return;
  const std::string want = std::string(point) + ":" + std::to_string(rank);
  if (want == env) {
    log::warn("ZT_CKPT_TEST_CRASH: rank %d killing itself at %s", rank, point);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
}

// Test hook for the failure path of a save (CliInputs.FailedPeriodicSaveIsReportedCleanedAndRetried):
// ZT_CKPT_TEST_FAIL=<tag>:<rank>[:<ms>] makes that rank's write of that tag fail as a full
// disk would, after <ms> milliseconds (a slow failing write: still in flight at the next
// save point when asynchronous).
void fail_point(const std::string& tag, int rank) {
  const char* env = std::getenv("ZT_CKPT_TEST_FAIL");
  if (env == nullptr) return;
  const std::string want = tag + ":" + std::to_string(rank), spec = env;
  if (spec != want && spec.rfind(want + ":", 0) != 0) return;
  if (spec.size() > want.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::stoll(spec.substr(want.size() + 1))));
  }
  throw CheckpointError(detail::cat("cannot write checkpoint '", tag, "' on rank ", rank,
                                    ": No space left on device (injected by ZT_CKPT_TEST_FAIL)"));
}

// Runs fn on this rank and makes the outcome collective: when any rank threw, every rank
// throws CheckpointError with the message of the lowest failing rank.
void collective(const comm::GroupPtr& g, const std::function<void()>& fn) {
  std::string err;
  try {
    fn();
  } catch (const std::exception& ex) {
    err = ex.what();
    if (err.empty()) err = "unknown error";
  }
  const auto failure = comm::lowest_failure(g, err);
  if (!failure) return;
  throw CheckpointError(failure->rank == g->rank() ? failure->message
                                                   : detail::cat("rank ", failure->rank, " failed: ", failure->message));
}

// Every rank's string, in rank order (on every rank).
std::vector<std::string> all_gather_strings(const comm::GroupPtr& g, const std::string& s) {
  if (g->size() == 1) return {s};
  auto mine = torch::full({1}, static_cast<int64_t>(s.size()), torch::kInt64);
  auto lens = torch::empty({g->size()}, torch::kInt64);
  g->all_gather(lens, mine);
  const int64_t maxlen = std::max<int64_t>(1, lens.max().item<int64_t>());
  auto buf = torch::zeros({maxlen}, torch::kUInt8);
  std::memcpy(buf.data_ptr(), s.data(), s.size());
  auto all = torch::empty({maxlen * g->size()}, torch::kUInt8);
  g->all_gather(all, buf);
  std::vector<std::string> out;
  const auto* p = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < g->size(); ++r) out.emplace_back(p + r * maxlen, static_cast<size_t>(lens[r].item<int64_t>()));
  return out;
}

void check_tag(const std::string& tag) {
  ZT_CHECK_T(!tag.empty() && tag.find('/') == std::string::npos && tag[0] != '.' && tag != "latest",
             CheckpointError, "checkpoint tag '", tag, "' is not usable: it names a directory inside the save dir ",
             "(no '/', not starting with '.', not 'latest')");
}

// Managed parameter names (user order) and the unmanaged tensors (frozen parameters and
// buffers), matched by TensorImpl identity.
struct Names {
  std::vector<std::string> managed;
  std::vector<std::pair<std::string, torch::Tensor>> extra;
};
Names model_names(torch::nn::Module& model, const std::vector<torch::Tensor>& managed) {
  std::map<const void*, std::string> by_impl;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    by_impl.emplace(item.value().unsafeGetTensorImpl(), item.key());
  }
  Names n;
  std::set<const void*> used;
  for (size_t i = 0; i < managed.size(); ++i) {
    auto it = by_impl.find(managed[i].unsafeGetTensorImpl());
    ZT_CHECK_T(it != by_impl.end(), CheckpointError, "managed parameter ", i, " (shape ", managed[i].sizes(),
               ") is not a parameter of the model: checkpoints store parameters by their module names");
    n.managed.push_back(it->second);
    used.insert(it->first);
  }
  for (const auto& item : model.named_parameters(true)) {
    if (!used.count(item.value().unsafeGetTensorImpl())) n.extra.emplace_back(item.key(), item.value());
  }
  for (const auto& item : model.named_buffers(true)) n.extra.emplace_back(item.key(), item.value());
  return n;
}

nlohmann::json tensor_meta(const torch::Tensor& t) {
  return {{"dtype", io::safetensors_dtype_name(t.scalar_type())}, {"shape", t.sizes().vec()}};
}

// [Expert Checkpoints] (EngineParts::expert; docs/moe.md)
//  * An engine with experts split over ep has two shard groups: the dense parameters over dp
//    (EngineParts::zero) and this rank's experts over expert-dp (EngineParts::expert). The
//    checkpoint stores every expert under its ep-1 name (EngineParts::expert_name: the global
//    expert index, "h.1.moe.experts.3.c_fc.weight" for local expert 1 of ep rank 1 of 2) at
//    the default shard coordinates: the files are an ep-1 run's, so any ep, world size and
//    expert-dp loads them, and `zerotrain convert` reads them as any other.
//  * Save: the experts' fragments are those of their shard group (rank r of expert-dp writes
//    shard r of every expert bucket, as the dense group over dp), so the ranks holding one
//    expert tile it exactly once. Rank 0 holds only its own experts: the manifest's params are
//    the union of every rank's list (one all-gather; only with experts), each new entry placed
//    before the next entry of its rank's list already there, so an ep-N save lists the
//    parameters in the ep-1 model's order. Each fragment names its entry in that union.
//  * Load: each rank asks for its experts by their global names; the union of the names the
//    ranks read must be the checkpoint's names (no expert left unread, none read twice).

// [Pipeline Checkpoints] (EngineParts::model_part; docs/checkpoints.md, docs/pipeline.md)
//  * A pipeline stage's engine holds its layers under the whole model's names ("h.3..." for
//    stage 1's first block, [Pipeline Tied Weights] in pipe/gpt2_pipe.h) and saves over a
//    group spanning every stage (EngineParts::group; its dp group is the ZeRO shard group).
//    The checkpoint is the one a non-pipelined run of the same model writes: each parameter
//    once, whole, at the default shard coordinates, so it loads at any pp (1 included) and
//    any dp and ZeRO stage 0-3, and a non-pipelined checkpoint loads into any pp.
//  * Save: rank r of a stage's dp group writes shard r of every bucket of its stage, as any
//    engine does, into the file of its rank in `group`; the manifest's params are the union of
//    every rank's list merged as the experts' are (one all-gather), so the stages' lists join
//    in the whole model's order. The last stage's tied copy of wte is not a parameter, so the
//    tied embedding is stored once (the first stage's). A part with unmanaged tensors
//    (buffers, frozen parameters) is refused: only rank 0's would be stored.
//  * Load: each rank reads its own parameters by name; the union of the names the ranks read
//    must be the checkpoint's names. The pipeline engine then sends the loaded wte to the
//    tied copy (PipeEngine::load_checkpoint).

// The trained parameters of an engine by shard group: [0] dense (EngineParts::zero), [1] the
// experts (EngineParts::expert, when set), with the names the checkpoint stores them under.
struct Trained {
  std::vector<zero::ZeroOptimizer*> groups;
  std::vector<std::vector<torch::Tensor>> params;         // per group, its user order
  std::vector<std::vector<std::vector<int64_t>>> shapes;  // full shapes, same order
  std::vector<std::vector<std::string>> stored;           // names in the checkpoint
  Names names;  // model names of every group's parameters (dense first), unmanaged tensors
  std::vector<std::pair<size_t, size_t>> in_model_order;  // (group, index), as named_parameters() lists them
  size_t count() const {
    size_t n = 0;
    for (const auto& p : params) n += p.size();
    return n;
  }
};

Trained trained_params(EngineParts& e) {
  Trained t;
  t.groups.push_back(&e.zero);
  if (e.expert != nullptr) t.groups.push_back(e.expert);
  std::vector<torch::Tensor> all;
  for (auto* z : t.groups) {
    t.params.push_back(z->user_params());
    t.shapes.push_back(z->user_param_shapes());
    all.insert(all.end(), t.params.back().begin(), t.params.back().end());
  }
  t.names = model_names(e.model, all);
  size_t at = 0;
  for (size_t g = 0; g < t.groups.size(); ++g) {
    std::vector<std::string> stored;
    for (size_t i = 0; i < t.params[g].size(); ++i) {
      const std::string& name = t.names.managed[at++];
      if (g == 0) {
        stored.push_back(name);
        continue;
      }
      ZT_CHECK_T(static_cast<bool>(e.expert_name), CheckpointError, "checkpoint of expert '", name,
                 "' split over ep: the engine has no name to store it under (set EngineOptions.expert_global_name: ",
                 "the expert's name at ep 1, by its global index)");
      std::string global = e.expert_name(name);
      ZT_CHECK_T(!global.empty(), CheckpointError, "EngineOptions.expert_global_name('", name, "') is empty");
      stored.push_back(std::move(global));
    }
    t.stored.push_back(std::move(stored));
  }
  // [Pipeline Checkpoints]: only rank 0's unmanaged tensors would be stored.
  ZT_CHECK_T(!e.model_part || t.names.extra.empty(), CheckpointError, "checkpoint of one pipeline stage with the ",
             "unmanaged tensor '", t.names.extra.empty() ? "" : t.names.extra.front().first,
             "' (a buffer or frozen parameter) is not supported yet: a pipeline checkpoint stores trained parameters");
  std::map<std::string, size_t> pos;
  for (const auto& item : e.model.named_parameters(/*recurse=*/true)) pos.emplace(item.key(), pos.size());
  std::vector<std::pair<size_t, std::pair<size_t, size_t>>> order;
  at = 0;
  for (size_t g = 0; g < t.groups.size(); ++g) {
    for (size_t i = 0; i < t.params[g].size(); ++i) order.push_back({pos.at(t.names.managed[at++]), {g, i}});
  }
  std::sort(order.begin(), order.end());
  for (const auto& o : order) t.in_model_order.push_back(o.second);
  return t;
}

// The id ([Shard Keys]) of a params entry {name, shard, ...}.
std::string params_entry_id(const nlohmann::json& p) {
  return param_id(p.at("name").get<std::string>(), coord_of_entry(p, "parameter '" + p.at("name").get<std::string>() + "'"));
}

// [Expert Checkpoints]: every rank's params entries (JSON arrays, rank order) merged into one
// list: each entry once (by id), in each rank's order. An id listed by two ranks with another
// shape or dtype is a CheckpointError.
nlohmann::json merge_rank_entries(const std::vector<std::string>& per_rank) {
  std::list<nlohmann::json> merged;
  std::map<std::string, std::list<nlohmann::json>::iterator> where;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const auto list = nlohmann::json::parse(per_rank[r]);
    // Backwards: a new entry goes right before its successor in this rank's list.
    auto next = merged.end();
    for (size_t j = list.size(); j-- > 0;) {
      const std::string id = params_entry_id(list[j]);
      auto it = where.find(id);
      if (it != where.end()) {
        const auto& had = *it->second;
        ZT_CHECK_T(had.at("shape") == list[j].at("shape") && had.at("dtype") == list[j].at("dtype"), CheckpointError,
                   "parameter '", id, "' is ", had.at("dtype").dump(), " ", had.at("shape").dump(), " on one rank and ",
                   list[j].at("dtype").dump(), " ", list[j].at("shape").dump(), " on rank ", r,
                   ": ranks store one tensor under one name (check EngineOptions.expert_global_name)");
        next = it->second;
        continue;
      }
      next = merged.insert(next, list[j]);
      where.emplace(id, next);
    }
  }
  nlohmann::json out = nlohmann::json::array();
  for (auto& p : merged) out.push_back(std::move(p));
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Reading: verified files, fragments by parameter name.

struct ConsolidatedReader::Impl {
  std::string dir;  // DIR/TAG
  nlohmann::json manifest;
  // param id (name and shard coordinates, [Shard Keys]) -> {file, begin, end}
  std::map<std::string, std::vector<std::array<int64_t, 3>>> fragments;
  std::map<int, std::unique_ptr<io::SafetensorsFile>> open;

  Impl(std::string d, nlohmann::json m) : dir(std::move(d)), manifest(std::move(m)) {
    for (const auto& p : manifest.at("params")) {
      const std::string name = p.at("name").get<std::string>();
      const ShardCoord c = coord_of_entry(p, detail::cat("checkpoint '", dir, "': parameter '", name, "'"));
      auto& v = fragments[param_id(name, c)];
      ZT_CHECK_T(v.empty(), CheckpointError, "checkpoint '", dir, "' lists parameter '", name, "' twice at ",
                 describe(c));
      for (const auto& f : p.at("fragments")) v.push_back({f[0].get<int64_t>(), f[1].get<int64_t>(), f[2].get<int64_t>()});
      std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a[1] < b[1]; });
    }
  }

  // Verifies size, checksum and tensor table of file `idx` on first use.
  const io::SafetensorsFile& file(int idx) {
    auto it = open.find(idx);
    if (it != open.end()) return *it->second;
    const auto& files = manifest.at("files");
    ZT_CHECK_T(idx >= 0 && idx < static_cast<int>(files.size()), CheckpointError, "manifest in '", dir,
               "' refers to file ", idx, " of ", files.size());
    const auto& fm = files[idx];
    const std::string path = join_path(dir, fm.at("name").get<std::string>());
    ZT_CHECK_T(path_exists(path), CheckpointError, "checkpoint file '", path, "' is missing");
    const FileDigest d = file_crc32c(path);
    const uint64_t want_bytes = fm.at("bytes").get<uint64_t>();
    ZT_CHECK_T(d.bytes == want_bytes, CheckpointError, "checkpoint file '", path, "' has ", d.bytes,
               " bytes but the manifest lists ", want_bytes, ": the file is truncated or was replaced");
    const std::string want_crc = fm.at("crc32c").get<std::string>();
    ZT_CHECK_T(crc_hex(d.crc) == want_crc, CheckpointError, "checkpoint file '", path, "' fails its checksum (crc32c ",
               crc_hex(d.crc), ", manifest ", want_crc, "): the file is corrupt");
    std::unique_ptr<io::SafetensorsFile> sf;
    try {
      sf = std::make_unique<io::SafetensorsFile>(path);
    } catch (const std::exception& ex) {
      throw CheckpointError(detail::cat("checkpoint file '", path, "': ", ex.what()));
    }
    for (const auto& [key, meta] : fm.at("tensors").items()) {
      ZT_CHECK_T(sf->contains(key), CheckpointError, "checkpoint file '", path, "' lacks tensor '", key,
                 "' that the manifest lists");
      const auto& e = sf->entry(key);
      const auto shape = meta.at("shape").get<std::vector<int64_t>>();
      const auto dtype = meta.at("dtype").get<std::string>();
      ZT_CHECK_T(e.shape == shape && io::safetensors_dtype_name(e.dtype) == dtype, CheckpointError,
                 "checkpoint file '", path, "': tensor '", key, "' is ", io::safetensors_dtype_name(e.dtype), " ",
                 c10::IntArrayRef(e.shape), " but the manifest lists ", dtype, " ", c10::IntArrayRef(shape));
    }
    return *open.emplace(idx, std::move(sf)).first->second;
  }

  // Elements [begin, end) of the `kind` state of the parameter with id `name`
  // (param_id: its name and shard coordinates), fp32 on the CPU.
  torch::Tensor fetch(const std::string& name, int64_t begin, int64_t end, const std::string& kind) {
    auto it = fragments.find(name);
    ZT_CHECK_T(it != fragments.end(), CheckpointError, "checkpoint '", dir, "' has no parameter '", name, "'");
    auto out = torch::empty({end - begin}, torch::kFloat);
    int64_t covered = 0;
    for (const auto& [f, fb, fe] : it->second) {
      const int64_t lo = std::max(begin, fb), hi = std::min(end, fe);
      if (lo >= hi) continue;
      const auto& sf = file(static_cast<int>(f));
      const std::string key = state_key(kind, name, fb);
      ZT_CHECK_T(sf.contains(key), CheckpointError, "checkpoint file '", sf.path(), "' lacks '", key,
                 "' (the checkpoint holds optimizer state ", manifest.at("state_kinds").dump(), ")");
      auto t = sf.read(key);
      ZT_CHECK_T(t.numel() == fe - fb && t.scalar_type() == torch::kFloat, CheckpointError, "checkpoint file '",
                 sf.path(), "': tensor '", key, "' has ", t.numel(), " elements, the manifest says ", fe - fb);
      out.narrow(0, lo - begin, hi - lo).copy_(t.narrow(0, lo - fb, hi - lo));
      covered += hi - lo;
    }
    ZT_CHECK_T(covered == end - begin, CheckpointError, "checkpoint '", dir, "' covers ", covered, " of elements [",
               begin, ", ", end, ") of parameter '", name, "': fragments are missing");
    return out;
  }
};

std::string read_latest_tag(const std::string& dir) {
  const std::string path = join_path(dir, "latest");
  ZT_CHECK_T(path_exists(path), CheckpointError, "no checkpoint to load in '", dir, "': '", path,
             "' does not exist (pass a tag, or save a checkpoint first)");
  std::string tag = read_text_file(path);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ' || tag.back() == '\r')) tag.pop_back();
  ZT_CHECK_T(!tag.empty(), CheckpointError, "'", path, "' is empty");
  return tag;
}

nlohmann::json read_manifest(const std::string& dir, const std::string& tag_in) {
  const std::string tag = tag_in.empty() ? read_latest_tag(dir) : tag_in;
  const std::string path = join_path(join_path(dir, tag), "manifest.json");
  ZT_CHECK_T(path_exists(path), CheckpointError, "checkpoint '", tag, "' in '", dir, "' has no manifest: '", path,
             "' does not exist (an incomplete save leaves no manifest)");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& ex) {
    throw CheckpointError(detail::cat("checkpoint manifest '", path, "' is not valid JSON: ", ex.what()));
  }
  ZT_CHECK_T(m.value("format", "") == kFormat, CheckpointError, "'", path, "' is not a zerotrain checkpoint manifest");
  const int version = m.value("version", 0);
  // "zerotrain_version" (the release that wrote it; absent before 0.8) only names the
  // writer in this message: the format version alone decides what loads.
  const auto writer = m.find("zerotrain_version");
  const std::string newer = version <= kVersion ? ""
                            : writer != m.end() && writer->is_string()
                                ? " (it was written by zerotrain " + writer->get<std::string>() + ")"
                                : " (it was written by a newer zerotrain)";
  ZT_CHECK_T(version >= kOldestReadableVersion && version <= kVersion, CheckpointError, "'", path,
             "' has format version ", version, "; this build reads versions ", kOldestReadableVersion, " to ",
             kVersion, newer);
  for (const char* key : {"files", "params", "extra", "counters", "state_kinds", "world_size"}) {
    ZT_CHECK_T(m.contains(key), CheckpointError, "checkpoint manifest '", path, "' lacks \"", key, "\"");
  }
  m["_dir"] = join_path(dir, tag);
  return m;
}

ConsolidatedReader::ConsolidatedReader(const std::string& dir, const std::string& tag)
    : manifest_(read_manifest(dir, tag)) {
  impl_ = std::make_shared<Impl>(manifest_.at("_dir").get<std::string>(), manifest_);
}
std::vector<std::string> ConsolidatedReader::param_names() const {
  std::vector<std::string> n;
  std::set<std::string> seen;  // a name stored as several tp shards is one parameter
  for (const auto& p : manifest_.at("params")) {
    if (seen.insert(p.at("name").get<std::string>()).second) n.push_back(p.at("name").get<std::string>());
  }
  return n;
}
std::vector<std::string> ConsolidatedReader::extra_names() const {
  std::vector<std::string> n;
  for (const auto& p : manifest_.at("extra")) n.push_back(p.at("name").get<std::string>());
  return n;
}
torch::Tensor ConsolidatedReader::param(const std::string& name) {
  // The whole parameter: stored whole (default coordinates), or joined from a complete set
  // of tensor-parallel shards ([TP Reshard]); pipeline and expert shards would need
  // assembling, which is not supported yet (find_param_entry says so).
  const ParamRead r = plan_param_read(manifest_.at("params"), name, ShardCoord{}, nullptr, {}, impl_->dir);
  if (!r.direct()) {
    TpResharder rs([this](const std::string& id, int64_t b, int64_t e, const std::string& kind) {
      return impl_->fetch(id, b, e, kind);
    });
    return rs.read(0, r, 0, r.full_numel, "master").view(r.full_shape);
  }
  auto shape = manifest_.at("params")[r.entry].at("shape").get<std::vector<int64_t>>();
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  return impl_->fetch(name, 0, numel, "master").view(shape);
}
torch::Tensor ConsolidatedReader::extra(const std::string& name) {
  const auto& sf = impl_->file(0);
  const std::string key = "model/" + name;
  ZT_CHECK_T(sf.contains(key), CheckpointError, "checkpoint file '", sf.path(), "' has no tensor '", key, "'");
  return sf.read(key);
}

// ---------------------------------------------------------------------------------------
// Saving. take_snapshot (calling thread, collective) -> write_shard (any thread, local)
// -> publish (calling thread, collective). The synchronous save runs the three in a row;
// the asynchronous one runs write_shard on AsyncSaver's writer thread.

namespace {
std::function<void(const std::string&)>& before_write_hook() {
  static std::function<void(const std::string&)> h;
  return h;
}
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void testing::set_before_shard_write(std::function<void(const std::string& path)> hook) {
  before_write_hook() = std::move(hook);
}
void testing::set_shard_layout(std::optional<ShardLayout> layout) { test_layout() = std::move(layout); }

struct Snapshot {
  std::string dir, tag, partial, final_dir;
  int rank = 0, world = 1;
  int64_t step = 0;
  bool async = false;
  std::map<std::string, torch::Tensor> tensors;  // this rank's file
  nlohmann::json frags = nlohmann::json::array();
  nlohmann::json manifest;  // rank 0: all but the fragments and files
  double snapshot_ms = 0;
};

namespace {

// A host copy of t that nothing else aliases (pinned when t is on a GPU; the copy is
// asynchronous then, see the synchronize in take_snapshot).
torch::Tensor host_copy(const torch::Tensor& t) {
  auto out = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(t.is_cuda()));
  out.copy_(t.detach(), /*non_blocking=*/t.is_cuda());
  return out;
}

// Collective (rank 0 prepares DIR/.TAG.partial). copy_into != nullptr: the fp32 fragments
// are copied into *copy_into (grown as needed) and every other tensor is copied too, so
// the snapshot stays valid while training goes on; nullptr: the tensors are the engine's.
std::unique_ptr<Snapshot> take_snapshot(EngineParts& e, const std::string& dir, const std::string& tag_in,
                                        const nlohmann::json& client_state, torch::Tensor* copy_into) {
  torch::NoGradGuard no_grad;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& g = e.group;
  auto s = std::make_unique<Snapshot>();
  s->rank = g->rank();
  s->world = g->size();
  s->step = e.counters.global_steps;
  s->async = copy_into != nullptr;
  s->dir = dir;
  s->tag = tag_in.empty() ? "global_step" + std::to_string(e.counters.global_steps) : tag_in;
  check_tag(s->tag);
  s->partial = join_path(dir, "." + s->tag + ".partial");
  s->final_dir = join_path(dir, s->tag);
  const int rank = s->rank;

  collective(g, [&] {
    if (rank != 0) return;
    make_dirs(dir);
    remove_tree(s->partial);
    make_dirs(s->partial);
  });

  // This rank's shard: its fragments of every managed parameter, its RNG states, and on
  // rank 0 the unmanaged tensors.
  const auto kinds = e.zero.state_kinds();
  const ShardLayout& layout = layout_of(e);
  Trained tr;
  nlohmann::json entries = nlohmann::json::array();  // this rank's params entries, without fragments
  collective(g, [&] {
    tr = trained_params(e);
    ZT_CHECK_T(e.expert == nullptr || e.expert->state_kinds() == kinds, CheckpointError,
               "the experts' optimizer state kinds differ from the dense parameters'");
    for (const auto& [gi, i] : tr.in_model_order) {
      const std::string& name = tr.stored[gi][i];
      validate(layout.of(name), "shard coordinates of parameter '" + name + "'");
      entries.push_back({{"name", name},
                         {"shard", to_json(layout.of(name))},
                         {"shape", tr.shapes[gi][i]},
                         {"dtype", io::safetensors_dtype_name(tr.params[gi][i].scalar_type())}});
      // [TP Reshard]: how a tp shard was cut, for a loader at another tp degree.
      if (const TpSplit* sp = layout.tp_size > 1 ? layout.split_of(name) : nullptr) {
        entries.back()["tp_split"] = {{"blocks", sp->blocks}, {"padded", sp->padded}, {"full_shape", sp->full_shape}};
      }
    }
  });
  // [Expert Checkpoints]: the params of every rank (rank 0 holds only its own experts).
  nlohmann::json params = entries;
  // [TP Reshard]: likewise every tp rank's shards of the split parameters, and every
  // stage's parameters ([Pipeline Checkpoints]).
  if (e.expert != nullptr || layout.tp_size > 1 || e.model_part) {
    const auto all = all_gather_strings(g, entries.dump());
    collective(g, [&] { params = merge_rank_entries(all); });
  }
  collective(g, [&] {
    std::map<std::string, int64_t> index;  // param id -> entry in params
    for (size_t i = 0; i < params.size(); ++i) index.emplace(params_entry_id(params[i]), static_cast<int64_t>(i));
    struct Frag {
      int64_t entry;  // index in params
      std::string id;
      zero::ZeroOptimizer::StateFragment f;
    };
    std::vector<Frag> frags;
    for (size_t gi = 0; gi < tr.groups.size(); ++gi) {
      for (auto& f : tr.groups[gi]->state_fragments()) {
        const std::string& name = tr.stored[gi][static_cast<size_t>(f.param)];
        // [TP Reshard]: a replicated parameter is the same on every tp rank; tp rank 0 writes it.
        if (layout.tp_size > 1 && layout.tp_rank != 0 && layout.split_of(name) == nullptr) continue;
        std::string id = param_id(name, layout.of(name));
        frags.push_back({index.at(id), std::move(id), std::move(f)});
      }
    }
    torch::Tensor flat;
    if (copy_into != nullptr) {
      int64_t n = 0;
      bool cuda = false;
      for (const auto& fr : frags) {
        for (const auto& t : fr.f.state) {
          if (t.scalar_type() == torch::kFloat) n += t.numel();
          cuda = cuda || t.is_cuda();
        }
      }
      // Reused across saves (the previous save's writer has finished). Its device
      // (pinned or pageable) follows the state's; the state does not change device.
      if (!copy_into->defined() || copy_into->numel() < n) {
        *copy_into = torch::empty({n}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(cuda));
      }
      flat = *copy_into;
    }
    int64_t at = 0;
    bool any_cuda = false;
    auto keep = [&](const torch::Tensor& t) -> torch::Tensor {
      if (copy_into == nullptr) return t.cpu();
      any_cuda = any_cuda || t.is_cuda();
      if (t.scalar_type() != torch::kFloat) return host_copy(t);
      auto dst = flat.narrow(0, at, t.numel()).view(t.sizes());
      at += t.numel();
      dst.copy_(t.detach(), /*non_blocking=*/t.is_cuda());
      return dst;
    };
    for (const auto& fr : frags) {
      for (size_t k = 0; k < kinds.size(); ++k) s->tensors[state_key(kinds[k], fr.id, fr.f.begin)] = keep(fr.f.state[k]);
      s->frags.push_back({fr.entry, fr.f.begin, fr.f.end});
    }
    s->tensors["rng/cpu"] = at::detail::getDefaultCPUGenerator().get_state();
#ifdef ZT_WITH_CUDA
    if (e.device.is_cuda()) s->tensors["rng/cuda"] = at::cuda::detail::getDefaultCUDAGenerator(e.device.index()).get_state();
#endif
    if (rank == 0) {
      for (const auto& [name, t] : tr.names.extra) {
        s->tensors["model/" + name] = copy_into != nullptr ? host_copy(t) : t.detach().cpu();
        any_cuda = any_cuda || t.is_cuda();
      }
    }
#ifdef ZT_WITH_CUDA
    // The non-blocking device-to-pinned copies above are ordered on the current stream.
    if (any_cuda) torch::cuda::synchronize(e.device.index());
#endif
  });

  if (rank == 0) {
    nlohmann::json& m = s->manifest;
    m["format"] = kFormat;
    m["version"] = kVersion;
    // Informational: which release wrote this checkpoint (load ignores it; "version" above
    // is the format version that decides readability).
    m["zerotrain_version"] = zt::version();
    m["tag"] = s->tag;
    m["world_size"] = s->world;
    m["zero_stage"] = e.config.zero_optimization.stage;
    m["compute_dtype"] = c10::toString(e.dtype);
    m["fp16"] = e.config.fp16.enabled;
    m["counters"] = {{"micro_steps", e.counters.micro_steps},
                     {"global_steps", e.counters.global_steps},
                     {"applied_steps", e.counters.applied_steps},
                     {"last_skipped", e.counters.last_skipped},
                     {"global_samples", e.counters.global_samples}};
    m["loss_scaler"] = e.scaler.state();
    // The LR schedule is a pure function of the applied-step count (the config holds its
    // type and parameters).
    m["scheduler"] = {{"type", e.config.scheduler.type}, {"position", e.counters.applied_steps}};
    m["state_kinds"] = kinds;
    m["config"] = e.config.to_json();
    m["rng"] = {{"cpu", true}, {"cuda", e.device.is_cuda()}};
    for (auto& p : params) p["fragments"] = nlohmann::json::array();
    nlohmann::json extra = nlohmann::json::array();
    for (const auto& [name, t] : tr.names.extra) {
      auto meta = tensor_meta(t);
      meta["name"] = name;
      extra.push_back(meta);
    }
    m["params"] = params;
    m["extra"] = extra;
    m["client_state"] = client_state;
  }
  s->snapshot_ms = ms_since(t0);
  return s;
}

// Writes this rank's file (tmp name, fsync, rename) and returns its manifest entry plus
// "fragments" and "write_ms". No communication: safe on the writer thread.
nlohmann::json write_shard(const Snapshot& s) {
  const auto t0 = std::chrono::steady_clock::now();
  // Weights with inf/NaN are not a checkpoint to resume from: this rank's error fails the
  // save on every rank before anything is published, so `latest` keeps naming the last
  // finite checkpoint (and a re-saved tag keeps its old files).
  for (const auto& [key, t] : s.tensors) {
    if ((key.rfind("master/", 0) != 0 && key.rfind("model/", 0) != 0) || !at::isFloatingType(t.scalar_type())) continue;
    ZT_CHECK_T(t.numel() == 0 || t.isfinite().all().item<bool>(), CheckpointError, "checkpoint '", s.tag, "' in '",
               s.dir, "' not saved: rank ", s.rank, "'s tensor '", key,
               "' holds inf/NaN (the run diverged); 'latest' still names the previous checkpoint");
  }
  const std::string fname = rank_file_name(s.rank);
  const std::string path = join_path(s.partial, fname);
  if (before_write_hook()) before_write_hook()(path);
  fail_point(s.tag, s.rank);
  io::save_safetensors(path, s.tensors, {{"format", kFormat}, {"rank", std::to_string(s.rank)}});
  crash_point("after_shard", s.rank);
  const FileDigest d = file_crc32c(path);
  nlohmann::json tmeta = nlohmann::json::object();
  for (const auto& [k, t] : s.tensors) tmeta[k] = tensor_meta(t);
  return {{"name", fname},       {"rank", s.rank},    {"bytes", d.bytes}, {"crc32c", crc_hex(d.crc)},
          {"tensors", tmeta},    {"fragments", s.frags}, {"write_ms", ms_since(t0)}};
}

// After a failed save (every rank has left write_shard: the failure was agreed on), rank 0
// removes the tag's .partial directory, so a failure costs no disk space. A failure to
// remove it is only reported: load ignores .partial directories and the next save of the
// tag replaces it.
void discard_partial(const Snapshot& s) {
  if (s.rank != 0) return;
  try {
    remove_tree(s.partial);
  } catch (const std::exception& ex) {
    log::warn("could not remove %s after the failed save: %s", s.partial.c_str(), ex.what());
  }
}

// Collective. `error` is this rank's write_shard failure ("" = none): any rank's error
// throws on every rank. Then rank 0 writes the manifest and publishes.
void publish(const comm::GroupPtr& g, Snapshot& s, const nlohmann::json& info, const std::string& error,
             CheckpointSaveReport& rep) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    collective(g, [&] {
      if (!error.empty()) throw CheckpointError(error);
    });
  } catch (const CheckpointError&) {
    discard_partial(s);
    throw;
  }
  const auto infos = all_gather_strings(g, info.dump());
  const int rank = s.rank, world = s.world;
  double write_ms = 0;
  int64_t bytes = 0;
  collective(g, [&] {
    if (rank != 0) return;
    nlohmann::json& m = s.manifest;
    nlohmann::json& params = m["params"];
    nlohmann::json files = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      auto fi = nlohmann::json::parse(infos[r]);
      for (const auto& f : fi.at("fragments")) {
        params[f[0].get<size_t>()]["fragments"].push_back({r, f[1], f[2]});
      }
      write_ms = std::max(write_ms, fi.value("write_ms", 0.0));
      bytes += fi.at("bytes").get<int64_t>();
      fi.erase("fragments");
      fi.erase("write_ms");
      files.push_back(fi);
    }
    m["files"] = files;
    // The ranks' fragments tile every parameter exactly once (two ranks storing different
    // tensors under one name, [Expert Checkpoints], would overlap here).
    for (const auto& p : params) {
      std::vector<std::pair<int64_t, int64_t>> f;
      for (const auto& x : p.at("fragments")) f.emplace_back(x[1].get<int64_t>(), x[2].get<int64_t>());
      std::sort(f.begin(), f.end());
      int64_t end = 0, numel = 1;
      for (const auto& d : p.at("shape")) numel *= d.get<int64_t>();
      for (const auto& [b, e] : f) {
        ZT_CHECK_T(b == end, CheckpointError, "checkpoint '", s.tag, "' not saved: the ranks' pieces of parameter '",
                   params_entry_id(p), "' ", b < end ? "overlap" : "leave a gap", " at element ", std::min(b, end),
                   " (does EngineOptions.expert_global_name give each expert its own name?)");
        end = e;
      }
      ZT_CHECK_T(end == numel, CheckpointError, "checkpoint '", s.tag, "' not saved: the ranks' pieces of parameter '",
                 params_entry_id(p), "' cover ", end, " of its ", numel, " elements");
    }
    write_file_atomic(join_path(s.partial, "manifest.json"), m.dump(1));
    fsync_path(s.partial);
    crash_point("before_publish", rank);
    if (path_exists(s.final_dir)) {
      // Re-saving a tag: move the old one aside first, so the rename below cannot fail on
      // a non-empty directory.
      const std::string old = join_path(s.dir, "." + s.tag + ".old");
      remove_tree(old);
      rename_path(s.final_dir, old);
      rename_path(s.partial, s.final_dir);
      remove_tree(old);
    } else {
      rename_path(s.partial, s.final_dir);
    }
    fsync_path(s.dir);
    crash_point("before_latest", rank);
    write_file_atomic(join_path(s.dir, "latest"), s.tag);
  });
  rep.dir = s.dir;
  rep.tag = s.tag;
  rep.async = s.async;
  rep.step = s.step;
  rep.snapshot_ms = s.snapshot_ms;
  rep.write_ms = write_ms;
  rep.bytes = bytes;
  rep.publish_ms = ms_since(t0);
}

void print_saved(const CheckpointSaveReport& r, int rank) {
  if (rank != 0) return;
  if (r.async) {
    log::info("saved checkpoint '%s' in %s (async, published at step %lld): stall %.1f ms "
              "(snapshot %.1f, waiting for the previous save %.1f), write %.1f ms, publish %.1f ms, %.1f MiB",
                r.tag.c_str(), r.dir.c_str(), static_cast<long long>(r.published_step), r.stall_ms, r.snapshot_ms,
                r.wait_ms, r.write_ms, r.publish_ms, r.bytes / 1048576.0);
  } else {
    log::info("saved checkpoint '%s' in %s: stall %.1f ms (write %.1f ms, publish %.1f ms), %.1f MiB",
                r.tag.c_str(), r.dir.c_str(), r.stall_ms, r.write_ms, r.publish_ms, r.bytes / 1048576.0);
  }
}

}  // namespace

CheckpointSaveReport save_checkpoint(EngineParts& e, const std::string& dir, const std::string& tag,
                                     const nlohmann::json& client_state) {
  const auto t0 = std::chrono::steady_clock::now();
  auto s = take_snapshot(e, dir, tag, client_state, nullptr);
  nlohmann::json info;
  try {
    collective(e.group, [&] { info = write_shard(*s); });
  } catch (const CheckpointError&) {
    discard_partial(*s);
    throw;
  }
  CheckpointSaveReport rep;
  publish(e.group, *s, info, "", rep);
  rep.published_step = e.counters.global_steps;
  rep.stall_ms = ms_since(t0);
  print_saved(rep, e.group->rank());
  return rep;
}

struct AsyncSaver::Pending {
  std::unique_ptr<Snapshot> snap;
  std::thread writer;
  std::atomic<bool> done{false};
  nlohmann::json info;
  std::string error;
  double wait_ms = 0, stall_ms = 0;
};

AsyncSaver::AsyncSaver() = default;
AsyncSaver::~AsyncSaver() { abandon(); }

void AsyncSaver::abandon() {
  if (!pending_) return;
  if (pending_->writer.joinable()) pending_->writer.join();
  if (pending_->snap->rank == 0) {
    log::warn("asynchronous checkpoint '%s' in %s was not published (no wait_checkpoint)",
                 pending_->snap->tag.c_str(), pending_->snap->dir.c_str());
  }
  pending_.reset();
}

void AsyncSaver::save(EngineParts& e, const std::string& dir, const std::string& tag,
                      const nlohmann::json& client_state, bool async, double wait_ms_before) {
  const auto t0 = std::chrono::steady_clock::now();
  // A second save waits for the first. [Failed Previous Save] A previous asynchronous save
  // that failed does not cost this one: its error (the same on every rank: publish agrees
  // on it) is kept, this save is taken, and then the error is thrown, saying what became of
  // this save. An error of this save carries the previous one along.
  std::string previous;
  try {
    wait(e.group, e.counters.global_steps);
  } catch (const CheckpointError& ex) {
    previous = ex.what();
  }
  const std::string this_tag = tag.empty() ? "global_step" + std::to_string(e.counters.global_steps) : tag;
  auto with_previous = [&](const std::string& err) {
    return previous.empty() ? err : detail::cat(err, " (before it, the previous asynchronous save failed: ", previous, ")");
  };
  try {
    // [Save Dir Lock]: one job per directory, taken at the first save into it.
    std::string lock_error;
    if (e.group->rank() == 0 && !dir_locks_.count(dir)) {
      try {
        dir_locks_[dir] = DirLock::acquire(dir);
      } catch (const std::exception& ex) {
        lock_error = ex.what();
      }
    }
    const auto lock_failure = comm::lowest_failure(e.group, lock_error);
    ZT_CHECK_T(!lock_failure, CheckpointError, lock_failure ? lock_failure->message : "");
  } catch (const CheckpointError& ex) {
    throw CheckpointError(with_previous(ex.what()));
  }
  const double wait_ms = wait_ms_before + ms_since(t0);
  if (!async) {
    try {
      last_ = save_checkpoint(e, dir, tag, client_state);
    } catch (const CheckpointError& ex) {
      throw CheckpointError(with_previous(ex.what()));
    }
    last_.wait_ms = wait_ms;
    last_.stall_ms += wait_ms;
    last_.index = ++published_;
    ZT_CHECK_T(previous.empty(), CheckpointError, previous, "; this call's checkpoint '", this_tag, "' in '", dir,
               "' was saved and published (latest = ", this_tag, ")");
    return;
  }
  auto p = std::make_unique<Pending>();
  try {
    p->snap = take_snapshot(e, dir, tag, client_state, &host_flat_);
  } catch (const CheckpointError& ex) {
    throw CheckpointError(with_previous(ex.what()));
  }
  p->wait_ms = wait_ms;
  Pending* raw = p.get();
  p->writer = std::thread([raw] {
    try {
      raw->info = write_shard(*raw->snap);
    } catch (const std::exception& ex) {
      raw->error = detail::cat("asynchronous save of checkpoint '", raw->snap->tag, "' in '", raw->snap->dir,
                               "' failed on rank ", raw->snap->rank, ": ", ex.what());
    }
    raw->done.store(true, std::memory_order_release);
  });
  pending_ = std::move(p);
  pending_->stall_ms = ms_since(t0);
  ZT_CHECK_T(previous.empty(), CheckpointError, previous, "; this call's asynchronous save of checkpoint '", this_tag,
             "' in '", dir, "' was started and is in flight (published at a later step() or wait_checkpoint())");
}

void AsyncSaver::wait(const comm::GroupPtr& g, int64_t global_step) {
  if (!pending_) return;
  if (pending_->writer.joinable()) pending_->writer.join();
  finish(g, global_step);
}

void AsyncSaver::poll(const comm::GroupPtr& g, int64_t global_step) {
  if (!pending_) return;
  int64_t done = pending_->done.load(std::memory_order_acquire) ? 1 : 0;
  if (g->size() > 1) {
    auto flag = torch::full({1}, done, torch::kInt64);
    g->all_reduce(flag, comm::ReduceOp::kMin);
    done = flag.item<int64_t>();
  }
  if (done == 1) wait(g, global_step);
}

void AsyncSaver::finish(const comm::GroupPtr& g, int64_t global_step) {
  std::unique_ptr<Pending> p = std::move(pending_);  // published or failed: not pending any more
  CheckpointSaveReport rep;
  publish(g, *p->snap, p->info, p->error, rep);
  rep.published_step = global_step;
  rep.wait_ms = p->wait_ms;
  rep.stall_ms = p->stall_ms;
  rep.index = ++published_;
  last_ = rep;
  print_saved(rep, g->rank());
}

// ---------------------------------------------------------------------------------------
// Loading.

nlohmann::json load_checkpoint(EngineParts& e, const std::string& dir, const std::string& tag_in) {
  torch::NoGradGuard no_grad;
  const auto& g = e.group;
  const int rank = g->rank();
  nlohmann::json m;
  std::unique_ptr<ConsolidatedReader::Impl> rd;
  const auto kinds = e.zero.state_kinds();
  const ShardLayout& layout = layout_of(e);
  Trained tr;
  std::vector<std::vector<std::string>> ids;  // per shard group and parameter: its id in the checkpoint
  std::vector<std::vector<ParamRead>> reads;  // and how it is read ([TP Reshard])
  collective(g, [&] { tr = trained_params(e); });
  // The names the ranks of this run read ([Expert Checkpoints]: with experts, the union of
  // every rank's; likewise the stages' of a pipeline, [Pipeline Checkpoints]; otherwise this
  // rank's, which every rank shares).
  std::set<std::string> run_names;
  {
    std::string mine;
    for (const auto& st : tr.stored) {
      for (const auto& n : st) mine += n + "\n";
    }
    const bool union_of_ranks = e.expert != nullptr || e.model_part;
    const auto all = union_of_ranks ? all_gather_strings(g, mine) : std::vector<std::string>{mine};
    for (const auto& list : all) {
      for (size_t b = 0, nl; (nl = list.find('\n', b)) != std::string::npos; b = nl + 1) run_names.insert(list.substr(b, nl - b));
    }
  }
  // Phase 1 (no state changes): manifest, names, shapes, optimizer kinds, this rank's files.
  collective(g, [&] {
    m = read_manifest(dir, tag_in);
    const std::string cdir = m.at("_dir").get<std::string>();
    rd = std::make_unique<ConsolidatedReader::Impl>(cdir, m);
    const auto& params = m.at("params");
    for (size_t gi = 0; gi < tr.groups.size(); ++gi) {
      ids.emplace_back();
      reads.emplace_back();
      for (size_t i = 0; i < tr.params[gi].size(); ++i) {
        // Exactly this rank's shard of the parameter ([Shard Keys]), or this rank's slice
        // cut from the whole parameter or a complete set of tp shards ([TP Reshard]); other
        // coordinates are a CheckpointError naming the tensor, never a silent load of
        // another shard.
        const std::string& name = tr.stored[gi][i];
        const ShardCoord want = layout.of(name);
        ParamRead r = plan_param_read(params, name, want, layout.split_of(name), tr.shapes[gi][i], cdir);
        if (r.direct()) {
          auto shape = params[r.entry].at("shape").get<std::vector<int64_t>>();
          ZT_CHECK_T(shape == tr.shapes[gi][i], CheckpointError, "checkpoint '", cdir, "': parameter '", name,
                     "' has shape ", c10::IntArrayRef(shape), " but the model's is ", c10::IntArrayRef(tr.shapes[gi][i]));
        }
        ids.back().push_back(param_id(name, want));
        reads.back().push_back(std::move(r));
      }
    }
    std::set<std::string> saved_names;  // a name held at several coordinates counts once
    for (const auto& p : params) saved_names.insert(p.at("name").get<std::string>());
    if (e.expert == nullptr && !e.model_part) {
      ZT_CHECK_T(saved_names.size() == tr.count(), CheckpointError, "checkpoint '", cdir, "' holds ",
                 saved_names.size(), " trained parameters but this model trains ", tr.count());
    } else {
      const char* how = e.expert != nullptr ? "experts split over ep are read by their global names: check the "
                                              "number of experts and EngineOptions.expert_global_name"
                                            : "pipeline stages read their layers by the whole model's names: "
                                              "check the model's shape (layers, width, vocabulary)";
      for (const auto& n : saved_names) {
        ZT_CHECK_T(run_names.count(n), CheckpointError, "checkpoint '", cdir, "' holds parameter '", n,
                   "' but no rank of this run trains it (", how, ")");
      }
      ZT_CHECK_T(saved_names.size() == run_names.size(), CheckpointError, "checkpoint '", cdir, "' holds ",
                 saved_names.size(), " trained parameters but the ranks of this run train ", run_names.size(), " (",
                 how, ")");
    }
    const auto saved_kinds = m.at("state_kinds").get<std::vector<std::string>>();
    for (const auto& k : kinds) {
      ZT_CHECK_T(std::find(saved_kinds.begin(), saved_kinds.end(), k) != saved_kinds.end(), CheckpointError,
                 "checkpoint '", cdir, "' holds optimizer state ", m.at("state_kinds").dump(),
                 " but this engine's optimizer needs '", k, "': the optimizer type differs");
    }
    for (const auto& [name, t] : tr.names.extra) {
      bool found = false;
      for (const auto& x : m.at("extra")) found = found || x.at("name") == name;
      ZT_CHECK_T(found, CheckpointError, "checkpoint '", cdir, "' lacks the model tensor '", name, "'");
    }
    // Open and verify every file this rank will read (fragments overlapping what it owns
    // are found lazily below; verifying file 0 and this rank's file here catches the
    // common corruptions before any state is touched).
    rd->file(0);
    if (rank < m.at("world_size").get<int>()) rd->file(rank);
  });
  // Phase 2: fill the state. A failure here (a file that only this rank reads) throws on
  // every rank; the engine is then unusable and must be rebuilt.
  collective(g, [&] {
    // Rank 0 shows the load's progress by parameter ([Log Lines]; a bar on a terminal).
    log::Progress progress("checkpoint load '" + m.value("tag", std::string()) + "'",
                           static_cast<double>(tr.count()), "parameters");
    int base = 0, done = 0;
    TpResharder resharder(
        [&](const std::string& id, int64_t b, int64_t en, const std::string& kind) { return rd->fetch(id, b, en, kind); });
    for (size_t gi = 0; gi < tr.groups.size(); ++gi) {
      tr.groups[gi]->import_state([&](int param, int64_t begin, int64_t end, const std::string& kind) {
        if (base + param + 1 > done) progress.update(done = base + param + 1);
        const ParamRead& r = reads[gi][static_cast<size_t>(param)];
        if (!r.direct()) return resharder.read(base + param, r, begin, end, kind);
        return rd->fetch(ids[gi][static_cast<size_t>(param)], begin, end, kind);
      });
      base += static_cast<int>(tr.params[gi].size());
    }
    progress.finish();
    const auto& f0 = rd->file(0);
    for (const auto& [name, t] : tr.names.extra) {
      auto v = f0.read("model/" + name);
      ZT_CHECK_T(v.sizes() == t.sizes(), CheckpointError, "checkpoint file '", f0.path(), "': model tensor '", name,
                 "' has shape ", v.sizes(), " but the model's is ", t.sizes());
      t.copy_(v);
    }
    if (rank < m.at("world_size").get<int>()) {
      const auto& mine = rd->file(rank);
      at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
      cpu_gen.set_state(mine.read("rng/cpu"));
#ifdef ZT_WITH_CUDA
      if (e.device.is_cuda() && mine.contains("rng/cuda"))
      {
        at::Generator cuda_gen = at::cuda::detail::getDefaultCUDAGenerator(e.device.index());
        cuda_gen.set_state(mine.read("rng/cuda"));
      }
#endif
    } else if (rank == m.at("world_size").get<int>()) {
      log::warn("checkpoint was saved by %d ranks: ranks >= %d keep their own RNG state",
                   m.at("world_size").get<int>(), m.at("world_size").get<int>());
    }
  });
  for (auto* z : tr.groups) z->finish_state_import();  // dense over dp, then the experts over expert-dp

  const auto& c = m.at("counters");
  e.counters.micro_steps = c.at("micro_steps").get<int64_t>();
  e.counters.global_steps = c.at("global_steps").get<int64_t>();
  e.counters.applied_steps = c.at("applied_steps").get<int64_t>();
  e.counters.last_skipped = c.at("last_skipped").get<bool>();
  // DeepSpeed: checkpoint.get('global_samples', global_steps * train_batch_size()), with the
  // loading run's batch size.
  if (c.contains("global_samples")) {
    e.counters.global_samples = c.at("global_samples").get<int64_t>();
  } else {
    e.counters.global_samples = e.counters.global_steps * e.config.train_batch_size;
    if (rank == 0) {
      log::info("checkpoint '%s' has no global_samples (saved before zerotrain stored it): counting samples from "
                "global_steps %lld x train_batch_size %lld = %lld",
                m.value("tag", "").c_str(), static_cast<long long>(e.counters.global_steps),
                static_cast<long long>(e.config.train_batch_size), static_cast<long long>(e.counters.global_samples));
    }
  }
  if (m.value("fp16", false) == e.config.fp16.enabled) {
    e.scaler.load_state(m.at("loss_scaler"));
  } else if (rank == 0) {
    log::warn("checkpoint fp16=%d, config fp16=%d: loss scaler state not restored",
                 m.value("fp16", false) ? 1 : 0, e.config.fp16.enabled ? 1 : 0);
  }
  if (rank == 0) {
    log::info("loaded checkpoint '%s' (step %lld, saved by %d ranks at stage %d) into %d ranks at stage %d",
                m.value("tag", "").c_str(), static_cast<long long>(e.counters.global_steps),
                m.at("world_size").get<int>(), m.value("zero_stage", 0), g->size(),
                static_cast<int>(e.config.zero_optimization.stage));
  }
  return m.value("client_state", nlohmann::json::object());
}

nlohmann::json load_after_settling(const std::function<void()>& settle,
                                   const std::function<nlohmann::json(int64_t* step)>& load, const std::string& dir,
                                   const std::string& tag) {
  std::string previous;
  try {
    settle();
  } catch (const CheckpointError& ex) {
    previous = ex.what();
  }
  nlohmann::json client;
  int64_t step = 0;
  try {
    client = load(&step);
  } catch (const CheckpointError& ex) {
    if (previous.empty()) throw;
    throw CheckpointError(detail::cat(ex.what(), " (before it, the previous asynchronous save failed: ", previous, ")"));
  }
  ZT_CHECK_T(previous.empty(), CheckpointError, previous, "; this call's load of checkpoint '",
             tag.empty() ? std::string("latest") : tag, "' from '", dir, "' succeeded (the engine is at global step ",
             step, ")");
  return client;
}

}  // namespace zt::ckpt

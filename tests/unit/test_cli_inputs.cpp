// The `zerotrain` command with hostile input, run as a user runs it (a child process):
// numbers that overflow, JSON that nests too deep, bad flag values, outputs that would
// overwrite inputs, save locations that cannot be written. Each must end with a
// one-line message naming the key, flag or path, with exit code 2 for usage errors and
// 1 for the rest -- never a signal, never a finished run that then cannot save.
#include <gtest/gtest.h>
#include "support/run_shell.h"
#include <ftw.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/dir_lock.h"

namespace zt_test_cli_inputs {

namespace {

namespace fs = std::filesystem;

using Ran = zt::test_support::ShellRun;

Ran run(const std::string& args) {
  Ran r = zt::test_support::run_shell("timeout -k 5 120 " ZT_BINARY_DIR "/zerotrain " + args);
  if (r.code == -1) ADD_FAILURE() << "popen failed: zerotrain " << args;
  return r;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// Not std::filesystem::remove_all: it crashes in binaries linked to libtorch (see
// test_safetensors.cpp).
int rm_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }
void rm_rf(const fs::path& p) { ::nftw(p.c_str(), rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(ZT_BINARY_DIR) / ("cli_inputs_" + name + "_" + std::to_string(::getpid()));
  rm_rf(d);
  fs::create_directories(d);
  return d;
}

fs::path write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
  return p;
}

TEST(CliInputs, CheckConfigBatchOverflowIsAnErrorNotASignal) {
  const fs::path d = temp_dir("overflow");
  // Was SIGFPE (136): micro * world wrapped to 0 and was divided by.
  Ran r = run("check-config " + write(d / "a.json", R"({"train_micro_batch_size_per_gpu": 4611686018427387904})").string() +
              " --world 4");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "train_micro_batch_size_per_gpu (4611686018427387904) * world size (4)")) << r.output;
  // Was "OK" with train_batch_size 0.
  r = run("check-config " +
          write(d / "b.json", R"({"train_micro_batch_size_per_gpu": 4294967296, "gradient_accumulation_steps": 4294967296})")
              .string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_FALSE(contains(r.output, "OK:")) << r.output;
  EXPECT_TRUE(contains(r.output, "does not fit a 64-bit integer")) << r.output;
  rm_rf(d);
}

TEST(CliInputs, CheckConfigHostileJsonIsNamed) {
  const fs::path d = temp_dir("json");
  // Was SIGSEGV (139): the JSON parser recursed 60 000 levels.
  const fs::path deep = write(d / "deep.json", std::string(60000, '[') + std::string(60000, ']'));
  Ran r = run("check-config " + deep.string());
  EXPECT_EQ(r.code, 1) << r.output.substr(0, 400);
  EXPECT_TRUE(contains(r.output, deep.string() + ": JSON nested deeper than 64 levels")) << r.output.substr(0, 400);
  // Was "invalid JSON: ... unexpected end of input".
  r = run("check-config " + d.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a directory")) << r.output;
  // Was "unexpected error: [json.exception.out_of_range.406] number overflow parsing '1e400'".
  r = run("check-config " + write(d / "big.json", R"({"train_batch_size": 8, "gradient_clipping": 1e400})").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "gradient_clipping")) << r.output;
  EXPECT_FALSE(contains(r.output, "json.exception")) << r.output;
  // A key containing JSON-pointer characters left "auto" (check-config fills it in).
  r = run("check-config " + write(d / "ptr.json", R"({"train_batch_size": 8, "a~b/c": {"x": "auto"}})").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown key a~b/c")) << r.output;
  rm_rf(d);
}

TEST(CliInputs, BadNumericFlagsAreUsageErrorsNamingFlagAndValue) {
  const std::string cfg = std::string(ZT_SOURCE_DIR) + "/configs/zero0.json";
  struct Case {
    std::string args, flag, value;
  };
  const Case cases[] = {
      {"train --config " + cfg + " --clip abc", "--clip", "abc"},  // was "unexpected error: stod"
      {"train --config " + cfg + " --clip -1", "--clip", "-1"},
      {"train --config " + cfg + " --peak-tflops nan", "--peak-tflops", "nan"},
      {"train --config " + cfg + " --steps 1e30", "--steps", "1e30"},
      {"train --config " + cfg + " --seq 12abc", "--seq", "12abc"},
      {"train --config " + cfg + " --micro-batch inf", "--micro-batch", "inf"},
      {"estimate --config " + cfg + " --gpu-mem lots", "--gpu-mem", "lots"},
      {"estimate --config " + cfg + " --host-mem 1e999", "--host-mem", "1e999"},
      {"check-config " + cfg + " --world x", "--world", "x"},
  };
  for (const auto& c : cases) {
    Ran r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.flag) && contains(r.output, "'" + c.value + "'")) << c.args << "\n" << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << r.output;
  }
  Ran r = run("train --config " + cfg + " --bogus");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run("convert a b --dtype int8");
  EXPECT_EQ(r.code, 2) << r.output;
}

// A one-step GPT-2 run that saves a checkpoint into `dir` (seconds on one CPU rank).
Ran train_and_save(const std::string& dir, const std::string& extra = "") {
  return run("train --config " + std::string(ZT_SOURCE_DIR) +
             "/configs/zero0.json --model gpt2-tiny --steps 1 --seq 16 --micro-batch 1 --device cpu --save " + dir +
             " " + extra);
}

// [GPT-2 MoE]: a checkpoint of gpt2-tiny-moe (ep 1 saves) has no Hugging Face GPT-2 form:
// convert names it and --raw, which writes the module's own tensors, works.
TEST(CliInputs, ConvertRefusesAnMoEGpt2ButWritesItRaw) {
  const fs::path d = temp_dir("convert_moe");
  const fs::path ckpt = d / "ckpt";
  Ran r = run("train --config " + std::string(ZT_SOURCE_DIR) +
              "/configs/zero0.json --model gpt2-tiny-moe --steps 1 --seq 16 --micro-batch 1 --device cpu --save " +
              ckpt.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("convert " + ckpt.string() + " " + (d / "hf.safetensors").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "the checkpoint holds an MoE GPT-2")) << r.output;
  EXPECT_FALSE(fs::exists(d / "hf.safetensors"));
  r = run("convert --raw " + ckpt.string() + " " + (d / "raw.safetensors").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d / "raw.safetensors"));
  rm_rf(d);
}

TEST(CliInputs, ConvertRefusesAnOutputInsideTheCheckpoint) {
  const fs::path d = temp_dir("convert");
  const fs::path ckpt = d / "ckpt";
  Ran r = train_and_save(ckpt.string());
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream latest(ckpt / "latest");
  std::string tag;
  latest >> tag;
  ASSERT_FALSE(tag.empty());
  // Was: convert overwrote the checkpoint's own files and left it unloadable.
  for (const fs::path& out : {ckpt / "out.safetensors", ckpt / tag / "model.safetensors", ckpt / tag / ".." / "x",
                              ckpt}) {
    r = run("convert " + ckpt.string() + " " + out.string());
    EXPECT_EQ(r.code, 1) << out << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "is inside the checkpoint")) << r.output;
  }
  EXPECT_FALSE(fs::exists(ckpt / "out.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt / "config.json"));
  r = run("convert " + ckpt.string() + " " + d.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a directory")) << r.output;
  // The checkpoint is intact: a conversion outside it works.
  r = run("convert " + ckpt.string() + " " + (d / "hf" / "model.safetensors").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d / "hf" / "model.safetensors"));

  // --save inside the checkpoint that --load resumes from.
  r = train_and_save((ckpt / tag / "again").string(), "--load " + ckpt.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "that --load resumes from")) << r.output;
  EXPECT_FALSE(fs::exists(ckpt / tag / "again"));
  rm_rf(d);
}

TEST(CliInputs, UnusableSaveDirFailsBeforeTheFirstStep) {
  const fs::path d = temp_dir("save");
  const fs::path file = write(d / "a_file", "x");
  // Was: trained every step, then failed at the save.
  for (const std::string& save : {(file / "sub").string(), file.string(), std::string("/proc/zt_no_such_dir")}) {
    Ran r = train_and_save(save);
    EXPECT_EQ(r.code, 1) << save << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "--save " + save)) << r.output;
    EXPECT_FALSE(contains(r.output, "Loss:")) << "trained before checking --save:\n" << r.output;
  }
  // A directory that does not exist yet but can be created is fine, and is not created
  // by the check itself (the save creates it).
  Ran r = train_and_save((d / "new" / "deeper").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(d / "new" / "deeper" / "latest"));
  rm_rf(d);
}

// A Hugging Face style config ("auto" precision and lr) no longer trains in fp32 without a
// word: --bf16 / --fp16 / --lr fill the keys, a run without them says what it defaulted,
// and a flag that contradicts an explicit key is an error naming both.
TEST(CliInputs, AutoPrecisionAndLrAreFilledByFlagsOrNamed) {
  const fs::path d = temp_dir("auto");
  const fs::path cfg = write(d / "auto.json", R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})");
  const std::string base = "train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --micro-batch 2 --steps 1 --device cpu";
  Ran plain = run(base);
  EXPECT_EQ(plain.code, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "\"auto\" keys took the default: bf16.enabled = false, fp16.enabled = false, "
                                     "optimizer.params.lr -- training in fp32")) << plain.output;
  Ran bf16 = run(base + " --bf16 --lr 3e-4");
  EXPECT_EQ(bf16.code, 0) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "BFloat16")) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "lr 0.0003")) << bf16.output;
  EXPECT_FALSE(contains(bf16.output, "took the default")) << bf16.output;
  const fs::path expl = write(d / "explicit.json", R"({"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": false},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  const std::string eb = "train --config " + expl.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 1 --device cpu";
  Ran contra = run(eb + " --bf16");
  EXPECT_EQ(contra.code, 1) << contra.output;
  EXPECT_TRUE(contains(contra.output, "--bf16 but the config sets bf16.enabled = false")) << contra.output;
  Ran lr = run(eb + " --lr 2e-3");
  EXPECT_EQ(lr.code, 1) << lr.output;
  EXPECT_TRUE(contains(lr.output, "--lr 0.002 but the config sets optimizer.params.lr = 0.001")) << lr.output;
  Ran both = run(eb + " --fp16 --bf16");
  EXPECT_TRUE(contains(both.output, "--bf16 and --fp16 together")) << both.output;
  rm_rf(d);
}

// A periodic save that fails (a full disk, injected on rank 0 by ZT_CKPT_TEST_FAIL) is
// reported, leaves no partial files, and the next save point succeeds (asynchronous: even
// when the failed write is still in flight there); the run goes on to
// the end and exits with code 3. Synchronous and asynchronous saves.
TEST(CliInputs, FailedPeriodicSaveIsReportedCleanedAndRetried) {
  for (const std::string mode : {"", " --save-async"}) {
    const fs::path d = temp_dir("failsave");
    const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
    const fs::path save = d / "ckpt";
    // Asynchronous: the failing write takes 1.5 s, so it is still in flight at the step-4
    // save point, whose save must still happen (a slow failure used to take step 4 with it).
    ::setenv("ZT_CKPT_TEST_FAIL", mode.empty() ? "global_step2:0" : "global_step2:0:1500", 1);
    Ran r = run("train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 6 --device cpu --save " +
                save.string() + " --save-every 2" + mode);
    ::unsetenv("ZT_CKPT_TEST_FAIL");
    EXPECT_EQ(r.code, 3) << mode << r.output;
    EXPECT_TRUE(contains(r.output, "checkpoint save at step")) << mode << r.output;
    EXPECT_TRUE(contains(r.output, "No space left on device (injected")) << mode << r.output;
    EXPECT_TRUE(contains(r.output, "1 checkpoint save(s) failed during the run")) << mode << r.output;
    EXPECT_FALSE(fs::exists(save / ".global_step2.partial")) << mode;
    EXPECT_FALSE(fs::exists(save / "global_step2")) << mode;
    EXPECT_TRUE(fs::exists(save / "global_step4" / "manifest.json")) << mode;
    std::ifstream latest(save / "latest");
    std::string tag;
    latest >> tag;
    EXPECT_EQ(tag, "global_step6") << mode;
    rm_rf(d);
  }
}

// Two jobs never save into one directory: while another job holds the lock (here: this
// test process), `train --save DIR` stops before the first step naming the holder.
TEST(CliInputs, SaveDirInUseByAnotherJobIsNamed) {
  const fs::path d = temp_dir("lock");
  const fs::path save = d / "ckpt";
  auto lock = zt::ckpt::DirLock::acquire(save.string());
  const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"}})");
  Ran r = run("train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 1 --device cpu --save " +
              save.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is in use by another zerotrain job (host ")) << r.output;
  EXPECT_TRUE(contains(r.output, "pid " + std::to_string(::getpid()))) << r.output;
  EXPECT_FALSE(contains(r.output, "Loss:")) << "no step may run: " << r.output;
  lock.reset();
  Ran ok = run("train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 1 --device cpu --save " +
               save.string());
  EXPECT_EQ(ok.code, 0) << "the lock is released with its holder: " << ok.output;
  rm_rf(d);
}

// --set overrides are checked like the file; --version and `help CMD` work.
TEST(CliInputs, SetOverridesVersionAndHelp) {
  const fs::path d = temp_dir("set");
  const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  const std::string cc = "check-config " + cfg.string();
  Ran stage = run(cc + " --set zero_optimization.stage=3 --set optimizer.params.lr=2e-4 --set=bf16.enabled=true");
  EXPECT_EQ(stage.code, 0) << stage.output;
  EXPECT_TRUE(contains(stage.output, "\"stage\": 3")) << stage.output;
  EXPECT_TRUE(contains(stage.output, "\"lr\": 0.0002")) << stage.output;
  EXPECT_TRUE(contains(stage.output, "precision: bf16")) << stage.output;
  Ran word = run(cc + " --set zero_optimization.offload_optimizer.device=cpu --set zero_optimization.stage=2");
  EXPECT_EQ(word.code, 0) << word.output;
  EXPECT_TRUE(contains(word.output, "\"device\": \"cpu\"")) << word.output;
  Ran typo = run(cc + " --set zero_optimization.stgae=3");
  EXPECT_EQ(typo.code, 1) << typo.output;
  EXPECT_TRUE(contains(typo.output, "zero_optimization.stgae")) << typo.output;
  Ran no_eq = run(cc + " --set zero_optimization.stage");
  EXPECT_EQ(no_eq.code, 2) << no_eq.output;
  EXPECT_TRUE(contains(no_eq.output, "needs KEY.PATH=VALUE")) << no_eq.output;
  Ran through = run(cc + " --set zero_optimization.stage.x=1");
  EXPECT_EQ(through.code, 1) << through.output;
  EXPECT_TRUE(contains(through.output, "zero_optimization.stage is 1 in the config, not a section")) << through.output;
  Ran train = run("train --config " + cfg.string() +
                  " --model gpt2-tiny --layers 1 --seq 16 --steps 1 --device cpu --set zero_optimization.stage=2");
  EXPECT_EQ(train.code, 0) << train.output;
  EXPECT_TRUE(contains(train.output, "ZeRO stage 2")) << train.output;
  // The version is CMake's project version.
  std::ifstream cmake(std::string(ZT_SOURCE_DIR) + "/CMakeLists.txt");
  const std::string cm((std::istreambuf_iterator<char>(cmake)), std::istreambuf_iterator<char>());
  const auto at = cm.find("project(zerotrain VERSION ");
  ASSERT_NE(at, std::string::npos);
  const std::string want = cm.substr(at + 26, cm.find(' ', at + 26) - (at + 26));
  Ran version = run("--version");
  EXPECT_EQ(version.code, 0) << version.output;
  EXPECT_TRUE(contains(version.output, "zerotrain " + want + " (LibTorch 2.")) << want << ": " << version.output;
  Ran help = run("help check-config");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_TRUE(contains(help.output, "usage: zerotrain check-config")) << help.output;
  rm_rf(d);
}

// NVMe swap files never go into a checkpoint directory: a nvme_path inside --save or
// --load is named with its key before the first step.
TEST(CliInputs, SwapDirInsideTheCheckpointsIsNamed) {
  const fs::path d = temp_dir("swap");
  const fs::path save = d / "ckpt";
  const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                              (save / "swap").string() + R"("}}})");
  Ran r = run("train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 1 --device cpu --save " +
              save.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "zero_optimization.offload_optimizer.nvme_path '" + (save / "swap").string() +
                                     "' is inside --save '" + save.string() + "'"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "Loss:")) << "no step may run: " << r.output;
  EXPECT_FALSE(fs::exists(save / "swap")) << "nothing written there";
  rm_rf(d);
}

// A save location without room for one checkpoint stops the run before its first step:
// --save on a 1 MiB tmpfs (mounted in a private mount namespace, where the machine allows).
TEST(CliInputs, FullSaveLocationFailsBeforeTheFirstStep) {
  const fs::path d = temp_dir("full");
  const fs::path mnt = d / "small";
  fs::create_directories(mnt);
  Ran probe = zt::test_support::run_shell("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs " + mnt.string() +
                                          " && df -k " + mnt.string() + "'");
  if (probe.code != 0) {
    rm_rf(d);
    GTEST_SKIP() << "cannot mount a small tmpfs here (unshare -m + mount): " << probe.output;
  }
  const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW"}})");
  Ran r = zt::test_support::run_shell(
      "unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs " + mnt.string() + " && timeout -k 5 120 " ZT_BINARY_DIR
      "/zerotrain train --config " + cfg.string() + " --model gpt2-tiny --layers 1 --seq 16 --steps 2 --device cpu "
      "--save " + (mnt / "ckpt").string() + "'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "MiB free but one checkpoint needs about")) << r.output;
  EXPECT_TRUE(contains(r.output, "--save " + (mnt / "ckpt").string())) << r.output;
  EXPECT_FALSE(contains(r.output, "Loss:")) << "no step may run: " << r.output;
  rm_rf(d);
}

// [CLI Flags]: every subcommand reads `--flag=value` as `--flag value`.
TEST(CliInputs, EveryCommandAcceptsFlagEqualsValue) {
  const fs::path d = temp_dir("equals");
  const fs::path cfg = write(d / "c.json", R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  const std::string fixture = std::string(ZT_SOURCE_DIR) + "/tests/fixtures/bpe/";
  const std::string none = (d / "none").string();
  struct Case {
    std::string args;
    int code;
    std::string want;  // in the output: proof that the value arrived
  };
  const Case cases[] = {
      {"check-config " + cfg.string() + " --world=4 --set=zero_optimization.stage=2", 0, "\"train_batch_size\": 8"},
      {"estimate --config=" + cfg.string() + " --model=gpt2-tiny --gpus=4 --seq=32 --json", 0, "\"gpus\":4"},
      {"train --config=" + cfg.string() + " --model=gpt2-tiny --layers=1 --seq=16 --steps=1 --device=cpu --seed=7", 0,
       "ZeRO stage 1"},
      {"tokenize --tokenizer=" + fixture + "tokenizer.json --out=" + (d / "shards").string() +
           " --name=eq --threads=1 --shard-tokens=1e6 " + fixture + "test.txt",
       0, "eq_train_000000.bin"},
      // Flags parsed, then the missing input named (exit 1, not a usage error).
      {"convert " + none + " " + (d / "out.safetensors").string() + " --dtype=bf16 --tag=global_step1", 1,
       "checkpoint 'global_step1' in '" + none + "' has no manifest"},
      {"merge --base=" + none + " --adapter=" + none + " --out=" + (d / "merged").string() + " --dtype=bf16", 1,
       "--base '" + none + "' is not a Hugging Face model directory"},
      {"generate --model-dir=" + none + " --prompt-ids=1,2 --max-new-tokens=2 --temperature=0.5 --top-k=3", 1,
       "--model-dir " + none + " has no config.json"},
      {"bench --report=" + none + " --steps=3", 1, "--report " + none + ": no " + none + "/results.json"},
      {"bench adam --params=1e5 --threads=1 --iters=1 --kernel=scalar --grad-dtype=fp32 --triad-elems=1e5", 0,
       "100000 params"},
      {"launch --nproc=2 -- true", 0, ""},
  };
  for (const auto& c : cases) {
    Ran r = run(c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.want)) << c.args << "\nwant: " << c.want << "\n" << r.output;
  }
  rm_rf(d);
}

// [CLI Flags]: a bad number, an out-of-range value, an unknown flag and a missing value,
// in every subcommand, end with one line naming the command, the flag and the value, and
// exit code 2.
TEST(CliInputs, EveryCommandReportsUsageErrorsInOneLineWithCode2) {
  const std::string cfg = std::string(ZT_SOURCE_DIR) + "/configs/zero0.json";
  struct Case {
    std::string args;
    std::vector<std::string> want;  // each in the message
  };
  const Case cases[] = {
      {"train --config " + cfg + " --steps=abc", {"zerotrain train: --steps: 'abc' is not a non-negative integer"}},
      {"train --config " + cfg + " --steps 0", {"zerotrain train: --steps: '0'", "at least 1"}},
      {"train --config " + cfg + " --lr=-1e-3", {"zerotrain train: --lr: '-1e-3'", "at least 0"}},
      {"train --config " + cfg + " --bogus=3", {"zerotrain train: unknown option '--bogus=3'"}},
      {"train --config " + cfg + " --steps", {"zerotrain train: --steps: missing value"}},
      {"train --config " + cfg + " --save --steps 3", {"zerotrain train: --save: missing value", "--steps"}},
      {"train --config " + cfg + " --device=tpu", {"zerotrain train: --device: 'tpu' is not one of cpu, cuda"}},
      {"train --config " + cfg + " --bf16=yes", {"zerotrain train: --bf16: takes no value, got 'yes'"}},
      {"train --config " + cfg + " extra", {"zerotrain train: unexpected argument 'extra'"}},
      {"train --steps 2", {"zerotrain train: --config CONFIG.json is required"}},
      {"check-config " + cfg + " --world=x", {"zerotrain check-config: --world: 'x' is not a non-negative integer"}},
      {"check-config " + cfg + " -n 0", {"zerotrain check-config: --world: '0'", "between 1 and"}},
      {"check-config " + cfg + " --bogus", {"zerotrain check-config: unknown option '--bogus'"}},
      {"check-config " + cfg + " --world", {"zerotrain check-config: --world: missing value"}},
      {"check-config " + cfg + " " + cfg, {"zerotrain check-config: needs one CONFIG.json, got '" + cfg + "', '"}},
      {"check-config", {"zerotrain check-config: needs one CONFIG.json, got none"}},
      {"estimate --config " + cfg + " --gpus=two", {"zerotrain estimate: --gpus: 'two' is not a non-negative integer"}},
      {"estimate --config " + cfg + " --gpu-mem=-4", {"zerotrain estimate: --gpu-mem: '-4'", "at least 0"}},
      {"estimate --config " + cfg + " --bogus", {"zerotrain estimate: unknown option '--bogus'"}},
      {"estimate --config " + cfg + " --seq", {"zerotrain estimate: --seq: missing value"}},
      {"convert a b --max-shard-gb=big", {"zerotrain convert: --max-shard-gb: 'big' is not a number"}},
      {"convert a b --max-shard-gb=0", {"zerotrain convert: --max-shard-gb: '0'", "above 0"}},
      {"convert a b --dtype=int8", {"zerotrain convert: --dtype: 'int8' is not one of fp32"}},
      {"convert a b --bogus", {"zerotrain convert: unknown option '--bogus'"}},
      {"convert a b --tag", {"zerotrain convert: --tag: missing value"}},
      {"convert a", {"zerotrain convert: needs CKPT_DIR and OUT, got 'a'"}},
      {"merge --base a --adapter b --out c --dtype=int8", {"zerotrain merge: --dtype: 'int8' is not one of fp32"}},
      {"merge --base a --adapter b --out c --bogus", {"zerotrain merge: unknown option '--bogus'"}},
      {"merge --base a --adapter b --out", {"zerotrain merge: --out: missing value"}},
      {"generate --model-dir a --prompt-ids 1 --top-k=x", {"zerotrain generate: --top-k: 'x' is not a non-negative integer"}},
      {"generate --model-dir a --prompt-ids 1 --temperature=-1", {"zerotrain generate: --temperature: '-1'", "at least 0"}},
      {"generate --model-dir a --prompt-ids 1 --bogus", {"zerotrain generate: unknown option '--bogus'"}},
      {"generate --model-dir a --prompt-ids 1 --seed", {"zerotrain generate: --seed: missing value"}},
      {"tokenize --tokenizer t --out o --threads=x in", {"zerotrain tokenize: --threads: 'x' is not a non-negative integer"}},
      {"tokenize --tokenizer t --out o --val-fraction=1 in", {"zerotrain tokenize: --val-fraction: '1'", "in [0, 1)"}},
      {"tokenize --tokenizer t --out o --bogus in", {"zerotrain tokenize: unknown option '--bogus'"}},
      {"tokenize --tokenizer t in --out", {"zerotrain tokenize: --out: missing value"}},
      {"bench --steps=x", {"zerotrain bench: --steps: 'x' is not a non-negative integer"}},
      {"bench --ranks=0", {"zerotrain bench: --ranks: '0'", "at least 1"}},
      {"bench --bogus", {"zerotrain bench: unknown option '--bogus'"}},
      {"bench --timeout", {"zerotrain bench: --timeout: missing value"}},
      {"bench adam --iters=x", {"zerotrain bench adam: --iters: 'x' is not a non-negative integer"}},
      {"bench adam --threads=1,0", {"zerotrain bench adam: --threads: '0'", "at least 1"}},
      {"bench adam --kernel=sse", {"zerotrain bench adam: --kernel: 'sse' is not one of all, scalar, avx2, avx512"}},
      {"bench adam --bogus", {"zerotrain bench adam: unknown option '--bogus'"}},
      {"bench adam --params", {"zerotrain bench adam: --params: missing value"}},
      {"launch -n x -- true", {"zerotrain launch: -n: 'x' is not a non-negative integer", "usage: zerotrain launch -n N"}},
      {"launch --nproc=0 -- true", {"zerotrain launch: -n: '0'", "between 1 and"}},
      {"launch --bogus -n 2 -- true", {"zerotrain launch: unknown option '--bogus'"}},
      {"launch -n", {"zerotrain launch: -n: missing value"}},
  };
  for (const auto& c : cases) {
    Ran r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    for (const auto& w : c.want) EXPECT_TRUE(contains(r.output, w)) << c.args << "\nwant: " << w << "\n" << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << c.args << "\n" << r.output;
  }
}

// What follows `launch -n N --` (or the first argument that is not a flag) reaches the
// program untouched, flags and `--` included.
TEST(CliInputs, LaunchPassesTheProgramsArgumentsThrough) {
  Ran r = run("launch -n 1 -- sh -c 'echo \"args:$*\"' sh --steps=5 -- --help -n 3");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] args:--steps=5 -- --help -n 3\n")) << r.output;
  r = run("launch -n1 sh -c 'echo \"args:$*\"' sh --bogus");  // no `--`: the program starts at `sh`
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank 0] args:--bogus\n")) << r.output;
}

// -h/--help (or `zerotrain help CMD`) prints the command's help and exits 0, even with a
// bad value beside it.
TEST(CliInputs, EveryCommandHasHelp) {
  for (const std::string cmd :
       {"train", "check-config", "estimate", "convert", "merge", "generate", "tokenize", "bench", "bench adam", "launch"}) {
    Ran r = run(cmd + " --help");
    EXPECT_EQ(r.code, 0) << cmd << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "usage: zerotrain " + cmd)) << cmd << "\n" << r.output;
    Ran h = run(cmd + " --steps=abc -h");
    EXPECT_EQ(h.code, 0) << cmd << "\n" << h.output;
    EXPECT_TRUE(contains(h.output, "usage: zerotrain " + cmd)) << cmd << "\n" << h.output;
  }
  Ran r = run("help launch");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "-n N, --nproc N")) << r.output;
  r = run("train --config --help");  // help, not a config file named --help
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "usage: zerotrain train")) << r.output;
}

// Checks across flags stay errors of the run (exit 1) after the flags parse.
TEST(CliInputs, CrossFlagChecksAreNamed) {
  const std::string cfg = std::string(ZT_SOURCE_DIR) + "/configs/zero0.json";
  Ran r = run("train --config=" + cfg + " --save-every=2");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--save-every needs --save DIR")) << r.output;
  r = run("train --config=" + cfg + " --qlora");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--qlora needs --lora SPEC")) << r.output;
}

}  // namespace

}  // namespace zt_test_cli_inputs

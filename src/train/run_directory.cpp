// What an output directory holds, and whether a run may start or continue there.
#include "hpctrain/train/run_directory.hpp"

#include <chrono>
#include <cstdio>
#include <random>

#include "hpctrain/core/error.hpp"
#include "hpctrain/io/checkpoint.hpp"
#include "hpctrain/io/hdf5.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

namespace {

// The run id and the number of training rows of a metrics.h5, when it can be read.
void read_metrics_identity(const fs::path& file, RunDirectory& directory) {
  try {
    const auto lock = lock_hdf5();
    H5Handle metrics = open_file_read_only(file.string(), "metrics file");
    if (attribute_exists(metrics.get(), "run_id")) directory.run_id = read_string_attribute(metrics.get(), "run_id");
    if (link_exists(metrics.get(), "/train/step")) {
      H5Handle steps = open_dataset(metrics.get(), "/train/step");
      H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(steps.get())));
      directory.metrics_rows = HPCTRAIN_H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
    }
  } catch (const Error&) {
    // A damaged metrics.h5 still marks a run; its identity is then taken from the checkpoints.
  }
}

bool inside(const fs::path& file, const fs::path& directory) {
  std::error_code error;
  const fs::path parent = fs::weakly_canonical(fs::absolute(file, error).parent_path(), error);
  return !error && parent == fs::weakly_canonical(fs::absolute(directory, error), error);
}

}  // namespace

std::string RunDirectory::contents_text() const {
  std::string text;
  for (const std::string& item : contents) text += (text.empty() ? "" : ", ") + item;
  return text;
}

RunDirectory inspect_run_directory(const fs::path& path) {
  RunDirectory directory;
  directory.path = path;
  std::error_code error;
  if (!fs::is_directory(path, error)) return directory;
  for (const char* name : {"metrics.h5", "config.toml", "train.log", "status"})
    if (fs::exists(path / name, error)) directory.contents.emplace_back(name);
  if (fs::exists(path / "metrics.h5", error)) read_metrics_identity(path / "metrics.h5", directory);
  directory.checkpoints = checkpoint_files(path / "checkpoints");
  if (!directory.checkpoints.empty()) {
    directory.contents.push_back("checkpoints/ (" + std::to_string(directory.checkpoints.size()) + " file" +
                                 (directory.checkpoints.size() > 1 ? "s" : "") + ")");
    for (const fs::path& checkpoint : directory.checkpoints) {
      if (!directory.run_id.empty()) break;
      directory.run_id = checkpoint_run_id(checkpoint.string());
    }
  }
  return directory;
}

std::string new_run_id() {
  std::random_device device;
  const auto clock = static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  const std::uint64_t value =
      ((static_cast<std::uint64_t>(device()) << 32) ^ device()) ^ (clock * 0x9e3779b97f4a7c15ull);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

StartPlan plan_start(const RunDirectory& output, const std::string& resume, bool force, const std::string& where) {
  StartPlan plan;
  std::string directory = "'";  // (built in steps: GCC 12's -Wrestrict misfires on "'" + string + "'")
  directory.append(output.path.string()).append("'");
  if (resume.empty()) {
    HPCTRAIN_VERIFY(
        !output.holds_run(), InputError,
        where << ": output directory " << directory << " already holds a run (" << output.contents_text() << ")",
        "continue it with --resume auto, choose another directory with --output DIR, or remove it");
    plan.run_id = new_run_id();
    return plan;
  }
  if (resume == "auto") {
    if (!output.checkpoints.empty()) {
      plan.candidates = output.checkpoints;
      plan.run_id = output.run_id.empty() ? new_run_id() : output.run_id;
      return plan;
    }
    HPCTRAIN_VERIFY(!output.holds_run(), InputError,
                    "--resume auto: output directory " << directory << " holds a run (" << output.contents_text()
                                                       << ") but no checkpoint to continue from",
                    "starting fresh would replace it: choose another directory with --output DIR, or remove it to "
                    "start over");
    plan.run_id = new_run_id();
    plan.note = "resume auto: no run in " + directory + "; starting fresh";
    return plan;
  }
  // A checkpoint the user named: it must belong to the run in the output directory, if there is one.
  const fs::path checkpoint = resolve_checkpoint(resume);
  plan.candidates = {checkpoint};
  const std::string checkpoint_id = checkpoint_run_id(checkpoint.string());
  if (!output.holds_run()) {  // a new run that starts from another run's state
    plan.run_id = new_run_id();
    return plan;
  }
  const bool same_run =
      output.run_id.empty() ? inside(checkpoint, output.path / "checkpoints") : checkpoint_id == output.run_id;
  HPCTRAIN_VERIFY(same_run || force, InputError,
                  "--resume " << resume << ": output directory " << directory << " holds another run ("
                              << output.contents_text() << "); continuing there would replace its results",
                  "resume into a new directory with --output DIR, or add --force to continue this checkpoint in "
                  "place of that run (its metrics after the checkpoint's step and its newer checkpoints are lost)");
  plan.run_id = output.run_id.empty() ? new_run_id() : output.run_id;
  return plan;
}

}  // namespace hpctrain

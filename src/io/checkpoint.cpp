// Checkpoint directories (commit, `latest`, rotation), naming a checkpoint, and checking one on its own.
#include "hpctrain/io/checkpoint.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>

#include "hpctrain/core/error.hpp"
#include "hpctrain/core/files.hpp"
#include "hpctrain/io/checkpoint_phases.hpp"
#include "hpctrain/io/hdf5.hpp"
#include "hpctrain/io/parallel_file.hpp"

namespace hpctrain {

namespace fs = std::filesystem;

namespace {

std::string step_file_name(std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld.h5", static_cast<long long>(step));
  return name;
}

// The step of a checkpoint file name, or -1.
std::int64_t step_of(const fs::path& path) {
  static const std::regex pattern(R"(step-(\d+)\.h5)");
  std::smatch match;
  const std::string name = path.filename().string();
  return std::regex_match(name, match, pattern) ? std::stoll(match[1]) : -1;
}

// A checkpoint opened by one process, its format checked and its root attribute `attribute` there.
H5Handle open_checkpoint_serially(const std::string& path, const std::string& attribute) {
  H5Handle file = open_file_read_only(path, "checkpoint");
  HPCTRAIN_VERIFY(attribute_exists(file.get(), "format") &&
                      read_string_attribute(file.get(), "format") == checkpoint_format &&
                      attribute_exists(file.get(), attribute),
                  InputError, "'" << path << "' is not an hpctrain checkpoint (" << checkpoint_format << ")",
                  "pass a file from a run's checkpoints/ directory");
  return file;
}

std::uint32_t stored_crc(hid_t dataset) {
  if (H5Aexists(dataset, "crc32") <= 0) return 0;
  H5Handle attribute(HPCTRAIN_H5_CHECK(H5Aopen(dataset, "crc32", H5P_DEFAULT)));
  std::uint32_t crc = 0;
  HPCTRAIN_H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_UINT32, &crc));
  return crc;
}

}  // namespace

std::string pointed_name(const fs::path& directory, const std::string& pointer) {
  std::ifstream file(directory / pointer);
  std::string name;
  return file >> name ? name : std::string();
}

CheckpointDirectory::CheckpointDirectory(fs::path directory, const MpiEnvironment& mpi, std::int64_t keep,
                                         std::string run_id)
    : directory_(std::move(directory)), mpi_(mpi), keep_(keep), run_id_(std::move(run_id)) {}

std::vector<fs::path> checkpoint_files(const fs::path& directory) {
  std::vector<fs::path> files;
  std::error_code error;
  if (!fs::is_directory(directory, error)) return files;
  std::vector<std::pair<std::int64_t, fs::path>> by_step;
  for (const auto& item : fs::directory_iterator(directory, error))
    if (const std::int64_t step = step_of(item.path()); step >= 0) by_step.emplace_back(step, item.path());
  std::sort(by_step.begin(), by_step.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const std::string named = pointed_name(directory, "latest");
  if (!named.empty() && fs::exists(directory / named)) files.push_back(directory / named);
  for (auto& [step, path] : by_step)
    if (files.empty() || path != files.front()) files.push_back(path);
  return files;
}

std::vector<fs::path> CheckpointDirectory::candidates() const { return checkpoint_files(directory_); }

std::size_t CheckpointDirectory::discard_after(std::int64_t step) const {
  std::size_t removed = 0;
  std::error_code error;
  const std::string best = pointed_name(directory_, "best");
  for (const fs::path& file : candidates())
    if (step_of(file) > step && fs::remove(file, error)) {
      ++removed;
      if (file.filename() == best) fs::remove(directory_ / "best", error);  // it named an abandoned checkpoint
    }
  return removed;
}

std::string CheckpointDirectory::write(std::int64_t step, std::uintmax_t expected_bytes,
                                       const std::function<void(CheckpointFileWriter&)>& fill, bool best) {
  const fs::path final_path = directory_ / step_file_name(step);
  run_on_root(mpi_, [&] {
    std::error_code error;
    fs::create_directories(directory_, error);
    if (error)
      throw Error("cannot create checkpoint directory '" + directory_.string() + "': " + error.message(),
                  ErrorScope::this_rank, "check the output directory's file system (space, permissions)");
    for (const auto& item : fs::directory_iterator(directory_, error))  // leftovers of an interrupted write
      if (item.path().extension() == ".partial") fs::remove(item.path(), error);
  });

  CollectiveWrite request{
      final_path,
      "checkpoint",
      expected_bytes,
      "the previous checkpoint is intact",
      "make room in " + directory_.string() + " (free space, quota, file-size limit), then continue with --resume auto",
      {}};
  // Rank 0 commits it (a reader never sees a partial file under a final name) with `latest` (and `best`), renamed
  // after it: one flush of the directory for all.
  const std::string pointer_text = final_path.filename().string() + "\n";
  request.companions.emplace_back(directory_ / "latest", pointer_text);
  if (best) request.companions.emplace_back(directory_ / "best", pointer_text);
  write_file_collectively(request, mpi_, [&](hid_t file, hid_t transfer) {
    CheckpointFileWriter writer(file, transfer, mpi_);
    fill(writer);
    const CheckpointPhaseScope phase(CheckpointPhase::metadata);
    writer.write_string_attribute("/", "format", checkpoint_format);
    writer.write_string_attribute("/", "hpctrain_version", HPCTRAIN_VERSION);
    writer.write_integer_attribute("/", "world_size", mpi_.size());
    if (!run_id_.empty()) writer.write_string_attribute("/", "run_id", run_id_);
  });
  run_on_root(mpi_, [&] {
    const CheckpointPhaseScope phase(CheckpointPhase::rotate);
    // Only now remove old checkpoints beyond `keep`; the one `best` names stays.
    if (keep_ > 0) {
      const auto files = candidates();
      const std::string kept = pointed_name(directory_, "best");
      std::error_code error;
      for (std::size_t i = static_cast<std::size_t>(keep_); i < files.size(); ++i)
        if (files[i].filename() != kept) fs::remove(files[i], error);
    }
  });
  return final_path.string();
}

std::string checkpoint_run_id(const std::string& path) {
  try {
    const auto lock = lock_hdf5();
    H5Handle file = open_file_read_only(path, "checkpoint");
    return attribute_exists(file.get(), "run_id") ? read_string_attribute(file.get(), "run_id") : std::string();
  } catch (const Error&) {
    return {};
  }
}

std::string checkpoint_string_attribute(const std::string& path, const std::string& name) {
  const auto lock = lock_hdf5();
  H5Handle file = open_checkpoint_serially(path, name);
  return read_string_attribute(file.get(), name);
}

std::int64_t checkpoint_integer_attribute(const std::string& path, const std::string& name) {
  const auto lock = lock_hdf5();
  H5Handle file = open_checkpoint_serially(path, name);
  return static_cast<std::int64_t>(read_number_attribute(file.get(), name));
}

fs::path resolve_checkpoint(const std::string& argument) {
  const fs::path given(argument);
  std::error_code error;
  fs::path directory;
  if (fs::is_directory(given / "checkpoints", error))
    directory = given / "checkpoints";  // a run directory
  else if (fs::is_directory(given, error))
    directory = given;  // a run's checkpoints/ directory
  else if (given.filename() == "latest" || given.filename() == "best")
    directory = given.parent_path();
  else
    return given;
  const std::string pointer = given.filename() == "best" ? "best" : "latest";
  const std::string name = pointed_name(directory, pointer);
  if (pointer == "latest" && !name.empty() && !fs::exists(directory / name, error)) {
    // A crash during a commit may keep the new `latest` without the checkpoint it names: the newest one there is.
    const auto files = checkpoint_files(directory);
    if (!files.empty()) return files.front();
  }
  if (pointer == "best")
    HPCTRAIN_VERIFY(!name.empty(), InputError,
                    "'" << argument << "': the run has no best checkpoint (no " << (directory / "best").string() << ")",
                    "a run keeps checkpoints/best when its deck sets checkpoint.best_metric; pass " +
                        (directory / "latest").string() + " or a checkpoint file instead");
  HPCTRAIN_VERIFY(
      !name.empty(), InputError,
      "'" << argument << "' is a directory without a checkpoint (no " << (directory / "latest").string() << ")",
      "pass a checkpoint file (step-NNNNNNNN.h5) or a run directory that holds checkpoints");
  return directory / name;
}

std::string verify_checkpoint(const std::string& path) {
  try {
    const auto lock = lock_hdf5();
    H5Handle file = open_file_read_only(path, "checkpoint");
    if (!attribute_exists(file.get(), "format") || read_string_attribute(file.get(), "format") != checkpoint_format)
      return "not an hpctrain checkpoint";
    std::size_t checked = 0;
    for (const std::string& name : list_datasets(file.get())) {
      H5Handle dataset = open_dataset(file.get(), name);
      H5Handle space(HPCTRAIN_H5_CHECK(H5Dget_space(dataset.get())));
      H5Handle type(HPCTRAIN_H5_CHECK(H5Dget_type(dataset.get())));
      const auto elements = static_cast<std::size_t>(H5Sget_simple_extent_npoints(space.get()));
      const std::size_t size = H5Tget_size(type.get());
      std::vector<unsigned char> bytes(elements * size);
      H5Handle native(HPCTRAIN_H5_CHECK(H5Tget_native_type(type.get(), H5T_DIR_DEFAULT)));
      HPCTRAIN_H5_CHECK(H5Dread(dataset.get(), native.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()));
      if (H5Aexists(dataset.get(), "crc32") <= 0)
        return "checkpoint '" + path + "' is damaged: dataset " + name + " has no crc32 attribute";
      if (stored_crc(dataset.get()) != crc32(bytes.data(), bytes.size()))
        return "dataset " + name + " fails its checksum";
      ++checked;
    }
    if (checked == 0) return "no datasets";
    return {};
  } catch (const Error& error) {
    return error.what();
  }
}

}  // namespace hpctrain

// Output files that all ranks write together through parallel HDF5 (checkpoints, predictions): created through MPI-IO
// under a temporary name, committed by rank 0 once every rank has written its part, and removed again when any rank
// fails, with one message that says why (a full file system, a quota, the file-size limit) instead of HDF5's.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

struct CollectiveWrite {
  std::filesystem::path destination;
  std::string description;            // names the file in messages: "checkpoint", "predictions file"
  std::uintmax_t expected_bytes = 0;  // about how large the file becomes, for "... needs about 1.6 MiB"
  std::string consequence;            // said after a failure: "the previous checkpoint is intact"
  std::string hint;                   // what to do after a failure
  // Small text files {path, text} committed with the file by the same directory flush (commit_file's companions):
  // the pointer files that name it.
  std::vector<std::pair<std::filesystem::path, std::string>> companions;
};

// Writes request.destination: the file is created collectively under partial_path(destination) and every rank calls
// write(file, transfer) (its HDF5 calls collective, in the same order on every rank; `transfer` does collective I/O),
// in steps of write_step_collectively. When any rank failed, rank 0 removes the partial file and every rank throws
// the same Error, printed once, naming the file and the cause (write_failure_reason). Otherwise rank 0 commits the
// file (commit_file: fsync, rename, fsync the directory) with request.companions. Collective.
void write_file_collectively(const CollectiveWrite& request, const MpiEnvironment& mpi,
                             const std::function<void(hid_t file, hid_t transfer)>& write);

// One step of write_file_collectively's `write` (a dataset written, attributes added): runs step() and agrees on its
// outcome, so that no rank goes on to the next collective call while another has left this one. A collective write
// that fails may fail on some ranks only (the MPI-IO aggregators); when step() failed anywhere, every rank throws, and
// write_file_collectively reports it. A rank whose step failed while another is stuck in a collective call it left
// waits a minute (agree_on_failure), then ends the job alone instead of hanging.
void write_step_collectively(const MpiEnvironment& mpi, const std::function<void()>& step);

}  // namespace hpctrain

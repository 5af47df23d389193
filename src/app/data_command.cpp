// `hpctrain data ...`: the data tools, one file each (data_*_command.cpp). generate writes a synthetic dataset,
// inspect describes a data file (with per-channel statistics), convert writes one from .npy or CSV, split carves out a
// validation set, plan prints which samples each rank reads at each step, bench measures how fast a deck's training
// data can be read.
//
// Every rank parses the command line (so a bad option is reported once, by rank 0, like every error all ranks see);
// only rank 0 touches files and prints, and the other ranks wait for it at a barrier (bench alone runs on every rank).
#include <cstdio>

#include "data_tools.hpp"
#include "hpctrain/app/commands.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/core/suggestions.hpp"
#include "hpctrain/dist/mpi_environment.hpp"

namespace hpctrain {

namespace {

const char* const data_usage =
    "usage: hpctrain data <sub-command> ...\n"
    "\n"
    "sub-commands:\n"
    "  generate KIND --samples N --output FILE.h5 [options]   write a synthetic dataset (blobs, spirals, regression,\n"
    "                                                         images, volumes)\n"
    "  inspect FILE.h5                                        describe a file: datasets, labels, per-channel "
    "statistics\n"
    "  convert --features X.npy --labels Y.npy --output F.h5  convert NumPy arrays (or --csv FILE.csv) to HDF5\n"
    "  split FILE.h5 --validation-fraction F ...              split a file into training and validation files\n"
    "  plan DECK.toml --ranks R [--epoch E]                   print the samples each rank reads at each step\n"
    "  bench DECK.toml [--steps N]                            measure how fast every rank reads its training batches\n"
    "\n"
    "Run 'hpctrain data <sub-command> --help' for details.\n";

}  // namespace

int data_command(const Arguments& args, const MpiEnvironment& mpi) {
  const std::string hint =
      "the sub-commands are generate, inspect, convert, split, plan and bench; see 'hpctrain data --help'";
  HPCTRAIN_VERIFY(!args.empty(), InputError, "hpctrain data: no sub-command given", hint);
  const std::string& sub_command = args[0];
  if (sub_command == "--help" || sub_command == "-h" || sub_command == "help") {
    if (mpi.is_root()) std::fputs(data_usage, stdout);
    return 0;
  }
  const Arguments rest(args.begin() + 1, args.end());
  if (sub_command == "generate") return data_generate_command(rest, mpi);
  if (sub_command == "inspect") return data_inspect_command(rest, mpi);
  if (sub_command == "convert") return data_convert_command(rest, mpi);
  if (sub_command == "split") return data_split_command(rest, mpi);
  if (sub_command == "plan") return data_plan_command(rest, mpi);
  if (sub_command == "bench") return data_bench_command(rest, mpi);
  std::vector<Suggestion> names;
  for (const char* name : {"generate", "inspect", "convert", "split", "plan", "bench"}) names.push_back({name, name});
  const auto suggestion = closest_name(sub_command, names);
  throw InputError("hpctrain data: unknown sub-command '" + sub_command + "'",
                   suggestion ? "did you mean '" + *suggestion + "'? " + hint : hint);
}

}  // namespace hpctrain

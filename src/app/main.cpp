// hpctrain's entry point: MPI start-up, sub-command dispatch, and the one place where errors are caught and reported.
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/signals.hpp"

namespace {

const char* const usage_text =
    "usage: hpctrain <command> [options]\n"
    "\n"
    "commands:\n"
    "  train DECK.toml [--set section.key=value]... [--output DIR]   train a model\n"
    "  data generate KIND ... --output FILE.h5                       write a synthetic dataset\n"
    "  data inspect FILE.h5                                          describe a dataset file, with channel statistics\n"
    "  data convert --features X.npy --labels Y.npy --output F.h5    convert NumPy arrays (or --csv FILE.csv) to HDF5\n"
    "  data split FILE.h5 --validation-fraction F ...                carve a validation set out of a data file\n"
    "  data plan DECK.toml --ranks R [--epoch E]                     print the samples each rank reads at each step\n"
    "  data bench DECK.toml                                          measure how fast the ranks read their batches\n"
    "  predict CHECKPOINT.h5 --data FILE.h5 [--output FILE.h5]       apply a trained model, write predictions\n"
    "  evaluate CHECKPOINT.h5 --data FILE.h5                         the model's loss and metrics on a dataset\n"
    "  generate CHECKPOINT.h5 --prompt TEXT --max-new-tokens N       continue a prompt with a language model\n"
    "  checkpoint verify FILE.h5|RUN_DIR                             check a checkpoint's checksums\n"
    "  report RUN_DIR... [--plot OUT.png] [--csv [FILE]]             summarise runs; plot or export their curves (no "
    "MPI)\n"
    "  --version                                                     version and build facts\n"
    "\n"
    "Run 'hpctrain <command> --help' for a command's options. Launch with mpiexec/srun for several ranks.\n";

}  // namespace

int main(int argc, char** argv) {
  // `report` is a serial Python tool: it runs before (and without) MPI, so it also works on a login node.
  if (argc > 1 && std::string(argv[1]) == "report") {
    try {
      return hpctrain::report_command(hpctrain::Arguments(argv + 2, argv + argc));
    } catch (const hpctrain::Error& error) {
      std::fprintf(stderr, "hpctrain: error: %s\n", error.what());
      if (!error.hint().empty()) std::fprintf(stderr, "  hint: %s\n", error.hint().c_str());
      return error.exit_code();
    }
  }
  // A checkpoint signal that arrives while MPI and the run start up is recorded, not fatal (see train/signals.hpp).
  // A failure here is reported like any other, once MPI is up.
  std::exception_ptr early_failure;
  if (argc > 1 && std::string(argv[1]) == "train") {
    try {
      hpctrain::record_checkpoint_signals_early(hpctrain::CheckpointSection{}.on_signal);
    } catch (const hpctrain::Error&) {
      early_failure = std::current_exception();
    }
  }
  hpctrain::MpiEnvironment mpi(&argc, &argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (early_failure) std::rethrow_exception(early_failure);
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      if (mpi.is_root()) std::fputs(usage_text, args.empty() ? stderr : stdout);
      return args.empty() ? hpctrain::exit_input_error : 0;
    }
    const std::string& command = args[0];
    const hpctrain::Arguments rest(args.begin() + 1, args.end());
    if (command == "--version" || command == "version") return hpctrain::version_command(mpi);
    if (command == "train") return hpctrain::train_command(rest, mpi);
    if (command == "data") return hpctrain::data_command(rest, mpi);
    if (command == "predict") return hpctrain::predict_command(rest, mpi);
    if (command == "evaluate") return hpctrain::evaluate_command(rest, mpi);
    if (command == "generate") return hpctrain::generate_command(rest, mpi);
    if (command == "checkpoint") return hpctrain::checkpoint_command(rest, mpi);
    throw hpctrain::InputError("unknown command '" + command + "'", "run 'hpctrain --help' for the list of commands");
  } catch (const hpctrain::Error& error) {
    mpi.abort_on(error);
  } catch (const std::bad_alloc&) {
    mpi.abort_on(hpctrain::Error("out of memory: a buffer could not be allocated", hpctrain::ErrorScope::this_rank,
                                 "the model, the batch or the data do not fit this node's memory: use a smaller "
                                 "model or data.batch_size, or more ranks",
                                 hpctrain::exit_runtime_error));
  } catch (const std::exception& error) {
    mpi.abort_on(std::string("unexpected failure: ") + error.what(), hpctrain::exit_runtime_error);
  }
}

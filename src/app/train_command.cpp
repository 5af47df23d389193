// `hpctrain train DECK.toml [--set section.key=value]... [--output DIR]`
#include <cstdio>
#include <exception>

#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/run_status.hpp"
#include "hpctrain/train/trainer.hpp"

namespace hpctrain {

namespace {
const char* const train_usage =
    "usage: hpctrain train DECK.toml [--set section.key=value]... [--output DIR] [--resume auto|FILE] [--profile]\n"
    "                      [--status-file FILE]\n"
    "\n"
    "Train the model described by the input deck DECK.toml (see docs/input-reference.md).\n"
    "\n"
    "options:\n"
    "  --set section.key=value   override a deck key (repeatable), e.g. --set precision.mode=bf16\n"
    "  --output DIR              write results to DIR (overrides run.output)\n"
    "  --profile                 print the time per phase of the training step at the end\n"
    "  --resume auto|CHECKPOINT  continue from OUTPUT/checkpoints/latest (auto: start fresh only when OUTPUT holds\n"
    "                            no run) or from a checkpoint (a file, a run directory or its checkpoints/latest)\n"
    "  --force                   with --resume CHECKPOINT: continue it even where OUTPUT holds another run\n"
    "  --status-file FILE        also write OUTPUT/status's line to FILE (job scripts: see docs/jobscripts.md)\n"
    "  --help                    show this help\n"
    "\n"
    "Outputs in the output directory: config.toml (the resolved deck), metrics.h5, train.log, checkpoints/, status\n"
    "(how the run ended: running, complete, checkpointed or failed, with the exit status and step).\n"
    "Exit status 75: stopped on a signal (checkpoint.on_signal) or train.time_limit after writing a checkpoint.\n"
    "Launch with e.g. 'mpiexec -n 4 hpctrain train deck.toml'; data.batch_size is the global batch.\n";
}  // namespace

int train_command(const Arguments& args, const MpiEnvironment& mpi) {
  std::string deck;
  std::vector<std::string> overrides;
  TrainOptions options;
  std::string status_file;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    auto value = [&](const char* option) -> std::string {
      HPCTRAIN_VERIFY(i + 1 < args.size(), InputError, option << " needs a value", "see 'hpctrain train --help'");
      return args[++i];
    };
    if (arg == "--help" || arg == "-h") {
      if (mpi.is_root()) std::fputs(train_usage, stdout);
      return 0;
    } else if (arg == "--set") {
      overrides.push_back(value("--set"));
    } else if (arg.rfind("--set=", 0) == 0) {
      overrides.push_back(arg.substr(6));
    } else if (arg == "--resume") {
      options.resume = value("--resume");
    } else if (arg.rfind("--resume=", 0) == 0) {
      options.resume = arg.substr(9);
    } else if (arg == "--force") {
      options.force = true;
    } else if (arg == "--status-file") {
      status_file = value("--status-file");
    } else if (arg.rfind("--status-file=", 0) == 0) {
      status_file = arg.substr(14);
    } else if (arg == "--profile") {
      overrides.push_back("train.profile=true");
    } else if (arg == "--output" || arg.rfind("--output=", 0) == 0) {
      const std::string directory = arg == "--output" ? value("--output") : arg.substr(9);
      HPCTRAIN_VERIFY(!directory.empty(), InputError, "hpctrain train: --output needs a directory, got an empty string",
                      "give the run's output directory, e.g. --output runs/my_run (or leave --output out to get "
                      "runs/<deck name>)");
      overrides.push_back("run.output=" + directory);
    } else if (!arg.empty() && arg[0] == '-') {
      throw InputError("hpctrain train: unknown option '" + arg + "'", "see 'hpctrain train --help'");
    } else {
      HPCTRAIN_VERIFY(deck.empty(), InputError,
                      "hpctrain train: more than one deck given ('" << deck << "' and '" << arg << "')",
                      "train one deck per run");
      deck = arg;
    }
  }
  RunStatus status(status_file);
  options.status = &status;
  try {
    HPCTRAIN_VERIFY(!deck.empty(), InputError, "hpctrain train: no input deck given",
                    "usage: hpctrain train DECK.toml");
    const RunConfig config = load_run_config(deck, overrides);
    Trainer trainer(config, mpi, options);
    return trainer.run().exit_code;
  } catch (const Error& error) {
    // Written by the rank that reports the error (main prints it the same way); rethrown for main to end every rank.
    if (error.scope() == ErrorScope::this_rank || mpi.is_root()) status.write_failure(error.exit_code());
    throw;
  } catch (const std::exception&) {
    status.write_failure(exit_runtime_error);
    throw;
  }
}

}  // namespace hpctrain

// `hpctrain train DECK.toml [--set section.key=value]... [--output DIR] [--dry-run]`
#include <cstdio>
#include <exception>
#include <sstream>

#include "hpctrain/app/command_line.hpp"
#include "hpctrain/app/commands.hpp"
#include "hpctrain/config/run_config.hpp"
#include "hpctrain/core/error.hpp"
#include "hpctrain/data/normalization.hpp"
#include "hpctrain/dist/mpi_environment.hpp"
#include "hpctrain/train/dry_run.hpp"
#include "hpctrain/train/run_continuation.hpp"
#include "hpctrain/train/run_status.hpp"
#include "hpctrain/train/trainer.hpp"

namespace hpctrain {

namespace {
const char* const train_usage =
    "usage: hpctrain train DECK.toml [--set section.key=value]... [--output DIR] [--resume auto|FILE] [--profile]\n"
    "                      [--status-file FILE] [--dry-run] [--init-from CHECKPOINT] [--allow-changed KEY,...]\n"
    "                      [--extend stretch|restart]\n"
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
    "  --allow-changed KEY,...   resume although these optimizer/schedule/loss keys differ from the checkpoint's\n"
    "                            deck (keys as optimizer.lr or model.label_smoothing, or a section: optimizer,\n"
    "                            schedule; repeatable). Without it a resume with changed optimizer or schedule keys,\n"
    "                            model.class_weights or model.label_smoothing is refused, naming them\n"
    "  --extend stretch|restart  resuming with train.steps (or train.epochs) raised: stretch the learning-rate\n"
    "                            schedule over the new length (the default) or restart it at the resumed step\n"
    "                            (warm-up, then its decay over the steps added)\n"
    "  --init-from CHECKPOINT    start from the parameters of a checkpoint (a file, a run directory or its\n"
    "                            checkpoints/latest) of the same layers; optimizer state, schedule and step count\n"
    "                            start fresh; precision and rank count may differ. With --resume auto it applies\n"
    "                            only when the run starts fresh\n"
    "  --status-file FILE        also write OUTPUT/status's line to FILE (job scripts: see docs/jobscripts.md)\n"
    "  --dry-run                 check the deck and the data as a run would (on every rank), print the model, the\n"
    "                            memory per rank and the plan (steps, epochs, evaluations, checkpoints, output,\n"
    "                            whether it would resume), and exit without training or writing anything\n"
    "  --help                    show this help\n"
    "\n"
    "Outputs in the output directory: config.toml (the resolved deck), metrics.h5, train.log, checkpoints/, status\n"
    "(how the run ended: running, complete, checkpointed or failed, with the exit status and step).\n"
    "Exit status 75: stopped on a signal (checkpoint.on_signal) or train.time_limit after writing a checkpoint.\n"
    "Launch with e.g. 'mpiexec -n 4 hpctrain train deck.toml'; data.batch_size is the global batch.\n";
}  // namespace

int train_command(const Arguments& args, const MpiEnvironment& mpi) {
  const CommandLine line(args, "hpctrain train",
                         {{"--set", true, true},
                          {"--output", true},
                          {"--resume", true},
                          {"--force", false},
                          {"--status-file", true},
                          {"--profile", false},
                          {"--dry-run", false},
                          {"--init-from", true},
                          {"--allow-changed", true, true},
                          {"--extend", true}});
  if (print_help_if_asked(line, train_usage, mpi)) return 0;
  std::vector<std::string> overrides = line.values("--set");
  if (line.has("--profile")) overrides.push_back("train.profile=true");
  if (line.has("--output")) {
    const std::string directory = line.value("--output");
    HPCTRAIN_VERIFY(!directory.empty(), InputError, "hpctrain train: --output needs a directory, got an empty string",
                    "give the run's output directory, e.g. --output runs/my_run (or leave --output out to get "
                    "runs/<deck name>)");
    overrides.push_back("run.output=" + directory);
  }
  TrainOptions options;
  options.resume = line.value_or("--resume", "");
  options.force = line.has("--force");
  options.init_from = line.value_or("--init-from", "");
  HPCTRAIN_VERIFY(options.init_from.empty() || options.resume.empty() || options.resume == "auto", InputError,
                  "hpctrain train: --init-from and --resume " << options.resume << " both name where to start",
                  "--init-from starts a new run from a checkpoint's weights, --resume continues a run: give one");
  for (const std::string& list : line.values("--allow-changed")) {
    std::stringstream keys(list);
    for (std::string key; std::getline(keys, key, ',');)
      if (!key.empty()) options.allow_changed.push_back(key);
  }
  options.extend = line.value_or("--extend", "");
  if (!options.extend.empty()) (void)parse_schedule_extension(options.extend);
  const std::string status_file = line.value_or("--status-file", "");
  const auto& decks = line.positionals();
  HPCTRAIN_VERIFY(decks.size() <= 1, InputError,
                  "hpctrain train: more than one deck given ('" << decks[0] << "' and '" << decks[1] << "')",
                  "train one deck per run");
  const std::string deck = decks.empty() ? std::string() : decks[0];
  if (line.has("--dry-run")) {  // before the status file: a dry run writes nothing
    HPCTRAIN_VERIFY(!deck.empty(), InputError, "hpctrain train: no input deck given",
                    "usage: hpctrain train DECK.toml --dry-run");
    RunConfig config = load_run_config(deck, overrides);
    resolve_normalization(config);
    dry_run(config, mpi, options);
    return 0;
  }
  RunStatus status(status_file);
  options.status = &status;
  try {
    HPCTRAIN_VERIFY(!deck.empty(), InputError, "hpctrain train: no input deck given",
                    "usage: hpctrain train DECK.toml");
    RunConfig config = load_run_config(deck, overrides);
    resolve_normalization(config);  // the values, not the file name, go to config.toml and the checkpoints
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
